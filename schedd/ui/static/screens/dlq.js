// Dead letters: one page of GET /api/v1/dlq with the API's filters (task, queue, namespace,
// since, error text), its runs grouped by
// error, each with its job's task and its time in the job's zone (its jobs read with
// GET /jobs?ids=…, a request per 200 jobs not seen before). Replay or drop the selected runs;
// where the node has the bulk endpoints, act on every run that matches the filter at once: a
// dry run says how many, then one call does it.

import { API, OPTIONAL, bodyFields, call, can, enc, get, has, queryParams } from "../api.js";
import { badge, confirmButton, fill, h, jobName, jobTask, link, shortId, when } from "../dom.js";
import { jobZone } from "../fmt.js";
import { notice } from "../clusterbar.js";
import { failed, filterForm, filterOf, pager } from "../widgets.js";

const PATH = "/ui/dlq";
const FILTERS = [
  ["namespace", "Namespace"],
  ["queue", "Queue"],
  ["task", "Task"],
  ["since", "Failed since", [["", "any time"], ["1h", "last hour"], ["24h", "last 24 h"], ["7d", "last 7 days"]]],
  ["error", "Error contains"],
  ["limit", "Per page", [["", "100"], ["250", "250"], ["500", "500"], ["1000", "1000"]]],
];
const SERVER_FILTERS = ["namespace", "queue", "task", "since"];
/** The name the bulk endpoints give the error-text filter. */
const ERROR_FIELDS = ["error"];

/** The jobs seen so far (id → {task, zone}): a job's task and zone never change. */
const JOBS = new Map();
const IDS_PER_CALL = 200;

/** Read the jobs of ``ids`` not seen yet (where the node takes GET /jobs?ids=; else none). */
async function learnJobs(ids) {
  const missing = [...new Set(ids)].filter((id) => !JOBS.has(id));
  if (!missing.length || !queryParams("get", `${API}/jobs`).has("ids")) return;
  for (let i = 0; i < missing.length; i += IDS_PER_CALL) {
    const chunk = missing.slice(i, i + IDS_PER_CALL);
    const page = await get(`${API}/jobs`, { ids: chunk.join(","), limit: chunk.length });
    for (const job of page.jobs) JOBS.set(job.id, { task: job.task, zone: jobZone(job) });
  }
}

/** "1h", "24h", "7d" → the RFC 3339 instant that long ago; anything else as written. */
export function sinceValue(value, now = Date.now()) {
  const m = /^(\d+)([mhd])$/.exec(value ?? "");
  if (!m) return value || null;
  const unit = { m: 60e3, h: 3600e3, d: 86400e3 }[m[2]];
  return new Date(now - Number(m[1]) * unit).toISOString();
}

function serverFilter(params) {
  const filter = filterOf(params, SERVER_FILTERS);
  if (filter.since) filter.since = sinceValue(filter.since);
  return filter;
}

export function dlqScreen(main, { params, navigate }) {
  const bulk = h("div", { id: "bulk" });
  const selection = h("div", { id: "selection", class: "bulk" });
  const paging = h("div");
  const table = h("div", { class: "table-wrap" }, h("p", { class: "muted" }, "Loading…"));
  fill(main, h("div", { class: "screen-head" }, h("h1", {}, "Dead letters")),
    filterForm(FILTERS, params, navigate, PATH), bulk, selection, paging, table);
  const errorText = (params.get("error") ?? "").trim();
  let alive = true;
  let selected = new Set();
  let rows = [];

  async function load() {
    let page;
    const filter = serverFilter(params);
    if (errorText) filter.error = errorText; // the API's own filter: it pages like the others
    try {
      page = await get(`${API}/dlq`, { ...filter, limit: params.get("limit"), cursor: params.get("cursor") });
      await learnJobs(page.runs.map((r) => r.job_id)).catch(() => null); // times in UTC then
    } catch (err) {
      if (alive) failed(table, err);
      return;
    }
    if (!alive || main.querySelector(".armed") || main.querySelector(".bulk .pending")) return;
    rows = page.runs;
    selected = new Set([...selected].filter((id) => rows.some((r) => r.id === id)));
    fill(paging, pager(page.next_cursor, params, navigate, PATH, rows.length));
    fill(table, groupedTable(rows, selected, drawSelection));
    drawSelection();
  }

  function drawSelection() {
    const ids = [...selected];
    const out = [h("span", {}, `${ids.length} selected on this page`)];
    const bulkPaths = new Map(bulkVerbs().filter(([, path]) => bodyFields("post", path).has("run_ids")));
    const replay = bulkPaths.has("replay")
      ? () => together("Replay", bulkPaths.get("replay"), ids)
      : () => each("Replay", ids, (id) => call("POST", `${API}/dlq/${enc(id)}/replay`, { body: {} }));
    const drop = bulkPaths.has("drop")
      ? () => together("Drop", bulkPaths.get("drop"), ids)
      : () => each("Drop", ids, (id) => call("DELETE", `${API}/dlq/${enc(id)}`));
    if (ids.length && (bulkPaths.has("replay") || can("post", `${API}/dlq/{run_id}/replay`))) {
      out.push(h("button", { type: "button", id: "replay-selected", on: { click: replay } }, `Replay ${ids.length}`));
    }
    if (ids.length && (bulkPaths.has("drop") || can("delete", `${API}/dlq/{run_id}`))) {
      out.push(confirmButton(`Drop ${ids.length}`, `Drop ${ids.length} for good?`, drop));
    }
    fill(selection, out);
  }

  /** The selected runs in one call of the bulk endpoint (all or none). */
  async function together(verb, path, ids) {
    try {
      const done = await call("POST", path, { body: { run_ids: ids, dry_run: false } });
      const skipped = done.skipped?.length ? `; ${done.skipped.length} had left the queue` : "";
      notice(`${verb}: ${done.count} of ${ids.length} done${skipped}`);
    } catch (err) {
      notice(`${verb}: ${err.message}`, "error");
    }
    selected.clear();
    await load();
  }

  async function each(verb, ids, fn) {
    let done = 0;
    const failed = [];
    for (const id of ids) {
      try {
        await fn(id);
        done += 1;
      } catch (err) {
        failed.push(`${id}: ${err.message}`);
      }
    }
    notice(`${verb}: ${done} of ${ids.length} done${failed.length ? "; " + failed.join("; ") : ""}`,
      failed.length ? "error" : "info");
    selected.clear();
    await load();
  }

  drawBulk(bulk, params, errorText, load);
  load();
  const namespace = params.get("namespace");
  return {
    refresh: load,
    relevant: (type, changes) =>
      type === "dlq" && changes.some((c) => !namespace || c.namespace === namespace),
    destroy() { alive = false; },
  };
}

function groupedTable(runs, selected, onSelect) {
  if (!runs.length) return h("p", { class: "empty" }, "No dead-lettered run matches.");
  const groups = new Map();
  for (const run of runs) {
    const key = run.error ?? "(no error recorded)";
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(run);
  }
  const ordered = [...groups.entries()].sort((a, b) => b[1].length - a[1].length);
  const body = [];
  for (const [error, group] of ordered) {
    const box = h("input", { type: "checkbox", "aria-label": "select this group" });
    box.checked = group.every((r) => selected.has(r.id));
    const boxes = [];
    box.addEventListener("change", () => {
      for (const r of group) {
        if (box.checked) selected.add(r.id);
        else selected.delete(r.id);
      }
      for (const b of boxes) b.checked = box.checked;
      onSelect();
    });
    body.push(h("tr", { class: "group-head" },
      h("td", {}, box),
      h("td", { colspan: "6", class: "error-group" }, h("span", { class: "error" }, error), ` — ${group.length} run${group.length === 1 ? "" : "s"}`)));
    for (const run of group) {
      const one = h("input", { type: "checkbox", "aria-label": `select ${run.id}`, "data-run": run.id });
      one.checked = selected.has(run.id);
      one.addEventListener("change", () => {
        if (one.checked) selected.add(run.id);
        else selected.delete(run.id);
        box.checked = group.every((r) => selected.has(r.id));
        onSelect();
      });
      boxes.push(one);
      const last = run.attempts.at(-1);
      const job = JOBS.get(run.job_id);
      body.push(h("tr", { "data-run": run.id },
        h("td", {}, one),
        h("td", {}, link(`/ui/runs/${enc(run.id)}`, shortId(run.id))),
        h("td", {}, link(`/ui/jobs/${enc(run.job_id)}`, jobName(run, job) ?? jobTask(run, job) ?? shortId(run.job_id)),
          h("div", { class: "muted" }, jobTask(run, job) ?? "")),
        h("td", {}, run.namespace),
        h("td", {}, when(run.updated_at, job?.zone ?? null)),
        h("td", {}, `${run.attempts.length} attempt${run.attempts.length === 1 ? "" : "s"}`, last ? ` · ${last.worker_id}` : ""),
        h("td", {}, badge(run.state))));
    }
  }
  const heads = ["", "Run", "Job (name · task)", "Namespace", "Failed", "Attempts", "State"];
  return h("table", { class: "dlq", id: "dlq-table" },
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))),
    h("tbody", {}, body));
}

/** The bulk endpoints the node has and the token may call: [[verb, path]]. */
function bulkVerbs() {
  return [["replay", OPTIONAL.dlqReplay[1]], ["drop", OPTIONAL.dlqDrop[1]]].filter(
    ([, path]) => has(path) && can("post", path));
}

/** "Select all N matching": a dry run of the bulk endpoint on the whole filter (every page),
 * then one call that replays or drops what matches it then. */
function drawBulk(el, params, errorText, refresh) {
  const verbs = bulkVerbs();
  if (!verbs.length) {
    fill(el);
    return;
  }
  const fields = bodyFields("post", verbs[0][1]);
  const filter = {};
  for (const [k, v] of Object.entries(serverFilter(params))) if (fields.has(k)) filter[k] = v;
  const errorField = ERROR_FIELDS.find((f) => fields.has(f));
  if (errorText && errorField) filter[errorField] = errorText;
  const ignored = errorText && !errorField;
  const status = h("span", { class: "preview", id: "bulk-preview" });
  const buttons = h("span", {});
  const dry = h("button", { type: "button", id: "bulk-dry-run" }, "Select all matching (dry run)");
  dry.addEventListener("click", async () => {
    dry.classList.add("pending");
    try {
      const answer = await call("POST", verbs[0][1], { body: { ...filter, dry_run: true } });
      const n = answer.count;
      const tasks = (answer.tasks ?? []).map((t) => `${t.task} ${t.count}`).join(", ");
      fill(status, `${n} dead-lettered run${n === 1 ? "" : "s"} match the filter`,
        tasks ? ` (${tasks})` : "", ".");
      fill(buttons, n === 0 ? [] : verbs.map(([verb, path]) => {
        const label = `${verb === "replay" ? "Replay" : "Drop"} all ${n}`;
        const go = async () => {
          try {
            const done = await call("POST", path, { body: { ...filter, dry_run: false } });
            const differs = done.count !== n ? ` (the dry run counted ${n})` : "";
            notice(`${done.message ?? label}: ${done.count} done${differs}`);
          } catch (err) {
            notice(`${label}: ${err.message}`, "error");
          }
          fill(status);
          fill(buttons);
          await refresh();
        };
        const b = verb === "drop"
          ? confirmButton(label, `Drop all ${n} for good?`, go)
          : h("button", { type: "button", class: "primary", on: { click: go } }, label);
        b.id = `bulk-${verb}`;
        return b;
      }));
    } catch (err) {
      fill(status, err.message);
    } finally {
      dry.classList.remove("pending");
    }
  });
  fill(el, h("div", { class: "bulk" }, h("b", {}, "Every run matching the filter: "), dry, status, buttons,
    ignored ? h("span", { class: "muted" }, " (the error text is not part of this filter)") : null));
}
