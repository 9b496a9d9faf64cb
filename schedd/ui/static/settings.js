// What the viewer chose: the time zone to read instants in (localStorage: kept across visits)
// and the API token (sessionStorage: gone when the tab closes; never a cookie, never the URL).

import { browserZone, isZone } from "./fmt.js";

const ZONE_KEY = "schedd.viewerZone";
const TOKEN_KEY = "schedd.token";
const INDEX_KEY = "schedd.index";

export function viewerZone() {
  const zone = localStorage.getItem(ZONE_KEY);
  return zone && isZone(zone) ? zone : browserZone();
}

export function setViewerZone(zone) {
  if (!zone || zone === browserZone()) localStorage.removeItem(ZONE_KEY);
  else localStorage.setItem(ZONE_KEY, zone);
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(INDEX_KEY); // logged out: the next login may be another cluster's
  }
}

/** The highest Raft index this tab has seen (0: none), kept for the tab's session. */
export function savedIndex() {
  return Number(sessionStorage.getItem(INDEX_KEY)) || 0;
}

export function saveIndex(value) {
  sessionStorage.setItem(INDEX_KEY, String(value));
}
