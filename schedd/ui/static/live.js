// Live updates: the node's server-sent events (GET /events, where it has them) read with fetch streaming
// (EventSource cannot send the Authorization header), resumed from the last event id; a poll
// every few seconds where the node has no events endpoint. Nothing runs while the page is hidden.

import { ApiError, OPTIONAL, has, headers, sawIndex } from "./api.js";

export const POLL_MS = 4000;
const RECONNECT_MS = [500, 1000, 2000, 5000];

let subscribers = [];
let controller = null;
let pollTimer = null;
let lastEventId = null;
let failures = 0;
let started = false;

/** ``fn(kind)`` on every change: kind is "event" (with the event), "poll" or "reset". */
export function subscribe(fn) {
  subscribers.push(fn);
  return () => {
    subscribers = subscribers.filter((s) => s !== fn);
  };
}

function notify(kind, event = null) {
  for (const fn of subscribers) fn(kind, event);
}

export const status = { mode: "off", lastEventId: null, error: null };

function setMode(mode) {
  status.mode = mode;
  document.body.dataset.live = mode; // what the page does now: live, polling, paused, …
}

export function start() {
  if (started) return;
  started = true;
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) pause();
    else resume();
  });
  if (!document.hidden) resume();
}

export function stop() {
  started = false;
  pause();
  lastEventId = null;
}

function pause() {
  controller?.abort();
  controller = null;
  clearTimeout(pollTimer);
  pollTimer = null;
  setMode("paused");
}

function resume() {
  if (!started) return;
  notify("poll"); // catch up on what happened while hidden
  if (has("events")) stream();
  else poll();
}

function poll() {
  setMode("polling");
  clearTimeout(pollTimer);
  pollTimer = setTimeout(() => {
    if (!started || document.hidden) return;
    notify("poll");
    poll();
  }, POLL_MS);
}

async function stream() {
  controller?.abort();
  const mine = new AbortController();
  controller = mine;
  setMode("live");
  const extra = { Accept: "text/event-stream" };
  if (lastEventId !== null) extra["Last-Event-ID"] = lastEventId;
  try {
    const response = await fetch(OPTIONAL.events[1], {
      headers: headers(extra),
      signal: mine.signal,
      cache: "no-store",
    });
    if (!response.ok || !response.body) {
      throw new ApiError(response.status, "events", `events: HTTP ${response.status}`);
    }
    failures = 0;
    status.error = null;
    await read(response.body.getReader(), mine.signal);
  } catch (err) {
    if (mine.signal.aborted) return;
    status.error = String(err.message ?? err);
  }
  if (controller !== mine || !started || document.hidden) return;
  // the stream ended or failed: poll once (we may have missed something) and come back
  const wait = RECONNECT_MS[Math.min(failures++, RECONNECT_MS.length - 1)];
  setMode("reconnecting");
  notify("poll");
  setTimeout(() => {
    if (controller === mine && started && !document.hidden) stream();
  }, wait);
}

/** Parse the text/event-stream from ``reader`` and hand each event on. */
async function read(reader, signal) {
  const decoder = new TextDecoder();
  let buffer = "";
  let event = { id: null, type: "message", data: [] };
  while (!signal.aborted) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
      if (line === "") {
        if (event.data.length || event.id !== null) dispatch(event);
        event = { id: null, type: "message", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue; // a comment: the server's keep-alive
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const val = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") event.id = val;
      else if (field === "event") event.type = val;
      else if (field === "data") event.data.push(val);
    }
  }
}

function dispatch(event) {
  if (event.id !== null) {
    lastEventId = event.id;
    status.lastEventId = event.id;
    sawIndex(event.id); // an event's id is the entry it covers up to: later reads ask for it
  }
  let data = event.data.join("\n");
  try {
    data = data ? JSON.parse(data) : null;
  } catch {
    // not JSON: handed on as text
  }
  // "hello" starts a stream: nothing changed (what was missed while away came as a "poll")
  if (event.type === "hello") return;
  notify(event.type === "reset" ? "reset" : "event", { type: event.type, id: event.id, data });
}
