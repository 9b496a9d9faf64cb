// Workers connected to the leader: id, the address it connects from and the node it holds its
// websocket on, queues, tasks, capacity against leases in flight, when it was last heard from
// (its heartbeats), connected since, draining; an admin may drain one.

import { API, OPTIONAL, call, can, fillPath, get, has } from "../api.js";
import { confirmButton, fill, h, when } from "../dom.js";
import { relative } from "../fmt.js";
import { act, failed } from "../widgets.js";

export function workersScreen(main) {
  const table = h("div", { class: "table-wrap" }, h("p", { class: "muted" }, "Loading…"));
  fill(main, h("div", { class: "screen-head" }, h("h1", {}, "Workers")), table);
  let alive = true;

  async function load() {
    let answer;
    try {
      answer = await get(`${API}/workers`);
    } catch (err) {
      if (alive) failed(table, err);
      return;
    }
    if (!alive || main.querySelector(".armed")) return;
    fill(table, workersTable(answer.workers, load));
  }

  load();
  // workers come and go without an event: asked again every few seconds even when live
  return { refresh: load, poll: true, relevant: () => false, destroy() { alive = false; } };
}

function workersTable(workers, refresh) {
  if (!workers.length) return h("p", { class: "empty" }, "No worker is connected to the leader.");
  const drain = has(OPTIONAL.drain[1]) && can("post", OPTIONAL.drain[1]);
  const heads = ["Worker", "From · to", "Queues", "Tasks", "Leases / capacity", "Last heard", "Connected since", "State", ""];
  const sorted = [...workers].sort((a, b) => a.worker_id.localeCompare(b.worker_id));
  return h("table", { class: "workers", id: "workers-table" },
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))),
    h("tbody", {}, sorted.map((w) => h("tr", { "data-worker": w.worker_id },
      h("td", { class: "mono" }, w.worker_id),
      h("td", {}, w.host ?? "—", w.node ? h("div", { class: "muted" }, `to ${w.node}`) : null),
      h("td", {}, w.queues.join(", ")),
      h("td", {}, w.tasks === null ? h("span", { class: "muted" }, "any task") : w.tasks.join(", ")),
      h("td", {}, h("meter", { min: 0, max: w.capacity, value: w.leases, class: "capacity" }), ` ${w.leases} / ${w.capacity}`),
      h("td", { class: "heard" }, w.last_heard ? h("span", { class: "age", "data-at": w.last_heard, title: `${w.last_heard} (UTC)` }, relative(w.last_heard)) : "—"),
      h("td", {}, when(w.connected_at)),
      h("td", {}, w.draining ? h("span", { class: "badge st-paused" }, "draining") : "serving"),
      h("td", { class: "actions" }, drain && !w.draining
        ? confirmButton("Drain", "Drain this worker?", () =>
          act(`Drain ${w.worker_id}`, () => call("POST", fillPath(OPTIONAL.drain[1], { worker_id: w.worker_id })), refresh), "")
        : null)))));
}
