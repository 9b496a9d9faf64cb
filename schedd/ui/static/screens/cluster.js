// Cluster: the members as the node serving the page applied them (GET /cluster/nodes): each
// one's id, Raft address, API, role (voter or learner, the leader marked), whether that node
// is connected to it, its lag where that node leads, the quorum, and the addresses removed.
// An admin adds a node (a learner: the leader makes it a voter once it has caught up) and
// removes one, after a confirmation that names it. A membership change is a "cluster" event:
// the screen follows it, and asks again every few seconds for the lags.

import { OPTIONAL, call, can, fillPath, get, has } from "../api.js";
import { notice } from "../clusterbar.js";
import { fill, h } from "../dom.js";
import { failed } from "../widgets.js";

export function clusterScreen(main) {
  const about = h("span", { class: "muted", id: "members-about" });
  const quorum = h("p", { class: "quorum", id: "members-quorum" });
  const table = h("div", { id: "members" }, h("p", { class: "muted" }, "Loading…"));
  const removed = h("div", { id: "members-removed" });
  const dialog = h("dialog", { id: "remove-dialog", class: "confirm", "aria-labelledby": "remove-title" });
  const adding = has("addMember") && can(...OPTIONAL.addMember);
  const removing = has("removeMember") && can(...OPTIONAL.removeMember);
  let alive = true;
  let asking = false;
  let again = false;
  let view = null;

  async function load() {
    if (!has("members")) {
      fill(table, h("p", { class: "empty" },
        "This node does not list its members (it runs a schedd without membership changes): upgrade ",
        "it, or open the dashboard of a node that does. The cluster bar above shows what it knows of the nodes."));
      return;
    }
    if (asking) {
      again = true; // asked for while an answer is on its way (after a change): once more then
      return;
    }
    asking = true;
    try {
      view = await get(OPTIONAL.members[1]);
    } catch (err) {
      if (alive) failed(table, err);
      return;
    } finally {
      asking = false;
      if (again && alive) {
        again = false;
        load();
      }
    }
    if (!alive) return;
    draw();
  }

  function draw() {
    const self = view.nodes.find((n) => n.self);
    const leader = view.nodes.find((n) => n.leader);
    const leads = Boolean(self?.leader);
    fill(about, `as ${self ? nameOf(self) : "this node"} applied it`,
      view.cluster ? ` (cluster ${view.cluster})` : "",
      leads ? "" : leaderLink(leader));
    fill(quorum, quorumLine(view));
    fill(table, membersTable(view, leads, removing ? confirmRemove : null));
    fill(removed, view.removed.length
      ? [h("h2", {}, "Removed"),
        h("p", { class: "muted" }, "Refused if they come back with their data (empty a node's data directory to add it again)."),
        h("ul", { class: "removed" }, view.removed.map((raft) => h("li", { class: "mono", "data-raft": raft }, raft)))]
      : []);
  }

  /** The confirmation of a removal: what happens to that node, and to the cluster. */
  function confirmRemove(member) {
    const name = nameOf(member);
    const named = member.id ? `${name} (${member.raft})` : name; // its address, once
    const voters = view.nodes.filter((n) => n.role === "voter").length;
    const what = [];
    if (member.role === "learner") {
      what.push(h("p", {}, `${name} is a learner: this calls its addition off. If it runs, it is told so and stops, `,
        "and it is refused if it comes back with its data."));
    } else {
      const left = voters - 1;
      what.push(h("p", {}, `${name} stops being a voter: ${left} voter${left === 1 ? " remains" : "s remain"}, `,
        `and a majority becomes ${Math.floor(left / 2) + 1}. `,
        "The removed node is told so and stops, and it is refused if it comes back with its data."));
      if (member.leader) {
        what.push(h("p", { class: "warn", id: "remove-leader" }, `${name} leads the cluster: it hands its leadership `,
          "over to another voter first, and the new leader removes it (writes wait for a moment)."));
      }
    }
    if (member.self) {
      what.push(h("p", { class: "warn" }, `${name} serves this page: once it stops, open another node's dashboard.`));
    }
    const message = h("p", { class: "error", role: "alert", id: "remove-message" });
    const cancel = h("button", { type: "button", id: "remove-cancel" }, "Cancel");
    const go = h("button", { type: "button", class: "armed", id: "remove-confirm" }, `Remove ${name}`);
    cancel.addEventListener("click", () => dialog.close());
    go.addEventListener("click", async () => {
      go.disabled = true;
      cancel.disabled = true;
      fill(message, member.leader ? "Handing leadership over, then removing…" : "Removing…");
      message.classList.remove("error");
      try {
        // by its Raft address: every member has one (a learner's id may not be known yet)
        await call("DELETE", fillPath(OPTIONAL.removeMember[1], { node: member.raft }));
      } catch (err) {
        message.classList.add("error");
        fill(message, refusal("Not removed", err));
        go.disabled = false;
        cancel.disabled = false;
        return;
      }
      dialog.close();
      notice(`${named} removed`);
      await load();
    });
    fill(dialog,
      h("h2", { id: "remove-title" }, `Remove ${named} from the cluster?`),
      what, message,
      h("div", { class: "dialog-actions" }, cancel, go));
    dialog.showModal();
    cancel.focus();
  }

  fill(main,
    h("div", { class: "screen-head" }, h("h1", {}, "Cluster"), about),
    quorum, table, adding ? addForm(load) : null, removed, dialog);
  load();
  // a change of the membership is a "cluster" event; the lags move without one: asked again
  // every few seconds as well, and not while hidden
  return {
    refresh: load,
    poll: true,
    relevant: (type) => type === "cluster",
    destroy() {
      alive = false;
      if (dialog.open) dialog.close();
    },
  };
}

/** A member's name: its node id, or its Raft address while its id is not known. */
function nameOf(member) {
  return member.id ?? member.raft;
}

/** "3 voters, a majority is 2; membership from the log at index 1665". */
function quorumLine(view) {
  const voters = view.nodes.filter((n) => n.role === "voter").length;
  const learners = view.nodes.length - voters;
  const source = view.source === "log"
    ? `membership from the log${view.index ? ` at index ${view.index}` : ""}`
    : "membership from raft.peers (no change made yet)";
  return [
    h("b", {}, `${voters} voter${voters === 1 ? "" : "s"}, a majority is ${view.quorum}`),
    learners ? `; ${learners} learner${learners === 1 ? "" : "s"}, which do${learners === 1 ? "es" : ""} not count` : "",
    `; ${source}`,
  ];
}

function leaderLink(leader) {
  if (!leader) return "; no leader is known: the lags are the leader's";
  if (!/^https?:\/\//i.test(leader.http ?? "")) return `; the lags are known by the leader, ${nameOf(leader)}`;
  return [`; the lags are known by the leader: `,
    h("a", { href: `${leader.http.replace(/\/+$/, "")}/ui/cluster`, id: "leader-link" }, `${nameOf(leader)}'s dashboard`)];
}

function membersTable(view, leads, onRemove) {
  const heads = ["Node", "Raft address", "API", "Role", "Connected", "Lag", onRemove ? "" : null].filter((t) => t !== null);
  const order = (n) => (n.leader ? 0 : n.role === "voter" ? 1 : 2);
  const nodes = [...view.nodes].sort((a, b) => order(a) - order(b));
  return h("table", { class: "members", id: "members-table" },
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))),
    h("tbody", {}, nodes.map((n) => h("tr", {
      "data-raft": n.raft, "data-node": nameOf(n), "data-role": n.role, class: n.leader ? "leader" : null,
    },
    h("td", {}, n.id === null
      ? h("span", { class: "muted", title: "a learner added by address says its id when it connects" }, "id not known yet")
      : h("b", {}, n.id)),
    h("td", { class: "mono" }, n.raft),
    h("td", { class: "mono" }, n.http ?? h("span", { class: "muted" }, "—")),
    h("td", { class: "role" },
      h("span", { class: `badge member-${n.role}` }, n.role),
      n.leader ? [" ", h("span", { class: "badge member-leader" }, "leader")] : null,
      n.self ? h("span", { class: "muted" }, " · this page") : null),
    h("td", { class: "connected" }, connected(n)),
    h("td", { class: "lag" }, lagOf(n, leads)),
    onRemove ? h("td", { class: "actions" },
      h("button", { type: "button", class: "danger", on: { click: () => onRemove(n) } }, "Remove")) : null))));
}

function connected(n) {
  if (n.self) return h("span", { class: "muted" }, "(it answers)");
  return n.connected ? h("span", { class: "good" }, "yes") : h("span", { class: "bad" }, "no");
}

/** Entries behind the commit index, where the answering node leads; a learner catching up. */
function lagOf(n, leads) {
  if (!leads) return h("span", { class: "muted", title: "known by the leader" }, "—");
  const title = n.match_index === null || n.match_index === undefined ? null : `match index ${n.match_index}`;
  if (n.role === "learner") {
    if (n.lag === null || n.lag === undefined || !n.connected) {
      return h("span", { class: "catching-up" }, "catching up: not connected yet");
    }
    return h("span", { class: "catching-up", title },
      `catching up: ${n.lag} entr${n.lag === 1 ? "y" : "ies"} behind`);
  }
  if (n.lag === null || n.lag === undefined) return h("span", { class: "muted" }, "?");
  return h("span", { title }, String(n.lag));
}

/** The form that adds a node: its Raft address, and optionally its id and API URL. */
function addForm(refresh) {
  const field = (name, label, attrs) => h("label", { for: `add-${name}` }, label,
    h("input", { name, id: `add-${name}`, autocomplete: "off", spellcheck: "false", ...attrs }));
  const message = h("p", { id: "add-message", class: "form-message", role: "status" });
  const button = h("button", { type: "submit", class: "primary" }, "Add node");
  const form = h("form", { class: "add-node", id: "add-node" },
    h("h2", {}, "Add node"),
    h("p", { class: "muted" },
      "It joins as a learner: it is sent the log and the state, and the leader makes it a voter once it has ",
      "caught up. Start it with raft.peers naming this cluster's nodes (before or after adding it), or start an ",
      "empty node with raft.join instead."),
    h("div", { class: "fields" },
      field("raft", "Raft address", { required: true, placeholder: "host:port (its raft.listen)" }),
      field("id", "Node id (optional)", { placeholder: "its node.id" }),
      field("http", "API URL (optional)", { placeholder: "its http address" }),
      button),
    message);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = {};
    for (const name of ["raft", "id", "http"]) {
      const v = form.elements[name].value.trim();
      if (v) body[name] = v;
    }
    button.disabled = true;
    message.classList.remove("error");
    message.setAttribute("role", "status");
    fill(message, "Adding…");
    try {
      await call(OPTIONAL.addMember[0].toUpperCase(), OPTIONAL.addMember[1], { body });
      fill(message, `${body.raft} added as a learner: it becomes a voter once it has caught up.`);
      form.reset();
    } catch (err) {
      message.classList.add("error");
      message.setAttribute("role", "alert");
      fill(message, refusal("Not added", err));
    } finally {
      button.disabled = false;
    }
    await refresh();
  });
  return form;
}

/** "Not added (409): <the server's message>". */
function refusal(what, err) {
  return err.status ? `${what} (${err.status}): ${err.message}` : `${what}: ${err.message}`;
}
