// The dashboard's only way to the cluster: the public HTTP API of the node that served the page,
// with the pasted bearer token. What the API offers (and so what the screens show) is read from
// its own OpenAPI document: an endpoint the node does not have yet is simply not used.

import { savedIndex, saveIndex, token } from "./settings.js";

export const API = "/api/v1";

/** The roles each action of the OpenAPI document (x-required-role) allows. */
const ACTIONS = {
  read: ["admin", "submit", "read", "worker"],
  submit: ["admin", "submit"],
  admin: ["admin"],
  worker: ["admin", "worker"],
};

/** Endpoints the dashboard uses when the node has them (and does without otherwise). */
export const OPTIONAL = {
  events: ["get", `${API}/events`],
  whoami: ["get", `${API}/whoami`],
  lag: ["get", `${API}/scheduling-lag`],
  dlqReplay: ["post", `${API}/dlq/replay`],
  dlqDrop: ["post", `${API}/dlq/drop`],
  drain: ["post", `${API}/workers/{worker_id}/drain`],
  members: ["get", `${API}/cluster/nodes`],
  addMember: ["post", `${API}/cluster/nodes`],
  removeMember: ["delete", `${API}/cluster/nodes/{node}`],
};

export class ApiError extends Error {
  constructor(status, code, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

const listeners = { unauthenticated: [], unavailable: [] };

export function on(event, fn) {
  listeners[event].push(fn);
}

function emit(event, detail) {
  for (const fn of listeners[event]) fn(detail);
}

export function headers(extra = {}) {
  const secret = token();
  return secret ? { Authorization: `Bearer ${secret}`, ...extra } : extra;
}

/** A query string from an object, leaving out empty values. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params ?? {})) {
    if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

// The highest X-Schedd-Index an answer carried (kept for the tab's session): every read asks
// for at least it (X-Schedd-Min-Index), so the dashboard shows what it wrote, and never goes
// back in time, whichever node answers.
/** The highest Raft index this tab has seen. */
export const seen = savedIndex;

/** Note a Raft index this tab has seen (an answer's X-Schedd-Index, an event's id). */
export function sawIndex(value) {
  const n = Number(value);
  if (Number.isSafeInteger(n) && n > savedIndex()) saveIndex(n);
}

/** Call the API: the answer's JSON (null for 204); an ApiError for any error answer. */
export async function call(method, path, { params = null, body = undefined, signal } = {}) {
  const init = { method, headers: headers({ Accept: "application/json" }), signal, cache: "no-store" };
  const index = savedIndex();
  if (method === "GET" && index > 0) init.headers["X-Schedd-Min-Index"] = String(index);
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
    // the same id again is the same write: a retry after a lost answer is not applied twice
    init.headers["X-Request-Id"] = requestId();
  }
  let response;
  try {
    response = await fetch(path + query(params), init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    const error = new ApiError(0, "unreachable", "this node cannot be reached", 3);
    emit("unavailable", error);
    throw error;
  }
  sawIndex(response.headers.get("X-Schedd-Index"));
  if (response.status === 204) return null;
  let doc = null;
  try {
    doc = await response.json();
  } catch {
    doc = null;
  }
  if (!response.ok) {
    const detail = doc?.error ?? {};
    const retry = Number(response.headers.get("Retry-After")) || null;
    const error = new ApiError(
      response.status,
      detail.code ?? "error",
      detail.message ?? `${method} ${path}: HTTP ${response.status}`,
      retry,
    );
    if (response.status === 401) emit("unauthenticated", error);
    if (response.status === 503) emit("unavailable", error);
    throw error;
  }
  return doc;
}

export const get = (path, params, signal) => call("GET", path, { params, signal });

function requestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return "ui-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export const enc = encodeURIComponent;

/** A path template of the API document with its parameters filled in (encoded). */
export function fillPath(template, values) {
  return template.replace(/\{(\w+)\}/g, (_, name) => enc(values[name]));
}

// -- what this node offers, and what this token may do ----------------------------------------

/** What the session knows: the API document, the token's role and name. */
export const session = { doc: null, role: null, name: null, operations: null };

/** The operation ``method path`` of the API document, or null when the node has none. */
export function operation(method, path) {
  return session.doc?.paths?.[path]?.[method] ?? null;
}

/** Whether the node has the optional endpoint ``key`` of OPTIONAL (or its path). */
export function has(key) {
  const [method, path] = OPTIONAL[key] ?? Object.values(OPTIONAL).find(([, p]) => p === key);
  return operation(method, path) !== null;
}

/** The names of the query parameters ``method path`` takes (refs resolved). */
export function queryParams(method, path) {
  const op = operation(method, path);
  const out = new Set();
  for (const p of op?.parameters ?? []) {
    const param = p.$ref ? resolve(p.$ref) : p;
    if (param?.in === "query") out.add(param.name);
  }
  return out;
}

/** The property names of the JSON body ``method path`` takes (refs resolved). */
export function bodyFields(method, path) {
  const op = operation(method, path);
  let schema = op?.requestBody?.content?.["application/json"]?.schema;
  if (schema?.$ref) schema = resolve(schema.$ref);
  return new Set(Object.keys(schema?.properties ?? {}));
}

function resolve(ref) {
  let node = session.doc;
  for (const part of ref.replace(/^#\//, "").split("/")) node = node?.[part.replace("~1", "/")];
  return node;
}

/** Whether this token may call ``method path``: one of the operations GET /whoami lists (on a
 * node without it: the operation's x-required-role against the role found at login). */
export function can(method, path) {
  const op = operation(method, path);
  if (op === null) return false;
  if (session.operations !== null) return session.operations.includes(op.operationId);
  const action = op["x-required-role"];
  if (action === undefined) return true;
  return session.role !== null && (ACTIONS[action] ?? []).includes(session.role);
}

/**
 * Log in: read the API document (any valid token may) and learn what the token may do: from
 * GET /whoami where the node has it; else (an older node) by asking with requests that change
 * nothing (an empty batch: 403 without the submit role, 400 with it).
 */
export async function login() {
  session.doc = await get(`${API}/openapi.json`);
  if (has("whoami")) {
    const me = await get(`${API}/whoami`);
    session.role = me.role ?? null;
    session.name = me.name ?? null;
    session.operations = Array.isArray(me.operations) ? me.operations : null;
    return session;
  }
  session.role = (await refused("POST", `${API}/jobs/batch`, { jobs: [] }))
    ? (await refused("GET", `${API}/workers/connect`)) ? "read" : "worker"
    : "submit";
  session.name = null;
  session.operations = null;
  return session;
}

/** Exchange the one-time code of a ``schedctl ui`` link for a session token (no token
 * needed: the code is the credential, good once). */
export async function exchangeCode(code) {
  const answer = await call("POST", `${API}/login`, { body: { code } });
  return answer.token;
}

/** Whether the API refuses ``method path`` to this token (403), rather than for the request. */
async function refused(method, path, body) {
  try {
    await call(method, path, { body });
    return false;
  } catch (err) {
    if (!(err instanceof ApiError) || err.status === 401) throw err;
    return err.status === 403;
  }
}
