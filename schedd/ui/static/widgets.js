// Pieces the screens share: the filter form mirrored into the address, the pager over the
// API's cursors, and how an action's outcome is told.

import { notice } from "./clusterbar.js";
import { fill, h } from "./dom.js";

/**
 * A filter form: ``fields`` is [[name, label, options?]] (options: a select's values, "" for
 * any). Its values come from the address (``params``); applying it goes to the first page of
 * the new filter, as an address of its own (so it can be bookmarked and the back button works).
 */
export function filterForm(fields, params, navigate, path) {
  const inputs = fields.map(([name, label, options]) => {
    const value = params.get(name) ?? "";
    // a value of the address that is none of the choices (a bookmarked since=…) stays one
    const choices = options && !options.some(([v]) => v === value) ? [...options, [value, value]] : options;
    const control = choices
      ? h("select", { name, id: `f-${name}` },
          choices.map(([v, text]) => h("option", { value: v, selected: v === value }, text)))
      : h("input", { name, id: `f-${name}`, value, autocomplete: "off", spellcheck: "false" });
    return h("label", { for: `f-${name}` }, label, control);
  });
  const clear = h("a", { href: path, class: "clear" }, "clear");
  const form = h("form", { class: "filters", id: "filters" }, inputs,
    h("button", { type: "submit" }, "Apply"), clear);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [name] of fields) {
      const v = form.elements[name].value.trim();
      if (v) next.set(name, v);
    }
    const q = next.toString();
    navigate(q ? `${path}?${q}` : path);
  });
  return form;
}

/** The filter of the address: its fields that are set, without the cursor. */
export function filterOf(params, names) {
  const out = {};
  for (const name of names) {
    const v = params.get(name);
    if (v) out[name] = v;
  }
  return out;
}

/**
 * Paging = the API's own: the address carries the ``cursor`` (the previous answer's
 * ``next_cursor``). "Previous" is the browser's back (each page is a history entry).
 */
export function pager(nextCursor, params, navigate, path, count) {
  const here = params.get("cursor");
  const bits = [];
  if (here) {
    const first = new URLSearchParams(params);
    first.delete("cursor");
    const q = first.toString();
    bits.push(h("a", { href: q ? `${path}?${q}` : path, class: "page-first" }, "« First page"));
    if (history.state?.paged) {
      const back = h("button", { type: "button", class: "link page-prev" }, "‹ Previous");
      back.addEventListener("click", () => history.back());
      bits.push(back);
    }
  }
  bits.push(h("span", { class: "muted page-count" }, `${count} on this page`));
  if (nextCursor) {
    const next = new URLSearchParams(params);
    next.set("cursor", nextCursor);
    const button = h("button", { type: "button", class: "page-next" }, "Next page ›");
    button.addEventListener("click", () =>
      navigate(`${path}?${next.toString()}`, { state: { paged: true } }));
    bits.push(button);
  } else {
    bits.push(h("span", { class: "muted" }, "last page"));
  }
  return h("nav", { class: "pager", "aria-label": "pages" }, bits);
}

/** Run an action, tell its outcome in a notice, and refresh. */
export async function act(label, fn, refresh) {
  try {
    await fn();
    notice(`${label}: done`);
  } catch (err) {
    notice(`${label}: ${err.message}`, "error");
  }
  await refresh?.();
}

/** An error in place of a screen's content. */
export function errorBox(err) {
  return h("div", { class: "error", role: "alert" }, err.message ?? String(err));
}

/** Say that ``el``'s data could not be read. When the node cannot be reached or has no leader
 * (a failover), what it showed stays, greyed, under the error; otherwise the error replaces
 * it. The next successful ``fill`` of ``el`` clears both. */
export function failed(el, err) {
  const passing = err?.status === 0 || err?.status === 503;
  const shown = [...el.children].some((c) => !c.classList.contains("error"));
  if (passing && shown) {
    el.classList.add("stale");
    const box = errorBox(err);
    const old = el.querySelector(":scope > .error");
    if (old) old.replaceWith(box);
    else el.prepend(box);
    return;
  }
  fill(el, errorBox(err));
}
