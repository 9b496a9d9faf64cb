// Scheduling lag, live: each run of the last 15 minutes as a dot (when it was due, how late it
// fired and started), the p50/p99 of each queue and priority, and what waits now. The leader's
// figures (GET /scheduling-lag with its samples), asked again every few seconds while shown.

import { OPTIONAL, get, has } from "../api.js";
import { fill, h } from "../dom.js";
import { duration, formatIn, utc } from "../fmt.js";
import { viewerZone } from "../settings.js";
import { failed } from "../widgets.js";

const MINUTES = 15;
const SERIES = [
  ["fire", "lag to fire (queued)"],
  ["lease", "lag to lease (start)"],
];
const PRIORITIES = ["high", "normal", "low"];

export function lagScreen(main) {
  const about = h("span", { class: "muted", id: "lag-about" });
  const status = h("div", { id: "lag-status" });
  const counters = h("div", { class: "lag-counters", id: "lag-counters" });
  const chart = h("figure", { class: "lag-chart", id: "lag-chart" }, h("p", { class: "muted" }, "Loading…"));
  const table = h("div", { class: "table-wrap" });
  fill(main, h("div", { class: "screen-head" }, h("h1", {}, "Scheduling lag"), about),
    status, counters, chart, h("h2", {}, `p50 and p99 by queue and priority, the last ${MINUTES} m`), table);
  let alive = true;
  let asking = false;

  async function load() {
    if (!has("lag")) {
      fill(chart, h("p", { class: "empty" }, "This node does not report its scheduling lag."));
      return;
    }
    if (asking) return; // an answer is on its way: it is the fresh one
    asking = true;
    let lag;
    try {
      lag = await get(OPTIONAL.lag[1], { minutes: MINUTES, samples: true });
    } catch (err) {
      if (alive) failed(status, err);
      return;
    } finally {
      asking = false;
    }
    if (!alive) return;
    fill(status);
    fill(about, `as the leader ${lag.leader} saw it, the last ${duration(lag.window)}; live`);
    fill(counters, counterCards(lag));
    fill(chart, legend(lag.samples), scatter(lag.samples, lag.window * 1000));
    fill(table, quantileTable(lag));
  }

  load();
  // the lags move without an event: asked again every few seconds, and not while hidden
  return { refresh: load, poll: true, relevant: () => false, destroy() { alive = false; } };
}

// -- what waits now, and what did not run ------------------------------------------------------

function counterCards(lag) {
  const card = (key, label, value, detail, warn = false) =>
    h("div", { class: `counter${warn ? " warn" : ""}`, "data-counter": key },
      h("div", { class: "value" }, String(value)), h("div", { class: "label" }, label),
      detail ? h("div", { class: "muted" }, detail) : null);
  const skips = lag.skipped.filter((s) => s.reason !== "misfire");
  return [
    card("due_not_leased", "due, not started", lag.due_not_leased,
      `${lag.queued} queued · ${lag.overdue} overdue, now`, lag.due_not_leased > 0),
    card("misfires", "misfires", lag.misfires, "skipped as misfires, ever", lag.misfires > 0),
    ...skips.map((s) => card(`skipped-${s.reason}`, `skipped: ${s.reason}`, s.count, "ever")),
  ];
}

// -- the quantiles -----------------------------------------------------------------------------

function quantileTable(lag) {
  const groups = new Map();
  for (const kind of ["fire", "lease"]) {
    for (const g of lag[kind].by) {
      const key = `${g.queue}/${g.priority}`;
      if (!groups.has(key)) groups.set(key, { queue: g.queue, priority: g.priority });
      groups.get(key)[kind] = g;
    }
  }
  const rank = (p) => PRIORITIES.indexOf(p);
  const rows = [...groups.values()].sort((a, b) =>
    a.queue.localeCompare(b.queue) || rank(a.priority) - rank(b.priority));
  if (!rows.length) return h("p", { class: "empty" }, "No run fired or started in the window.");
  const cells = (stats) => [
    h("td", { class: "num" }, String(stats?.count ?? 0)),
    h("td", { class: "num" }, duration(stats?.p50)),
    h("td", { class: "num" }, duration(stats?.p99)),
  ];
  const heads = ["Queue", "Priority", "Fired", "Fire p50", "Fire p99", "Started", "Start p50", "Start p99"];
  return h("table", { class: "lag", id: "lag-table" },
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))),
    h("tbody", {},
      h("tr", { class: "all", "data-group": "all" },
        h("td", {}, "all queues"), h("td", {}, "all"), cells(lag.fire), cells(lag.lease)),
      rows.map((g) => h("tr", { "data-group": `${g.queue}/${g.priority}` },
        h("td", {}, g.queue), h("td", {}, g.priority), cells(g.fire), cells(g.lease)))));
}

// -- the dots ----------------------------------------------------------------------------------

const W = 900;
const H = 340;
const LEFT = 64;
const RIGHT = 16;
const TOP = 12;
const BOTTOM = 40;
const FLOOR = 0.001; // below a millisecond the axis is linear: a lag of 0 has its place
const Y_TICKS = [0, 0.001, 0.01, 0.1, 1, 10, 60, 600, 3600];
const X_STEPS_MIN = [1, 2, 3, 5, 10, 15, 30, 60];

function legend(samples) {
  return h("figcaption", { class: "lag-legend" }, SERIES.map(([kind, label]) =>
    h("span", { class: `key ${kind}`, "data-series": kind },
      h("svg:svg", { viewBox: "0 0 10 10", class: "swatch" }, h("svg:circle", { class: `dot ${kind}`, cx: 5, cy: 5, r: 4 })),
      ` ${label}: ${samples[kind].length} runs`)));
}

/** The runs as dots: x their due time, y their lag on an axis that is logarithmic above a
 * millisecond (SVG built with attributes only). */
function scatter(samples, windowMs) {
  const all = [...samples.fire, ...samples.lease];
  const t1 = Math.max(Date.now(), ...all.map((s) => s[0]));
  const t0 = Math.min(t1 - windowMs, ...all.map((s) => s[0]));
  const top = topTick(Math.max(0, ...all.map((s) => s[1])));
  const width = W - LEFT - RIGHT;
  const height = H - TOP - BOTTOM;
  const x = (t) => LEFT + ((t - t0) / (t1 - t0)) * width;
  const scale = (v) => Math.log10(1 + v / FLOOR);
  const y = (v) => TOP + height - (scale(v) / scale(top)) * height;
  const zone = viewerZone();
  const svg = h("svg:svg", {
    class: "lag-plot", id: "lag-plot", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": "each run's lag against its due time",
  });
  const axisY = TOP + height;
  for (const v of Y_TICKS.filter((t) => t <= top)) {
    const ty = y(v);
    svg.appendChild(h("svg:line", { class: "grid", x1: LEFT, x2: LEFT + width, y1: ty, y2: ty }));
    svg.appendChild(h("svg:text", { class: "tick", x: LEFT - 6, y: ty + 4, "text-anchor": "end" }, duration(v)));
  }
  for (const t of timeTicks(t0, t1)) {
    const tx = x(t);
    const tick = h("svg:g", { class: "tick" },
      h("svg:line", { class: "grid", x1: tx, x2: tx, y1: TOP, y2: axisY + 4 }),
      h("svg:text", { x: tx, y: axisY + 18, "text-anchor": "middle" }, formatIn(t, zone, { date: false, seconds: false })),
      h("svg:title", {}, `${utc(t)} (UTC)`));
    svg.appendChild(tick);
  }
  svg.appendChild(h("svg:line", { class: "axis", x1: LEFT, x2: LEFT + width, y1: axisY, y2: axisY }));
  svg.appendChild(h("svg:line", { class: "axis", x1: LEFT, x2: LEFT, y1: TOP, y2: axisY }));
  svg.appendChild(h("svg:text", { class: "axis-label", x: LEFT + width, y: H - 4, "text-anchor": "end" },
    `due time (${zone})`));
  svg.appendChild(h("svg:text", { class: "axis-label", x: 4, y: TOP - 2 }, "lag"));
  if (!all.length) {
    svg.appendChild(h("svg:text", { class: "none", x: LEFT + width / 2, y: TOP + height / 2, "text-anchor": "middle" },
      `No run fired in the last ${MINUTES} minutes.`));
  }
  const r = all.length > 2000 ? 2 : 3; // thousands of dots: smaller ones
  for (const [kind, label] of SERIES) {
    const dots = h("svg:g", { class: `series ${kind}`, "data-series": kind });
    for (const [due, lag, queue, priority] of samples[kind]) {
      const dot = h("svg:circle", { class: `dot ${kind}`, cx: x(due).toFixed(1), cy: y(lag).toFixed(1), r });
      dot.appendChild(h("svg:title", {},
        `${label} ${duration(lag)} · ${queue}/${priority} · due ${formatIn(due, zone, { seconds: true })} (${utc(due)} UTC)`));
      dots.appendChild(dot);
    }
    svg.appendChild(dots);
  }
  return svg;
}

/** The lag axis' top: the first tick at or above the largest lag (a second at least). */
function topTick(largest) {
  return Y_TICKS.find((t) => t >= Math.max(1, largest)) ?? largest;
}

/** Whole minutes from ``t0`` to ``t1``, about six of them. */
function timeTicks(t0, t1) {
  const span = (t1 - t0) / 60000;
  const step = (X_STEPS_MIN.find((m) => span / m <= 6) ?? Math.ceil(span / 6)) * 60000;
  const out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) out.push(t);
  return out;
}
