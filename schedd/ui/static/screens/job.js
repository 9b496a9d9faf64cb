// One job: its spec in readable form, its next fire times as the API explains them (never
// computed here), its run history newest first (skipped runs with their reasons) and its
// upstream jobs as links.

import { API, enc, get } from "../api.js";
import { badge, fill, h, jobBadge, link, pre, shortId, when } from "../dom.js";
import { describeSchedule, duration, formatIn, jobZone, relative } from "../fmt.js";
import { viewerZone } from "../settings.js";
import { failed, filterForm, filterOf, pager } from "../widgets.js";
import { jobActions, policies, runCells } from "./jobs.js";

const RUN_FILTERS = [
  ["state", "State", [["", "any"], ...["failed", "succeeded", "running", "queued", "scheduled", "retrying", "blocked", "skipped", "cancelled"].map((s) => [s, s])]],
  ["since", "Scheduled since (RFC 3339)"],
];

export function jobScreen(main, { id, params, navigate }) {
  const path = `/ui/jobs/${enc(id)}`;
  const head = h("div", { class: "screen-head" }, h("h1", {}, "Job ", shortId(id)));
  const spec = h("section", {}, h("p", { class: "muted" }, "Loading…"));
  // the fires after another day (fires_from=YYYY-MM-DD, UTC): what a DST change will do
  const firesFrom = /^\d{4}-\d{2}-\d{2}$/.test(params.get("fires_from") ?? "") ? params.get("fires_from") : null;
  const firesBody = h("div", {});
  const fires = h("section", { id: "explain" }, h("h2", {}, "Next fires"),
    firesForm(firesFrom, params, navigate, path), firesBody);
  // the runs' filter is drawn once (a refresh must not wipe what is being typed in it)
  const runsBody = h("div", {});
  const runs = h("section", { id: "runs" }, h("h2", {}, "Runs (newest first)"),
    filterForm(RUN_FILTERS, params, navigate, path), runsBody);
  fill(main, head, spec, fires, runs);
  let alive = true;
  const names = new Map();

  async function load() {
    let job;
    try {
      job = await get(`${API}/jobs/${enc(id)}`);
    } catch (err) {
      if (alive) failed(spec, err);
      return;
    }
    if (!alive || main.querySelector(".armed")) return;
    const title = job.name ? [job.name, " "] : [];
    fill(head, h("h1", {}, title, shortId(job.id)), jobBadge(job),
      h("span", { class: "actions" }, jobActions(job, load)));
    fill(spec, specTable(job, names));
    await Promise.all([explain(job), history(job)]);
  }

  async function explain(job) {
    try {
      const from = firesFrom ? `${firesFrom}T00:00:00Z` : null;
      const answer = await get(`${API}/jobs/${enc(id)}/explain`, { count: 10, from });
      if (alive) fill(firesBody, firesTable(answer.fires, jobZone(job)));
    } catch (err) {
      if (alive) failed(firesBody, err);
    }
  }

  async function history(job) {
    const filter = filterOf(params, ["state", "since"]);
    try {
      const page = await get(`${API}/jobs/${enc(id)}/runs`, { ...filter, cursor: params.get("cursor"), limit: 50 });
      if (!alive) return;
      fill(runsBody, runsTable(page.runs, jobZone(job)),
        pager(page.next_cursor, params, navigate, path, page.runs.length));
    } catch (err) {
      if (alive) failed(runsBody, err);
    }
  }

  load();
  return {
    refresh: load,
    relevant: (type, changes) => changes.some((c) => c.id === id || c.job_id === id),
    destroy() { alive = false; },
  };
}

function specTable(job, names) {
  const s = job.schedule;
  const rows = [
    ["Task", job.task],
    ["Name", job.name ?? "—"],
    ["Namespace / queue", `${job.namespace} / ${job.queue}`],
    ["Schedule", [describeSchedule(s), s?.cron ? h("div", { class: "muted mono" }, `cron ${s.cron}`) : null]],
  ];
  if (s && (s.cron !== undefined || s.every !== undefined)) {
    rows.push(["Time zone", s.timezone]);
    const dst = s.dst ? `gap ${s.dst.gap}, repeated hour ${s.dst.repeat}` : "—";
    rows.push(["Overlap · misfire", `${s.overlap} · ${s.misfire}${s.catchup_window ? `, catch up ${duration(s.catchup_window)}` : ""}`]);
    rows.push(["Daylight saving", dst]);
    if (s.jitter) rows.push(["Jitter", duration(s.jitter)]);
    if (s.start_at) rows.push(["Starts", when(s.start_at, s.timezone)]);
    if (s.end_at) rows.push(["Ends", when(s.end_at, s.timezone)]);
  }
  rows.push(
    ["Next fire", when(job.next_run_at, jobZone(job))],
    ["Priority", job.priority],
    ["Retry", `${job.retry.max_attempts} attempts, backoff ${duration(job.retry.initial)} × ${job.retry.multiplier} up to ${duration(job.retry.max)}${job.retry.jitter ? " with jitter" : ""}`],
    ["Timeout · heartbeat", `${job.timeout === null ? "none" : duration(job.timeout)} · ${duration(job.heartbeat_timeout)}`],
    ["Policies", policies(job)],
    ["Depends on", job.depends_on.length ? job.depends_on.map((d) => upstream(d, names)) : "—"],
    ["Idempotency key", job.idempotency_key ?? "—"],
    ["Created · updated", [when(job.created_at, jobZone(job)), " ", when(job.updated_at, jobZone(job))]],
    ["Latest run", job.latest_run ? runCells([job.latest_run]) : "none yet"],
    ["Payload", pre(job.payload)],
  );
  if (job.latest_run?.waiting) rows.push(["Waiting", job.latest_run.waiting]);
  return h("table", { class: "kv", id: "spec" },
    h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))));
}

/** A link to an upstream job, named once its name is known. */
function upstream(jobId, names) {
  const a = link(`/ui/jobs/${enc(jobId)}`, names.get(jobId) ?? jobId);
  a.classList.add("dep");
  if (!names.has(jobId)) {
    get(`${API}/jobs/${enc(jobId)}`).then(
      (dep) => {
        names.set(jobId, dep.name ? `${dep.name} (${dep.status})` : `${jobId} (${dep.status})`);
        a.textContent = names.get(jobId);
      },
      () => {},
    );
  }
  return h("div", {}, a);
}

/** "After [date] (UTC)": the API's fire times from another day on, kept in the address. */
function firesForm(value, params, navigate, path) {
  const input = h("input", { type: "date", id: "fires-from", value: value ?? "" });
  const form = h("form", { class: "filters", id: "fires-form" },
    h("label", { for: "fires-from" }, "After this day (UTC)", input),
    h("button", { type: "submit" }, "Show"),
    value ? h("a", { href: path, class: "clear" }, "from now") : null);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams(params);
    next.delete("cursor");
    if (input.value) next.set("fires_from", input.value);
    else next.delete("fires_from");
    const q = next.toString();
    navigate(q ? `${path}?${q}` : path);
  });
  return form;
}

/** The API's fire times, read in the job's zone, the viewer's when it is another (each with its
 * offset, to the second) and in UTC, with how far each is and the API's note. */
export function firesTable(fires, zone) {
  if (!fires.length) return h("p", { class: "empty" }, "No more fires.");
  const viewer = viewerZone();
  const mine = viewer !== zone;
  const heads = [`In ${zone}`, ...(mine ? [`In ${viewer} (yours)`] : []), "UTC", "In", "Note"];
  return h("table", { class: "fires" },
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))),
    h("tbody", {}, fires.map((f) => h("tr", {},
      h("td", { class: "fire-job", title: `${f.scheduled_at} (UTC); the API: ${f.local}` }, formatIn(f.scheduled_at, zone)),
      mine ? h("td", { class: "fire-viewer" }, formatIn(f.scheduled_at, viewer)) : null,
      h("td", { class: "fire-utc" }, formatIn(f.scheduled_at, "UTC")),
      h("td", {}, h("span", { class: "age", "data-at": f.due_at, title: `due ${f.due_at} (UTC)` }, relative(f.due_at))),
      h("td", { class: "note" }, f.note ?? "")))));
}

export function runsTable(runs, zone) {
  if (!runs.length) return h("p", { class: "empty" }, "No runs.");
  const heads = ["Run", "State", "Scheduled", "Attempts", "Worker", "Took", "Error or reason"];
  return h("table", { class: "runs-table" },
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))),
    h("tbody", {}, runs.map((run) => {
      const last = run.attempts.at(-1);
      const took = last?.ended_at ? (Date.parse(last.ended_at) - Date.parse(last.started_at)) / 1000 : null;
      return h("tr", { "data-run": run.id, class: `run-${run.state}` },
        h("td", {}, link(`/ui/runs/${enc(run.id)}`, shortId(run.id.split("@").at(-1)))),
        h("td", {}, badge(run.state)),
        h("td", {}, when(run.scheduled_at, zone)),
        h("td", {}, String(run.attempts.length)),
        h("td", {}, last?.worker_id ?? "—"),
        h("td", {}, took === null ? "—" : duration(took)),
        h("td", { class: "why" }, run.error ?? run.reason ?? run.waiting ?? ""));
    })));
}
