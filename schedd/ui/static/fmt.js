// Pure formatting: instants in a time zone, ages, durations and cron expressions in words.
// No DOM, no network: the browser tests import this module on its own.
//
// Fire times are never computed here: the API's explain answers them. This module only says
// how a given instant reads in a zone (Intl does the zone rules, offsets included).

const formatters = new Map();

function formatter(zone) {
  let f = formatters.get(zone);
  if (f === undefined) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: zone,
      year: "numeric",
      month: "2-digit",
      day: "2-digit",
      hour: "2-digit",
      minute: "2-digit",
      second: "2-digit",
      hourCycle: "h23",
      weekday: "short",
      timeZoneName: "shortOffset",
    });
    formatters.set(zone, f);
  }
  return f;
}

/** The parts of ``instant`` (a Date, ms or an RFC 3339 string) in ``zone``. */
export function partsIn(instant, zone) {
  const date = toDate(instant);
  const parts = {};
  for (const p of formatter(zone).formatToParts(date)) parts[p.type] = p.value;
  return {
    date: `${parts.year}-${parts.month}-${parts.day}`,
    time: `${parts.hour}:${parts.minute}`,
    seconds: parts.second,
    weekday: parts.weekday,
    offset: parts.timeZoneName === "GMT+0" ? "GMT" : parts.timeZoneName, // "GMT+2", "GMT-4", "GMT"
  };
}

/** "2026-07-01 03:30:15 GMT+2" (``seconds: false``: "03:30"; ``ms``: "03:30:15.042"). The
 * offset is always shown, so the hour a DST change repeats reads twice with its two offsets
 * ("01:30:00 GMT-4", "01:30:00 GMT-5"). Seconds are the default: two events of one minute
 * (an every-10s job's fires) must not read alike. */
export function formatIn(instant, zone, { seconds = true, date = true, ms = false } = {}) {
  const p = partsIn(instant, zone);
  let time = seconds || ms ? `${p.time}:${p.seconds}` : p.time;
  if (ms) time += `.${String(toDate(instant).getUTCMilliseconds()).padStart(3, "0")}`;
  return `${date ? p.date + " " : ""}${time} ${p.offset}`;
}

/** The instant as the API writes it, in UTC: "2026-07-01T01:30:00.000Z". */
export function utc(instant) {
  return toDate(instant).toISOString();
}

export function toDate(instant) {
  if (instant instanceof Date) return instant;
  return new Date(instant);
}

/** Whether ``zone`` is a time zone this browser knows. */
export function isZone(zone) {
  try {
    formatter(zone);
    return true;
  } catch {
    return false;
  }
}

/** The viewer's own zone as the browser reports it. */
export function browserZone() {
  return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
}

/** "in 5 m", "3 h ago", "now": how far ``instant`` is from ``now`` (ms), roughly. */
export function relative(instant, now = Date.now()) {
  const ms = toDate(instant).getTime() - now;
  const s = Math.abs(ms) / 1000;
  if (s < 1.5) return "now";
  const span = shortSpan(s);
  return ms > 0 ? `in ${span}` : `${span} ago`;
}

/** A span of seconds in its largest unit: "42 s", "5 m", "3 h", "2 d". */
export function shortSpan(s) {
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} m`;
  if (s < 86400) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

/** A duration of seconds as people write it: "90 ms", "1.5 s", "1 h 30 m", "2 d". */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${+seconds.toFixed(1)} s`;
  const units = [
    ["d", 86400],
    ["h", 3600],
    ["m", 60],
    ["s", 1],
  ];
  const out = [];
  let left = Math.round(seconds);
  for (const [name, size] of units) {
    if (left >= size) {
      out.push(`${Math.floor(left / size)} ${name}`);
      left %= size;
    }
    if (out.length === 2) break;
  }
  return out.join(" ");
}

// -- cron in words --------------------------------------------------------------------------

const MONTHS = [
  "January", "February", "March", "April", "May", "June",
  "July", "August", "September", "October", "November", "December",
];
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const ORDINALS = ["", "first", "second", "third", "fourth", "fifth"];
const ALIASES = {
  "@yearly": "0 0 1 1 *",
  "@annually": "0 0 1 1 *",
  "@monthly": "0 0 1 * *",
  "@weekly": "0 0 * * 0",
  "@daily": "0 0 * * *",
  "@midnight": "0 0 * * *",
  "@hourly": "0 * * * *",
};

function nameIndex(value, names) {
  const i = names.findIndex((n) => n.slice(0, 3).toLowerCase() === value.toLowerCase());
  return i < 0 ? null : i;
}

function fieldValue(raw, names, base) {
  if (/^\d+$/.test(raw)) return Number(raw);
  const i = names ? nameIndex(raw, names) : null;
  return i === null ? null : i + base;
}

function pad(n) {
  return String(n).padStart(2, "0");
}

// One item of a list field ("1-5", "*/15", "MON", "5#2", "L") in words, or null.
function itemWords(item, kind) {
  const names = kind === "month" ? MONTHS : kind === "dow" ? DAYS : null;
  const base = kind === "month" ? 1 : 0;
  const label = (v) => {
    if (kind === "month") return MONTHS[v - 1];
    if (kind === "dow") return DAYS[v % 7];
    return String(v);
  };
  let m = /^(\*|[^/]+)\/(\d+)$/.exec(item);
  if (m) {
    const range = m[1] === "*" ? "" : ` from ${itemWords(m[1], kind)}`;
    return `every ${m[2]}${range}`;
  }
  if (kind === "dow" && (m = /^(\w+)#(\d)$/.exec(item))) {
    const v = fieldValue(m[1], names, base);
    return v === null ? null : `the ${ORDINALS[Number(m[2])]} ${label(v)} of the month`;
  }
  if (kind === "dow" && (m = /^(\w+)L$/i.exec(item))) {
    const v = fieldValue(m[1], names, base);
    return v === null ? null : `the last ${label(v)} of the month`;
  }
  if (kind === "dom" && item.toUpperCase() === "L") return "the last day";
  if ((m = /^(\w+)-(\w+)$/.exec(item))) {
    const a = fieldValue(m[1], names, base);
    const b = fieldValue(m[2], names, base);
    return a === null || b === null ? null : `${label(a)} to ${label(b)}`;
  }
  const v = fieldValue(item, names, base);
  return v === null ? null : label(v);
}

function listWords(field, kind) {
  const words = field.split(",").map((item) => itemWords(item, kind));
  return words.includes(null) ? null : words.join(", ");
}

function isPlainNumber(field) {
  return /^\d+$/.test(field);
}

/**
 * A cron expression in plain words, or null when this renderer cannot say it (the caller then
 * shows the expression alone). "0 2 * * *" → "at 02:00 every day"; "*\/15 * * * *" → "every 15
 * minutes"; "30 2 * * 1-5" → "at 02:30 on Monday to Friday". Both day fields restricted match
 * either ("on day 1 of the month or on Monday"), as the scheduler does.
 */
export function describeCron(expr) {
  let text = String(expr).trim().split(/\s+/).join(" ");
  if (text.startsWith("@")) text = ALIASES[text.toLowerCase()] ?? "";
  const fields = text.split(" ");
  if (fields.length !== 5 && fields.length !== 6) return null;
  const [min, hour, dom, month, dow, sec] = fields;
  const parts = [];
  // the time of day
  if (isPlainNumber(min) && isPlainNumber(hour)) {
    const s = sec !== undefined && isPlainNumber(sec) && Number(sec) !== 0 ? `:${pad(sec)}` : "";
    parts.push(`at ${pad(hour)}:${pad(min)}${s}`);
  } else {
    if (min === "*") parts.push("every minute");
    else if (/^\*\/\d+$/.test(min)) parts.push(`every ${min.slice(2)} minutes`);
    else {
      const w = listWords(min, "minute");
      if (w === null) return null;
      parts.push(`at minute ${w}`);
    }
    if (hour !== "*") {
      if (/^\*\/\d+$/.test(hour)) parts.push(`of every ${hour.slice(2)} hours`);
      else {
        const w = listWords(hour, "hour");
        if (w === null) return null;
        parts.push(`past hour ${w}`);
      }
    } else if (min !== "*" && !/^\*\//.test(min)) parts.push("of every hour");
  }
  if (sec !== undefined && !isPlainNumber(sec)) {
    const w = sec === "*" ? "every second" : listWords(sec, "second");
    if (w === null) return null;
    parts.push(sec === "*" ? "every second" : `at second ${w}`);
  }
  // the days
  const days = [];
  if (dom !== "*" && dom !== "?") {
    const w = listWords(dom, "dom");
    if (w === null) return null;
    days.push(dom.toUpperCase() === "L" ? "on the last day of the month" : `on day ${w} of the month`);
  }
  if (dow !== "*" && dow !== "?") {
    const w = listWords(dow, "dow");
    if (w === null) return null;
    days.push(`on ${w}`);
  }
  if (days.length === 0 && month === "*" && parts.length && parts[0].startsWith("at ")) {
    if (!parts.some((p) => p.startsWith("past") || p.startsWith("of every"))) days.push("every day");
  }
  parts.push(days.join(" or "));
  if (month !== "*") {
    const w = listWords(month, "month");
    if (w === null) return null;
    parts.push(`in ${w}`);
  }
  return parts.filter(Boolean).join(" ");
}

/** A job's schedule in words: "at 02:30 every day (Europe/Berlin)", "every 5 m", "once". */
export function describeSchedule(schedule) {
  if (schedule === null || schedule === undefined) return "once, at once";
  if (schedule.cron !== undefined) {
    const words = describeCron(schedule.cron);
    return `${words ?? "cron " + schedule.cron} (${schedule.timezone})`;
  }
  if (schedule.every !== undefined) return `every ${duration(schedule.every)}`;
  if (schedule.in !== undefined) return `once, ${duration(schedule.in)} after submit`;
  if (schedule.at !== undefined) return "once";
  return "—";
}

/** The zone a job's times are read in: its schedule's, else UTC. */
export function jobZone(job) {
  return job?.schedule?.timezone ?? "UTC";
}
