// One run: its state and times, and each attempt (worker, fence, start and end, outcome, error,
// traceback, progress), also drawn on a time axis with the backoff between attempts, the Raft
// terms that began meanwhile (GET /cluster's leader history) and the results refused for a
// stale fence.

import { API, call, can, enc, get } from "../api.js";
import { badge, confirmButton, fill, h, jobName, jobTask, link, pre, shortId, when } from "../dom.js";
import { duration, formatIn, jobZone } from "../fmt.js";
import { viewerZone } from "../settings.js";
import { act, failed } from "../widgets.js";

export function runScreen(main, { id }) {
  const head = h("div", { class: "screen-head" }, h("h1", {}, "Run ", id));
  const body = h("section", {}, h("p", { class: "muted" }, "Loading…"));
  fill(main, head, body);
  let alive = true;
  let zone = null;
  let job = null; // the run's job: its zone, task and payload (they never change)
  let shown = null; // the run (and leader history) as last drawn: unchanged, not drawn again
  const unfolded = new Set(); // the attempts whose traceback is open

  async function load() {
    let run;
    let leaders;
    try {
      [run, leaders] = await Promise.all([
        get(`${API}/runs/${enc(id)}`),
        get(`${API}/cluster`).then((c) => c.leaders ?? [], () => []),
      ]);
      if (zone === null) {
        job = await get(`${API}/jobs/${enc(run.job_id)}`).catch(() => null);
        zone = job ? jobZone(job) : "UTC";
      }
    } catch (err) {
      if (alive) failed(body, err);
      shown = null; // the next answer is drawn even if it is the same as before
      return;
    }
    if (!alive || main.querySelector(".armed")) return;
    const drawn = JSON.stringify([run, leaders]);
    if (drawn === shown) return;
    shown = drawn;
    const name = jobName(run, job);
    fill(head, h("h1", {}, "Run ", shortId(run.id), name ? h("span", { class: "muted" }, ` · ${name}`) : null), badge(run.state),
      h("span", { class: "actions" }, runActions(run, load)));
    fill(body, runFacts(run, zone, job), h("h2", {}, "Attempts"), timeline(run, leaders),
      attemptsTable(run, zone, unfolded), refusedTable(run, zone));
  }

  load();
  return {
    refresh: load,
    relevant: (type, changes) => type === "run" && changes.some((c) => c.id === id),
    destroy() { alive = false; },
  };
}

function runActions(run, refresh) {
  const out = [];
  const finished = ["succeeded", "failed", "cancelled", "skipped"].includes(run.state);
  if (!finished && can("post", `${API}/runs/{run_id}/cancel`)) {
    out.push(confirmButton("Cancel run", "Cancel this run?", () =>
      act("Cancel run", () => call("POST", `${API}/runs/${enc(run.id)}/cancel`, { body: {} }), refresh)));
  }
  return out;
}

function runFacts(run, zone, job) {
  const rows = [
    ["Job", [link(`/ui/jobs/${enc(run.job_id)}`, jobName(run, job) ?? run.job_id),
      jobTask(run, job) ? ` · ${jobTask(run, job)}` : "",
      jobName(run, job) ? h("div", { class: "muted" }, run.job_id) : null]],
    ["Namespace", run.namespace],
    ["State", badge(run.state)],
    ["Scheduled", when(run.scheduled_at, zone)],
    ["Due", when(run.due_at, zone)],
    ["Created · updated", [when(run.created_at, zone), " ", when(run.updated_at, zone)]],
  ];
  if (run.reason) rows.push(["Reason", run.reason]);
  if (run.waiting) rows.push(["Waiting", run.waiting]);
  if (run.upstream?.length) {
    rows.push(["Upstream", h("ul", { class: "upstream" }, run.upstream.map((up) => h("li", {},
      link(`/ui/jobs/${enc(up.job_id)}`, up.name ?? shortId(up.job_id)), " ",
      up.run_id ? [link(`/ui/runs/${enc(up.run_id)}`, "latest run"), " ", badge(up.state)]
        : up.status ? `${up.status}, no run yet` : "no longer exists")))]);
  }
  if (job) rows.push(["Payload", pre(job.payload)]);
  if (run.error) rows.push(["Error", h("span", { class: "error" }, run.error)]);
  if (run.result !== null && run.result !== undefined) rows.push(["Result", pre(run.result)]);
  return h("table", { class: "kv", id: "run-facts" },
    h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))));
}

function attemptsTable(run, zone, unfolded) {
  if (!run.attempts.length) return h("p", { class: "empty" }, "No attempt yet.");
  const heads = ["#", "Worker", "Fence", "Started", "Ended", "Took", "Outcome", "Progress", "Error"];
  return h("table", { class: "attempts", id: "attempts" },
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))),
    h("tbody", {}, run.attempts.map((a) => {
      const took = a.ended_at ? (Date.parse(a.ended_at) - Date.parse(a.started_at)) / 1000 : null;
      const error = [a.error ? h("div", { class: "error" }, a.error) : null,
        a.traceback ? traceback(a, unfolded) : null];
      return h("tr", { "data-attempt": String(a.attempt) },
        h("td", {}, String(a.attempt)),
        h("td", {}, a.worker_id),
        h("td", { class: "mono" }, String(a.fence)),
        h("td", {}, when(a.started_at, zone, { ms: true })),
        h("td", {}, a.ended_at ? when(a.ended_at, zone, { ms: true }) : a.deadline ? ["running, deadline ", when(a.deadline, zone)] : "running"),
        h("td", {}, took === null ? "—" : duration(took)),
        h("td", {}, badge(a.outcome ?? "running")),
        h("td", {}, progress(a)),
        h("td", {}, error));
    })));
}

/** The workers' results refused because their fence was no longer the run's lease. */
function refusedTable(run, zone) {
  const refused = run.refused ?? [];
  if (!refused.length) return null;
  return [h("h2", {}, "Refused results"),
    h("p", { class: "muted" }, "Results of attempts that had lost their lease (a missed heartbeat, a timeout, a cancel or a new leader's fence) when they arrived: refused, never applied."),
    h("table", { class: "attempts", id: "refused" },
      h("thead", {}, h("tr", {}, ["Refused at", "Worker", "Fence", "Reported", "Why"].map((t) => h("th", {}, t)))),
      h("tbody", {}, refused.map((f) => h("tr", { "data-fence": String(f.fence) },
        h("td", {}, when(f.at, zone, { seconds: true })),
        h("td", {}, f.worker_id || "—"),
        h("td", { class: "mono" }, String(f.fence)),
        h("td", {}, badge(f.outcome)),
        h("td", { class: "error" }, f.reason)))))];
}

/** An attempt's traceback, folded unless it was unfolded before this drawing. */
function traceback(a, unfolded) {
  const el = h("details", { open: unfolded.has(a.attempt) },
    h("summary", {}, "traceback"), pre(a.traceback, "traceback"));
  el.addEventListener("toggle", () => {
    if (el.open) unfolded.add(a.attempt);
    else unfolded.delete(a.attempt);
  });
  return el;
}

/** The worker's latest progress: a bar for {done, of}, else the value as JSON. */
function progress(a) {
  const p = a.progress;
  if (p === null || p === undefined) return "—";
  const at = a.progress_at ? h("div", { class: "muted" }, "reported ", when(a.progress_at)) : null;
  if (typeof p === "object" && typeof p.done === "number" && typeof p.of === "number" && p.of > 0) {
    return [h("progress", { value: p.done, max: p.of }), ` ${p.done} / ${p.of}`, at];
  }
  return [pre(p), at];
}

/** The timeline's width in its own units: the screen's (at most 900), so that its text keeps
 * its size on a phone instead of shrinking with the picture. */
function svgWidth() {
  return Math.round(Math.max(320, Math.min(900, (document.querySelector("main")?.clientWidth ?? 900) - 4)));
}
const ROW_H = 22;

/** The attempts on a time axis, one lane each (SVG: attributes only, no inline style): its
 * worker and fence, the backoff before the next, the results refused for its fence (×), and
 * a vertical mark where a leader claimed a new term. */
function timeline(run, leaders) {
  const spans = run.attempts.map((a) => {
    const start = Date.parse(a.started_at);
    // (a worker that ignored its lease's not_before may end before the attempt's start)
    return { a, start, end: Math.max(start, a.ended_at ? Date.parse(a.ended_at) : Date.now()) };
  });
  if (!spans.length) return null;
  const refused = (run.refused ?? []).map((f) => ({ f, t: Date.parse(f.at) }));
  const scheduled = Date.parse(run.scheduled_at);
  const t0 = Math.min(scheduled, ...spans.map((s) => s.start));
  const t1 = Math.max(...spans.map((s) => s.end), ...refused.map((r) => r.t), t0 + 1000);
  const terms = leaders.map((c) => ({ c, t: Date.parse(c.at) })).filter((m) => m.t > t0 && m.t <= t1);
  const SVG_W = svgWidth();
  const narrow = SVG_W < 600;
  const left = narrow ? 40 : 70;
  const width = SVG_W - left - 20;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * width;
  const height = 30 + spans.length * ROW_H + 24;
  const viewer = viewerZone();
  const svg = h("svg:svg", { class: "timeline", viewBox: `0 0 ${SVG_W} ${height}`, role: "img", "aria-label": "attempts on a time axis" });
  const axisY = 20 + spans.length * ROW_H + 6;
  svg.appendChild(h("svg:line", { class: "axis", x1: left, x2: left + width, y1: axisY, y2: axisY }));
  // the first tick at its time in the viewer's zone, the others as time since it
  const ticks = narrow ? 2 : 4; // a phone: the start and the end only, the start without its date
  for (let i = 0; i <= ticks; i++) {
    const t = t0 + ((t1 - t0) * i) / ticks;
    const tx = x(t);
    svg.appendChild(h("svg:line", { class: "axis", x1: tx, x2: tx, y1: 12, y2: axisY + 4 }));
    svg.appendChild(h("svg:text", { x: tx, y: axisY + 16, "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle" },
      i === 0 ? formatIn(t, viewer, { ms: true, date: !narrow }) : `+${duration((t - t0) / 1000)}`));
  }
  svg.appendChild(h("svg:text", { x: x(scheduled), y: 10 }, "scheduled"));
  for (const { c, t } of terms) {
    const mark = h("svg:g", { class: "term", "data-term": String(c.term) },
      h("svg:line", { x1: x(t), x2: x(t), y1: 12, y2: axisY }),
      h("svg:text", { x: x(t) + 3, y: 10 }, `term ${c.term} · ${c.node}`),
      h("svg:title", {}, `leader ${c.node} claimed term ${c.term} at ${formatIn(t, viewer, { ms: true })} (${c.at} UTC), log index ${c.index}`));
    svg.appendChild(mark);
  }
  spans.forEach((s, i) => {
    const y = 16 + i * ROW_H;
    svg.appendChild(h("svg:text", { class: "label", x: 4, y: y + 13 }, `#${s.a.attempt}`));
    const next = spans[i + 1];
    if (next && next.start > s.end) {
      const gap = h("svg:line", { class: "backoff", x1: x(s.end), x2: x(next.start), y1: y + ROW_H / 2 + 2, y2: y + ROW_H / 2 + 2 });
      gap.appendChild(h("svg:title", {}, `backoff: ${duration((next.start - s.end) / 1000)} until attempt ${next.a.attempt}`));
      svg.appendChild(gap);
    }
    const bar = h("svg:rect", {
      class: `bar st-${s.a.outcome ?? "running"}`,
      x: x(s.start), y, height: ROW_H - 6, rx: 2,
      width: Math.max(2, x(s.end) - x(s.start)),
    });
    bar.appendChild(h("svg:title", {}, `attempt ${s.a.attempt} leased to ${s.a.worker_id} with fence ${s.a.fence}: ${s.a.outcome ?? "running"}, ${duration((s.end - s.start) / 1000)}`));
    svg.appendChild(bar);
    // worker and fence inside a long bar, else right of it, or left when it ends at the edge
    const [bx, bw] = [x(s.start), x(s.end) - x(s.start)];
    const place = bw > 170 ? ["lane inside", bx + 4, "start"]
      : bx + bw + 164 <= SVG_W ? ["lane", bx + bw + 4, "start"] : ["lane", bx - 4, "end"];
    svg.appendChild(h("svg:text", { class: place[0], x: place[1], y: y + 12, "text-anchor": place[2] },
      `${s.a.worker_id} · fence ${s.a.fence}`));
    if (s.a.progress_at) { // the latest progress the worker reported (with a heartbeat)
      const t = Math.min(Date.parse(s.a.progress_at), s.end);
      const tick = h("svg:circle", { class: "progress", cx: x(t), cy: y + (ROW_H - 6) / 2, r: 3 });
      tick.appendChild(h("svg:title", {}, `progress ${JSON.stringify(s.a.progress)} reported at ${formatIn(t, viewer, { ms: true })}`));
      svg.appendChild(tick);
    }
    for (const { f, t } of refused.filter((r) => r.f.fence === s.a.fence)) {
      const cross = h("svg:text", { class: "refused", x: x(t), y: y + 13, "text-anchor": "middle", "data-fence": String(f.fence) }, "×");
      cross.appendChild(h("svg:title", {}, `result refused (${f.outcome}) at ${formatIn(t, viewer, { ms: true })}: ${f.reason}`));
      svg.appendChild(cross);
    }
  });
  return svg;
}
