// What the viewer chose: the time zone to read instants in (localStorage: kept across visits)
// and the API token (sessionStorage: gone when the tab closes; never a cookie, never the URL).

import { browserZone, isZone } from "./fmt.js";

const ZONE_KEY = "schedd.viewerZone";
const TOKEN_KEY = "schedd.token";

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
  else sessionStorage.removeItem(TOKEN_KEY);
}
