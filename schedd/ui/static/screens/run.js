// One run: its state and times, and each attempt (worker, fence, start and end, outcome, error,
// traceback, progress), also drawn on a time axis.

import { API, call, can, enc, get } from "../api.js";
import { badge, confirmButton, fill, h, link, pre, shortId, when } from "../dom.js";
import { duration, formatIn, jobZone } from "../fmt.js";
import { viewerZone } from "../settings.js";
import { act, errorBox } from "../widgets.js";

export function runScreen(main, { id }) {
  const head = h("div", { class: "screen-head" }, h("h1", {}, "Run ", id));
  const body = h("section", {}, h("p", { class: "muted" }, "Loading…"));
  fill(main, head, body);
  let alive = true;
  let zone = null;
  let shown = null; // the run as last drawn: unchanged, it is not drawn again
  const unfolded = new Set(); // the attempts whose traceback is open

  async function load() {
    let run;
    try {
      run = await get(`${API}/runs/${enc(id)}`);
      if (zone === null) {
        zone = await get(`${API}/jobs/${enc(run.job_id)}`).then(jobZone, () => "UTC");
      }
    } catch (err) {
      if (alive) fill(body, errorBox(err));
      return;
    }
    if (!alive || main.querySelector(".armed")) return;
    const drawn = JSON.stringify(run);
    if (drawn === shown) return;
    shown = drawn;
    fill(head, h("h1", {}, "Run ", shortId(run.id)), badge(run.state),
      h("span", { class: "actions" }, runActions(run, load)));
    fill(body, runFacts(run, zone), h("h2", {}, "Attempts"), timeline(run),
      attemptsTable(run, zone, unfolded));
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

function runFacts(run, zone) {
  const rows = [
    ["Job", link(`/ui/jobs/${enc(run.job_id)}`, run.job_id)],
    ["Namespace", run.namespace],
    ["State", badge(run.state)],
    ["Scheduled", when(run.scheduled_at, zone)],
    ["Due", when(run.due_at, zone)],
    ["Created · updated", [when(run.created_at, zone), " ", when(run.updated_at, zone)]],
  ];
  if (run.reason) rows.push(["Reason", run.reason]);
  if (run.waiting) rows.push(["Waiting", run.waiting]);
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
        h("td", {}, when(a.started_at, zone, { seconds: true })),
        h("td", {}, a.ended_at ? when(a.ended_at, zone, { seconds: true }) : a.deadline ? ["running, deadline ", when(a.deadline, zone)] : "running"),
        h("td", {}, took === null ? "—" : duration(took)),
        h("td", {}, badge(a.outcome ?? "running")),
        h("td", {}, progress(a)),
        h("td", {}, error));
    })));
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

const SVG_W = 900;
const ROW_H = 22;

/** The attempts on a time axis (SVG: attributes only, no inline style). */
function timeline(run) {
  const spans = run.attempts.map((a) => ({
    a,
    start: Date.parse(a.started_at),
    end: a.ended_at ? Date.parse(a.ended_at) : Date.now(),
  }));
  if (!spans.length) return null;
  const t0 = Math.min(Date.parse(run.scheduled_at), ...spans.map((s) => s.start));
  const t1 = Math.max(...spans.map((s) => s.end), t0 + 1000);
  const left = 70;
  const width = SVG_W - left - 20;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * width;
  const height = 30 + spans.length * ROW_H + 24;
  const viewer = viewerZone();
  const svg = h("svg:svg", { class: "timeline", viewBox: `0 0 ${SVG_W} ${height}`, role: "img", "aria-label": "attempts on a time axis" });
  const axisY = 20 + spans.length * ROW_H + 6;
  svg.appendChild(h("svg:line", { class: "axis", x1: left, x2: left + width, y1: axisY, y2: axisY }));
  // the first tick at its time in the viewer's zone, the others as time since it
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    const tx = x(t);
    svg.appendChild(h("svg:line", { class: "axis", x1: tx, x2: tx, y1: 12, y2: axisY + 4 }));
    svg.appendChild(h("svg:text", { x: tx, y: axisY + 16, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" },
      i === 0 ? formatIn(t, viewer, { seconds: true }) : `+${duration((t - t0) / 1000)}`));
  }
  svg.appendChild(h("svg:text", { x: x(Date.parse(run.scheduled_at)), y: 10 }, "scheduled"));
  spans.forEach((s, i) => {
    const y = 16 + i * ROW_H;
    svg.appendChild(h("svg:text", { class: "label", x: 4, y: y + 13 }, `#${s.a.attempt}`));
    const bar = h("svg:rect", {
      class: `bar st-${s.a.outcome ?? "running"}`,
      x: x(s.start), y, height: ROW_H - 6, rx: 2,
      width: Math.max(2, x(s.end) - x(s.start)),
    });
    bar.appendChild(h("svg:title", {}, `attempt ${s.a.attempt} on ${s.a.worker_id}: ${s.a.outcome ?? "running"}, ${duration((s.end - s.start) / 1000)}`));
    svg.appendChild(bar);
  });
  return svg;
}
