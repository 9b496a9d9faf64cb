// The dashboard's shell: log in, the cluster bar, the viewer's zone, the screens by address
// (/ui/jobs, /ui/jobs/<id>, /ui/runs/<id>, /ui/dlq, /ui/workers, /ui/lag, /ui/cluster) and
// their live refresh.

import { ApiError, exchangeCode, login, on, sawIndex, session } from "./api.js";
import * as clusterbar from "./clusterbar.js";
import { fill, h, tickAges } from "./dom.js";
import { browserZone } from "./fmt.js";
import * as live from "./live.js";
import { setToken, setViewerZone, token, viewerZone } from "./settings.js";
import { clusterScreen } from "./screens/cluster.js";
import { dlqScreen } from "./screens/dlq.js";
import { jobScreen } from "./screens/job.js";
import { jobsScreen } from "./screens/jobs.js";
import { lagScreen } from "./screens/lag.js";
import { loginScreen } from "./screens/login.js";
import { runScreen } from "./screens/run.js";
import { workersScreen } from "./screens/workers.js";

const ROUTES = [
  [/^\/ui\/?$/, "jobs", jobsScreen],
  [/^\/ui\/jobs\/?$/, "jobs", jobsScreen],
  [/^\/ui\/jobs\/([^/]+)$/, "jobs", jobScreen],
  [/^\/ui\/runs\/([^/]+)$/, "jobs", runScreen],
  [/^\/ui\/dlq\/?$/, "dlq", dlqScreen],
  [/^\/ui\/workers\/?$/, "workers", workersScreen],
  [/^\/ui\/lag\/?$/, "lag", lagScreen],
  [/^\/ui\/cluster\/?$/, "cluster", clusterScreen],
];

const main = document.getElementById("main");
let screen = null; // {refresh(kind), destroy()}
let refreshTimer = null;
let loggedIn = false;

/** Go to ``href`` inside the dashboard (a history entry; ``replace``: none). */
export function navigate(href, { replace = false, state = null } = {}) {
  if (replace) history.replaceState(state, "", href);
  else history.pushState(state, "", href);
  route();
}

function route() {
  screen?.destroy?.();
  screen = null;
  if (!loggedIn) {
    showLogin();
    return;
  }
  const path = location.pathname;
  for (const [pattern, nav, make] of ROUTES) {
    const m = pattern.exec(path);
    if (m) {
      markNav(nav);
      const params = new URLSearchParams(location.search);
      screen = make(main, { id: m[1] ? decodeURIComponent(m[1]) : null, params, navigate });
      return;
    }
  }
  markNav(null);
  fill(main, h("h1", {}, "No such screen"), h("p", {}, h("a", { href: "/ui/jobs" }, "Jobs")));
}

function markNav(name) {
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("current", a.dataset.screen === name);
  }
}

/** Refresh the bar and the screen soon: at once for a poll, else at most once a second (the
 * events of a busy cluster make one refresh). */
function refreshSoon(kind) {
  if (refreshTimer !== null) return;
  refreshTimer = setTimeout(() => {
    refreshTimer = null;
    if (!loggedIn || document.hidden) return;
    clusterbar.refresh();
    screen?.refresh?.(kind);
  }, kind === "poll" ? 0 : 1000);
}

function showLogin(message = null) {
  document.body.classList.add("logged-out");
  markNav(null);
  screen = loginScreen(main, { message, onToken: start });
}

async function start(secret) {
  setToken(secret);
  try {
    await login();
  } catch (err) {
    setToken(null);
    const why = err instanceof ApiError && err.status === 401
      ? "That token was refused (401): check it against the node's tokens file."
      : `Could not log in: ${err.message}`;
    showLogin(why);
    return;
  }
  loggedIn = true;
  document.body.classList.remove("logged-out");
  drawWho();
  clusterbar.refresh();
  live.start();
  route();
}

function logout(message = null) {
  loggedIn = false;
  setToken(null);
  live.stop();
  clusterbar.reset();
  fill(document.getElementById("who"));
  screen?.destroy?.();
  screen = null;
  showLogin(message);
}

function drawWho() {
  const zones = Intl.supportedValuesOf ? Intl.supportedValuesOf("timeZone") : [];
  const mine = viewerZone();
  const options = [...new Set(["UTC", browserZone(), mine, ...zones])].map((z) =>
    h("option", { value: z, selected: z === mine }, z === browserZone() ? `${z} (this browser)` : z),
  );
  const select = h("select", { id: "viewer-zone", "aria-label": "your time zone" }, options);
  select.addEventListener("change", () => {
    setViewerZone(select.value);
    screen?.refresh?.("zone");
  });
  const out = h("button", { type: "button", class: "link", id: "logout" }, "Log out");
  out.addEventListener("click", () => logout());
  const role = session.role ?? "?";
  fill(
    document.getElementById("who"),
    h("label", { class: "zone" }, "Times in ", select),
    h("span", { class: `role role-${role}`, id: "role", title: session.name ?? "" }, role),
    out,
  );
}

function boot() {
  clusterbar.init(
    document.getElementById("cluster"),
    document.getElementById("banner"),
    document.getElementById("notices"),
  );
  on("unauthenticated", (err) => {
    if (loggedIn) logout(`The token is no longer accepted (401: ${err.message}). Paste a valid one.`);
  });
  live.subscribe((kind, event) => {
    if (kind === "event" && event.type === "cluster") {
      // a new leader or a membership change: the bar, and the screen only if it shows the
      // cluster (the others do not say so)
      clusterbar.refresh();
      if (screen?.relevant?.("cluster", event.data ?? [])) refreshSoon(kind);
      return;
    }
    // an event about what the screen does not show does not refresh it
    if (kind === "event" && screen?.relevant && !screen.relevant(event.type, event.data ?? [])) return;
    refreshSoon(kind);
  });
  document.addEventListener("click", (event) => {
    const a = event.target.closest?.("a[href]");
    if (!a || event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey || a.target) return;
    const url = new URL(a.href, location.href);
    if (url.origin !== location.origin || !url.pathname.startsWith("/ui/")) return;
    if (url.pathname.startsWith("/ui/static/")) return;
    event.preventDefault();
    navigate(url.pathname + url.search);
  });
  window.addEventListener("popstate", route);
  setInterval(() => {
    if (!document.hidden) tickAges();
  }, 5000);
  // the indexes and lags move without events, and so do the workers: the bar, and a screen
  // that says so (poll: true), ask again every few seconds
  setInterval(() => {
    if (!loggedIn || document.hidden) return;
    clusterbar.refresh();
    if (screen?.poll && live.status.mode === "live") screen.refresh("poll");
  }, live.POLL_MS);
  // a `schedctl ui` link opened in this tab later changes only the address's fragment
  window.addEventListener("hashchange", takeCode);
  if (takeCode()) return;
  takeHandover();
  const secret = token();
  if (secret) start(secret);
  else showLogin();
}

/** Open a session with the one-time code of a `schedctl ui` link, if the address has one. */
function takeCode() {
  const code = new URLSearchParams(location.hash.slice(1)).get("code");
  if (!code) return false;
  // out of the address (and the history) at once
  history.replaceState(history.state, "", location.pathname + location.search);
  if (loggedIn) {
    loggedIn = false;
    live.stop();
  }
  openSession(code);
  return true;
}

/** A page handed over by a node that went away (clusterbar.js) brings its session in the
 * address's fragment, and the highest index it had seen: taken into this tab, and out of the
 * address (and the history) at once. */
function takeHandover() {
  const given = new URLSearchParams(location.hash.slice(1));
  const secret = given.get("schedd-session");
  if (!secret) return;
  history.replaceState(history.state, "", location.pathname + location.search);
  setToken(secret);
  sawIndex(given.get("schedd-index"));
}

async function openSession(code) {
  let secret;
  try {
    secret = await exchangeCode(code);
  } catch (err) {
    setToken(null);
    showLogin(`That login link did not work: ${err.message}`);
    return;
  }
  start(secret);
}

boot();
