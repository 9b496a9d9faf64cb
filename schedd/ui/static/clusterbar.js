// The cluster bar on every screen: the leader and its term, quorum, commit and applied index,
// each node's role, lag and last contact, and which node serves this page. No leader: a red
// banner that counts down to the next try. A new leader: a notice "leader n1 → n3 at term 8".

import { API, ApiError, OPTIONAL, get, has, seen } from "./api.js";
import { fill, h } from "./dom.js";
import { duration } from "./fmt.js";
import { token } from "./settings.js";

const PROBE_MS = 2000; // how long another node may take to answer before the next is tried

let bar;
let banner;
let notices;
let last = null; // the previous answer
let lastLeader = null; // the last leader seen (kept across a time without one)
let countdown = null;
let inflight = null;
const names = new Map(); // Raft address → node id, as learnt (a follower knows only the leader's)

export function init(barEl, bannerEl, noticesEl) {
  bar = barEl;
  banner = bannerEl;
  notices = noticesEl;
}

export function reset() {
  last = null;
  lastLeader = null;
  clearInterval(countdown);
  countdown = null;
  bar.replaceChildren();
  banner.hidden = true;
}

/** Ask this node for the cluster again and redraw the bar (one request at a time). */
export function refresh() {
  inflight ??= load().finally(() => {
    inflight = null;
  });
  return inflight;
}

async function load() {
  let view;
  try {
    view = await get(`${API}/cluster`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return;
    const gone = err.status === 0;
    showBanner(gone ? "This node cannot be reached." : err.message, err.retryAfter ?? 3, gone ? others() : []);
    bar.classList.add("stale");
    if (gone) moveToAnother();
    return;
  }
  bar.classList.remove("stale");
  draw(view, has("lag") ? await schedulingLag() : null);
  const leaderless = !view.leader || !view.has_quorum;
  if (leaderless) {
    const why = view.has_quorum ? "no leader is known yet" : "this node sees no quorum";
    showBanner(`No leader: ${why}; writes wait until one is elected.`, 3);
  } else {
    hideBanner();
    // a new leader is told once its id is known (until its claim applies, /cluster names it
    // by its Raft address)
    const known = !view.leader.includes(":");
    if (known && lastLeader !== null && lastLeader.id !== view.leader) {
      notice(`leader ${lastLeader.id} → ${view.leader} at term ${view.term}`);
    }
    if (known) lastLeader = { id: view.leader, term: view.term };
  }
  last = view;
}

/** How late the leader schedules (where the node has GET /scheduling-lag), or null. */
async function schedulingLag() {
  try {
    return await get(OPTIONAL.lag[1], { minutes: 5 });
  } catch {
    return null; // no leader to ask: the bar shows the rest
  }
}

function draw(view, lag) {
  const leader = view.leader ?? "none";
  const facts = [
    h("span", { class: "fact serving", title: "the node that answers this page" },
      "served by ", h("b", {}, view.node_id), ` (${view.role})`),
    h("span", { class: `fact ${view.leader ? "" : "bad"}` }, "leader ", h("b", {}, leader)),
    h("span", { class: "fact" }, "term ", h("b", {}, String(view.term))),
    h("span", { class: `fact ${view.has_quorum ? "good" : "bad"}` },
      view.has_quorum ? "quorum ✓" : "no quorum"),
    h("span", { class: "fact", title: "commit index / applied index on this node" },
      "commit ", h("b", {}, String(view.commit_index)), " · applied ", h("b", {}, String(view.applied_index))),
  ];
  if (lag) facts.push(lagFact(lag));
  const nodes = view.nodes.map((n) => nodeChip(n, view));
  fill(bar, h("div", { class: "facts" }, facts), h("div", { class: "nodes" }, nodes));
}

/** "fire p99 0.2 s · start p99 1.5 s · 3 waiting": the leader's scheduling lag, by queue on
 * hover. */
function lagFact(lag) {
  const p99 = (l) => (l.p99 === null ? "—" : duration(l.p99));
  const by = lag.lease.by.map((g) => `${g.queue}/${g.priority}: start p99 ${p99(g)} (${g.count} runs)`);
  const title = [`the last ${duration(lag.window)}, as the leader ${lag.leader} saw it`, ...by,
    `misfires ever: ${lag.misfires}`].join("\n");
  const waiting = lag.due_not_leased;
  return h("span", { class: `fact lag${waiting > 0 ? " warn" : ""}`, id: "scheduling-lag", title },
    `fire p99 ${p99(lag.fire)} · start p99 ${p99(lag.lease)} · ${waiting} due, not started`);
}

/** A node's name: its id (as learnt: a follower knows only some), else its Raft address. */
function nodeName(n) {
  return n.id ?? names.get(n.raft) ?? n.raft;
}

function nodeChip(n, view) {
  if (n.id) names.set(n.raft, n.id);
  const name = nodeName(n);
  const bits = [h("b", {}, name), ` ${n.role}`];
  if (n.self) bits.push(" · this page");
  if (n.lag !== undefined && n.lag !== null) bits.push(` · lag ${n.lag}`);
  else if (!n.self) bits.push(view.role === "leader" ? " · lag ?" : "");
  // last contact: seconds since the leader heard from the node (or this follower from its
  // leader); the leader's own 0 says nothing
  const contact = n.last_contact ?? null;
  if (typeof contact === "number" && !(n.role === "leader" && contact === 0)) {
    bits.push(` · contact ${duration(contact)} ago`);
  } else if (!n.self && n.connected !== undefined && contact === null) {
    bits.push(n.connected ? " · connected" : " · unreachable");
  }
  if (n.version) bits.push(` · v${n.version}`);
  const state = n.healthy === false ? "down" : n.role;
  const title = [n.raft, n.http].filter(Boolean).join(" · ");
  return h("span", { class: `node role-${state}${n.self ? " self" : ""}`, title }, bits);
}

/** The other nodes this page knows of (from the last cluster view), with their dashboards. */
function others() {
  return (last?.nodes ?? []).filter((n) => !n.self && n.http).map((n) => ({
    name: nodeName(n),
    url: `${n.http}${location.pathname}${location.search}`,
    base: n.http,
  }));
}

/** This page on another node. A dashboard session (a short-lived `ui1.` token) goes along in
 * the fragment, which no server sees and the page there takes out of the address at once, with
 * the highest index seen; a token pasted at the login stays in this tab (never in an address):
 * the other node asks for it again. */
function handoverUrl(node) {
  const secret = token() ?? "";
  if (!secret.startsWith("ui1.")) return node.url;
  return `${node.url}#${new URLSearchParams({ "schedd-session": secret, "schedd-index": String(seen()) })}`;
}

let moving = false;

/** Ask the other nodes, one after the other, whether they serve the dashboard; go to the first
 * that does, once. A cross-origin request without CORS cannot be read, but it resolves when
 * the node answered and fails when it is unreachable, which is what is asked. */
async function moveToAnother() {
  if (moving) return;
  moving = true;
  for (const node of others()) {
    try {
      await fetch(`${node.base}/ui/`, { mode: "no-cors", cache: "no-store", signal: AbortSignal.timeout(PROBE_MS) });
    } catch {
      continue; // that one is gone too
    }
    clearInterval(countdown); // no more tries here: the page goes
    countdown = null;
    fill(banner, `This node cannot be reached. Moving to ${node.name}…`);
    location.assign(handoverUrl(node));
    return; // (moving stays set: the page is leaving)
  }
  moving = false;
}

function showBanner(text, seconds, elsewhere = []) {
  banner.hidden = false;
  let left = Math.max(1, Math.round(seconds));
  const links = elsewhere.length
    ? [" Other nodes: ", ...elsewhere.flatMap((n, i) => [i ? ", " : "", h("a", { href: handoverUrl(n), class: "other-node" }, n.name)]), "."]
    : [];
  const paint = () => fill(banner, text, ...links, " ", h("span", { class: "countdown" }, `Retrying in ${left} s.`));
  paint();
  clearInterval(countdown);
  countdown = setInterval(() => {
    left -= 1;
    if (left <= 0) {
      clearInterval(countdown);
      countdown = null;
      refresh();
    } else paint();
  }, 1000);
}

function hideBanner() {
  clearInterval(countdown);
  countdown = null;
  banner.hidden = true;
}

/** A notice at the top of the page, until dismissed (or a minute passes). */
export function notice(text, kind = "info") {
  const close = h("button", { type: "button", class: "link", "aria-label": "dismiss" }, "×");
  const el = h("div", { class: `notice ${kind}`, role: "status" }, h("span", {}, text), close);
  close.addEventListener("click", () => el.remove());
  notices.appendChild(el);
  setTimeout(() => el.remove(), kind === "error" ? 15000 : 60000);
  return el;
}

export function current() {
  return last;
}
