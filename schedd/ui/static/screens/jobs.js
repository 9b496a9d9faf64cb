// Jobs: one page of GET /api/v1/jobs with the API's own filters and cursor (mirrored in the
// address), each job's schedule in words, its next fire in its zone and the viewer's, its last
// runs as coloured cells, its policies, and the actions the token's role allows.

import { API, call, can, enc, get } from "../api.js";
import { confirmButton, fill, h, jobBadge, link, shortId, when } from "../dom.js";
import { describeSchedule, jobZone } from "../fmt.js";
import { act, failed, filterForm, filterOf, pager } from "../widgets.js";

const PATH = "/ui/jobs";
const FILTERS = [
  ["namespace", "Namespace"],
  ["queue", "Queue"],
  ["status", "Status", [["", "any"], ["active", "active"], ["paused", "paused"], ["done", "done"], ["cancelled", "cancelled"]]],
  ["last_run", "Latest run", [["", "any"], ...["failed", "succeeded", "running", "queued", "scheduled", "retrying", "blocked", "skipped", "cancelled"].map((s) => [s, s])]],
  ["task", "Task"],
  ["name", "Name"],
  ["sort", "Sort", [["", "created"], ["next_fire", "next fire"], ["latest_run", "latest run"]]],
  ["order", "Order", [["", "default"], ["desc", "descending"], ["asc", "ascending"]]],
  ["limit", "Per page", [["", "100"], ["25", "25"], ["50", "50"], ["200", "200"], ["500", "500"]]],
];
// The API's sorts: each one's default direction (descending: the newest or latest first)
const DESCENDING = { created: true, next_fire: false, latest_run: true };
const LAST_RUNS = 8;
const runsCache = new Map(); // job id → {key, runs}: fetched again only when its latest run changes

export function jobsScreen(main, { params, navigate }) {
  const table = h("div", { class: "table-wrap" }, h("p", { class: "muted" }, "Loading jobs…"));
  const paging = h("div");
  fill(main,
    h("div", { class: "screen-head" }, h("h1", {}, "Jobs")),
    filterForm(FILTERS, params, navigate, PATH),
    paging,
    table);
  const started = performance.now();
  let alive = true;
  let generation = 0;
  let shown = new Set(); // the ids of the jobs on the page

  async function load() {
    const mine = ++generation;
    let page;
    try {
      page = await get(`${API}/jobs`, {
        ...filterOf(params, FILTERS.map(([n]) => n)),
        cursor: params.get("cursor"),
      });
    } catch (err) {
      if (alive) failed(table, err);
      return;
    }
    if (!alive || mine !== generation || main.querySelector(".armed")) return;
    shown = new Set(page.jobs.map((job) => job.id));
    fill(table, jobTable(page.jobs, load, params));
    fill(paging, pager(page.next_cursor, params, navigate, PATH, page.jobs.length));
    if (!main.dataset.firstPageMs) {
      main.dataset.firstPageMs = String(Math.round(performance.now() - started));
      performance.mark("schedd:jobs-first-page");
    }
    await fillLastRuns(page.jobs, () => alive && mine === generation);
  }

  /** An event matters when it is about a job on the page, or a job the filter may show. */
  function relevant(type, changes) {
    const f = filterOf(params, ["namespace", "queue", "task", "name"]);
    if (type === "run") return changes.some((c) => shown.has(c.job_id));
    if (type !== "job") return false;
    return changes.some((c) => shown.has(c.id) || (
      (!f.namespace || c.namespace === f.namespace) && (!f.queue || c.queue === f.queue) &&
      (!f.task || c.task === f.task) && (!f.name || c.name === f.name)));
  }

  load();
  return {
    refresh: load,
    relevant,
    destroy() {
      alive = false;
      delete main.dataset.firstPageMs;
    },
  };
}

function jobTable(jobs, refresh, params) {
  if (jobs.length === 0) return h("p", { class: "empty" }, "No job matches.");
  const head = [["Job", "created"], "Task", "Schedule", ["Next fire", "next_fire"], "Status",
    ["Last runs", "latest_run"], "Policies", ""];
  return h("table", { class: "jobs", id: "jobs-table" },
    h("thead", {}, h("tr", {}, head.map((t) => Array.isArray(t) ? sortHeader(...t, params) : h("th", {}, t)))),
    h("tbody", {}, jobs.map((job) => jobRow(job, refresh))));
}

/** The listing's sort and whether it goes from the largest down. */
function sortOf(params) {
  const sort = params.get("sort") || "created";
  const order = params.get("order");
  return { sort, desc: order ? order === "desc" : DESCENDING[sort] ?? true };
}

/** A column head that sorts by its column: the first page in that sort's own direction, or
 * the other way round when the page is already sorted by it (an arrow says which way). */
function sortHeader(label, sort, params) {
  const now = sortOf(params);
  const here = now.sort === sort;
  const desc = here ? !now.desc : DESCENDING[sort];
  const next = new URLSearchParams(params);
  next.delete("cursor");
  if (sort === "created") next.delete("sort");
  else next.set("sort", sort);
  if (desc === DESCENDING[sort]) next.delete("order");
  else next.set("order", desc ? "desc" : "asc");
  const q = next.toString();
  const title = `sort by ${label.toLowerCase()}, ${desc ? "descending" : "ascending"}`;
  return h("th", { "aria-sort": here ? (now.desc ? "descending" : "ascending") : "none", "data-label": label },
    h("a", { href: q ? `${PATH}?${q}` : PATH, class: "sort", title, "data-sort": sort },
      label, here ? (now.desc ? " ▼" : " ▲") : ""));
}

function jobRow(job, refresh) {
  const zone = jobZone(job);
  const name = job.name ? [h("b", {}, job.name), " "] : [];
  return h("tr", { "data-job": job.id },
    h("td", { class: "job" }, link(`/ui/jobs/${enc(job.id)}`, name, shortId(job.id)),
      h("div", { class: "muted" }, `${job.namespace} / ${job.queue}`)),
    h("td", {}, job.task),
    h("td", { class: "schedule" }, scheduleCell(job)),
    h("td", { class: "next" }, when(job.next_run_at, zone)),
    h("td", {}, jobBadge(job)),
    h("td", { class: "runs", "data-runs": job.id }, runCells(cached(job) ?? (job.latest_run ? [job.latest_run] : []))),
    h("td", { class: "policies" }, policies(job)),
    h("td", { class: "actions" }, jobActions(job, refresh)));
}

export function scheduleCell(job) {
  const s = job.schedule;
  const raw = s?.cron ? `cron ${s.cron}` : null;
  return [h("span", { class: "words" }, describeSchedule(s)),
    raw ? h("div", { class: "muted mono" }, raw) : null];
}

/** The job's policies that matter when reading it: overlap, misfire, attempts, priority. */
export function policies(job) {
  const s = job.schedule ?? {};
  const out = [];
  if (s.overlap) out.push(`overlap ${s.overlap}`);
  if (s.misfire) out.push(`misfire ${s.misfire}`);
  out.push(`${job.retry.max_attempts} attempt${job.retry.max_attempts === 1 ? "" : "s"}`);
  if (job.priority !== "normal") out.push(`${job.priority} priority`);
  if (job.timeout) out.push(`timeout ${job.timeout} s`);
  if (job.depends_on.length) out.push(`${job.depends_on.length} upstream`);
  return out.map((p) => h("span", { class: "pill" }, p));
}

/** The actions on a job that the token's role may do (none for a read token). */
export function jobActions(job, refresh) {
  const id = enc(job.id);
  const out = [];
  const live = job.status === "active" || job.status === "paused";
  if (live && can("post", `${API}/jobs/{job_id}/trigger`)) {
    out.push(button("Trigger", "trigger", () =>
      act(`Trigger ${job.name ?? job.id}`, () => call("POST", `${API}/jobs/${id}/trigger`, { body: {} }), refresh)));
  }
  if (live && can("patch", `${API}/jobs/{job_id}`)) {
    const pause = job.status === "active";
    out.push(button(pause ? "Pause" : "Resume", pause ? "pause" : "resume", () =>
      act(`${pause ? "Pause" : "Resume"} ${job.name ?? job.id}`,
        () => call("PATCH", `${API}/jobs/${id}`, { body: { paused: pause } }), refresh)));
  }
  if (live && can("delete", `${API}/jobs/{job_id}`)) {
    const b = confirmButton("Cancel", "Cancel the job?", () =>
      act(`Cancel ${job.name ?? job.id}`, () => call("DELETE", `${API}/jobs/${id}`), refresh));
    b.dataset.action = "cancel";
    out.push(b);
  }
  return out;
}

function button(label, action, fn) {
  const b = h("button", { type: "button", "data-action": action }, label);
  b.addEventListener("click", async () => {
    b.disabled = true;
    try {
      await fn();
    } finally {
      b.disabled = false;
    }
  });
  return b;
}

function cacheKey(job) {
  const r = job.latest_run;
  return r ? `${r.id}|${r.updated_at}` : "none";
}

/** The job's last runs as known: fetched once, then kept up to date from its latest run
 * (each refresh of the page brings it), so a busy page asks for no more than its new rows. */
function cached(job) {
  const hit = runsCache.get(job.id);
  if (!hit) return null;
  if (hit.key !== cacheKey(job) && job.latest_run) {
    const latest = job.latest_run;
    const rest = hit.runs.filter((r) => r.id !== latest.id);
    hit.runs = [latest, ...rest].slice(0, LAST_RUNS);
    hit.key = cacheKey(job);
  }
  return hit.runs;
}

/** Each row's last runs, newest first (a few requests at a time; cached while unchanged). */
async function fillLastRuns(jobs, current) {
  const todo = jobs.filter((job) => job.latest_run && cached(job) === null);
  const worker = async () => {
    while (todo.length && current()) {
      const job = todo.shift();
      try {
        const page = await get(`${API}/jobs/${enc(job.id)}/runs`, { limit: LAST_RUNS });
        runsCache.set(job.id, { key: cacheKey(job), runs: page.runs });
        const cell = document.querySelector(`td[data-runs="${CSS.escape(job.id)}"]`);
        if (cell && current()) fill(cell, runCells(page.runs));
      } catch {
        // the row keeps its latest run
      }
    }
  };
  await Promise.all([worker(), worker(), worker(), worker()]);
  if (runsCache.size > 5000) runsCache.clear();
}

/** Runs (newest first) as coloured cells, oldest on the left; each links to its run. */
export function runCells(runs) {
  if (!runs.length) return h("span", { class: "muted" }, "none yet");
  const cells = [...runs].reverse().map((run) =>
    h("a", {
      href: `/ui/runs/${enc(run.id)}`,
      class: `cell st-${run.state}`,
      title: `${run.state} · ${run.scheduled_at}${run.error ? " · " + run.error : ""}${run.reason ? " · " + run.reason : ""}`,
      "aria-label": run.state,
    }));
  return h("span", { class: "cells" }, cells);
}
