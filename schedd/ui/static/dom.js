// Building the page: elements from data with textContent only (never markup from data), and
// the time cells every screen shows.

import { formatIn, relative, utc } from "./fmt.js";
import { viewerZone } from "./settings.js";

/**
 * h("a", {href: "/ui/jobs", class: "x", on: {click: fn}}, "text", child…): an element. Strings
 * become text nodes; null, undefined and false children are left out. Attributes are set with
 * setAttribute (never "style" or "on…": the page's policy refuses inline style and script).
 */
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "on") {
      for (const [event, fn] of Object.entries(value)) el.addEventListener(event, fn);
    } else if (key === "style" || key.startsWith("on")) {
      throw new Error(`h(): ${key} is not allowed`);
    } else if (key === "value" && "value" in el) {
      el.value = value;
    } else if (key === "checked") {
      el.checked = Boolean(value);
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/** Replace the children of ``el`` with ``children``. */
export function fill(el, ...children) {
  el.classList.remove("stale");
  el.replaceChildren();
  append(el, children);
  labelCells(el);
  return el;
}

/** Give each cell of the data tables under ``root`` its column's heading (``data-label``): a
 * narrow screen shows it in front of the cell when the table collapses into cards. */
function labelCells(root) {
  for (const table of root.querySelectorAll("table:not(.kv)")) {
    const heads = [...table.querySelectorAll("thead th")].map((th) => th.dataset.label ?? th.textContent.trim());
    if (!heads.length) continue;
    for (const row of table.querySelectorAll("tbody tr")) {
      let col = 0;
      for (const cell of row.children) {
        const span = Number(cell.getAttribute("colspan") ?? 1);
        if (span === 1 && heads[col] && !cell.dataset.label) cell.dataset.label = heads[col];
        col += span;
      }
    }
  }
}

/** A link inside the dashboard: navigates without reloading the page. */
export function link(href, ...children) {
  return h("a", { href }, ...children);
}

/** A state ("failed", "succeeded", …) as a coloured badge. */
export function badge(state, title) {
  return h("span", { class: `badge st-${state ?? "none"}`, title }, state ?? "—");
}

/** A run's job's name and task: the run's view says them (a node before names did not: then
 * its job's view, when the screen has read it). */
export const jobName = (run, job) => run.job_name ?? job?.name ?? null;
export const jobTask = (run, job) => run.task ?? job?.task ?? null;

/** A job's status as shown: "failed" (red) for a done job whose latest run failed for good;
 * the API's status says only that nothing more will run. */
function jobStatus(job) {
  return job.status === "done" && job.latest_run?.state === "failed" ? "failed" : job.status;
}

/** A job's status badge (see jobStatus), titled with what the API says. */
export function jobBadge(job) {
  const shown = jobStatus(job);
  return badge(shown, shown === job.status ? undefined : `done: its latest run ${job.latest_run.state}`);
}

/**
 * An instant as the screens show it: in the job's zone and, when it differs, the viewer's,
 * each with its offset, then how far it is from now. UTC on hover. The age is refreshed by
 * ``tickAges`` (``data-at``).
 */
export function when(instant, zone = null, { seconds = true, ms = false } = {}) {
  if (instant === null || instant === undefined) return h("span", { class: "muted" }, "—");
  const viewer = viewerZone();
  const lines = [];
  if (zone && zone !== viewer) {
    lines.push(h("span", { class: "tz-job" }, formatIn(instant, zone, { seconds, ms })));
  }
  lines.push(h("span", { class: "tz-viewer" }, formatIn(instant, viewer, { seconds, ms })));
  lines.push(h("span", { class: "age", "data-at": utc(instant) }, relative(instant)));
  return h("span", { class: "when", title: `${utc(instant)} (UTC)` }, lines);
}

/** Refresh every age on the page (``when`` cells). */
export function tickAges(root = document) {
  const now = Date.now();
  for (const el of root.querySelectorAll(".age[data-at]")) {
    el.textContent = relative(el.dataset.at, now);
  }
}

/** A short id: the first 10 characters, the whole one on hover. */
export function shortId(id) {
  return h("span", { class: "id", title: id }, id.length > 14 ? id.slice(0, 10) + "…" : id);
}

/** A button that asks to be clicked twice for something that cannot be undone. */
export function confirmButton(label, confirmLabel, action, cls = "danger") {
  let armed = null;
  const button = h("button", { type: "button", class: cls }, label);
  button.addEventListener("click", async () => {
    if (armed === null) {
      button.textContent = confirmLabel;
      button.classList.add("armed");
      armed = setTimeout(() => {
        armed = null;
        button.textContent = label;
        button.classList.remove("armed");
      }, 4000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.disabled = true;
    try {
      await action();
    } finally {
      button.disabled = false;
      button.textContent = label;
      button.classList.remove("armed");
    }
  });
  return button;
}

/** JSON, pretty, as text. */
export function pre(value, cls = "json") {
  return h("pre", { class: cls }, typeof value === "string" ? value : JSON.stringify(value, null, 2));
}
