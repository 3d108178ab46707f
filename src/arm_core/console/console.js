// The operator console of arm-core: a file list with filters, a file page with
// every attempt, single and batch retry, and the exchange's status — all from /api/v1/*.
// What it offers follows the caller's access levels (GET /api/v1/whoami): a viewer sees
// everything but no retry control, an operator retries too, and a credential with
// neither level (a metrics token) is told it may not view the console.
// Plain ES module, no build step, no other origin. Data is put in the page as text
// (textContent), never as HTML. Every text it shows is in /console/messages.json, in
// English and Russian: t("key", {vars}) looks one up in the chosen language.

const POLL_MS = 2000; // statuses update without a reload
const TOKEN_KEY = "arm-core.token"; // sessionStorage: this tab only
const LANG_KEY = "arm-core.lang"; // localStorage: the language chosen with the header's switch
const LOCALES = { en: "en-GB", ru: "ru-RU" }; // dates and numbers in the chosen language
const LIVE = new Set(["queued", "published", "processing"]);

const $ = (id) => document.getElementById(id);

const state = {
  authMode: null,
  actor: null,
  level: null, // the level to show (whoami's "level")
  levels: [], // every level held (whoami's "levels")
  accessNote: null, // the 403 that showed the levels changed ({status, body}), or null
  items: [], // the list as last loaded
  nextCursor: null,
  selected: new Set(), // file ids
  answers: new Map(), // file id → {kind: "retried"|"skipped"|"error", text}
  inFlight: new Set(), // file ids being retried
  batchInFlight: false,
  listQuery: "", // the list's query string (from the hash)
  listHash: "#/",
  file: null, // the file page's document
  timer: null,
  generation: 0,
  fileId: null,
  series: null, // GET /api/v1/status/series's points, as last loaded
  seriesAt: 0, // when they were asked for (Date.now())
  seriesError: null,
};

// --- language ---------------------------------------------------------------------

const i18n = { lang: "en", messages: { en: {}, ru: {} } };

// The text of `key` in the chosen language, with {name} replaced by vars.name.
function t(key, vars = {}) {
  const text = i18n.messages[i18n.lang][key] ?? i18n.messages.en[key] ?? key;
  return text.replace(/\{(\w+)\}/g, (m, name) => (name in vars ? String(vars[name]) : m));
}

// A translation if the catalogue has one (status and error codes: explained when known).
function explain(key) {
  return key in i18n.messages[i18n.lang] ? t(key) : null;
}

// What an error code means for this job: TIMEOUT is the core's word when the job timed
// out (status timeout), and a service's own when it answered error with it.
function explainCode(code, status) {
  return explain(code === "TIMEOUT" && status === "error" ? "code.TIMEOUT.sent" : `code.${code}`);
}

function locale() {
  return LOCALES[i18n.lang];
}

function num(n) {
  return typeof n === "number" ? n.toLocaleString(locale()) : String(n);
}

// The language: the one chosen with the switch (remembered), else the browser's first
// Russian or English one, else English.
function initialLang() {
  const stored = localStorage.getItem(LANG_KEY);
  if (stored in LOCALES) return stored;
  for (const tag of navigator.languages || [navigator.language || ""]) {
    const lower = String(tag).toLowerCase();
    if (lower.startsWith("ru")) return "ru";
    if (lower.startsWith("en")) return "en";
  }
  return "en";
}

async function loadMessages() {
  const resp = await fetch("/console/messages.json", { cache: "no-cache", credentials: "same-origin" });
  if (!resp.ok) throw new Error(`/console/messages.json: HTTP ${resp.status}`);
  i18n.messages = await resp.json();
}

// The page's own texts (data-i18n*), the switch and <html lang>.
function applyStatic() {
  document.documentElement.lang = i18n.lang;
  for (const el of document.querySelectorAll("[data-i18n]")) el.textContent = t(el.dataset.i18n);
  for (const [data, attr] of [
    ["i18nTitle", "title"],
    ["i18nAriaLabel", "aria-label"],
  ]) {
    const selector = `[data-${data.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}]`;
    for (const el of document.querySelectorAll(selector)) el.setAttribute(attr, t(el.dataset[data]));
  }
  for (const button of document.querySelectorAll("#lang button")) {
    button.setAttribute("aria-pressed", String(button.dataset.lang === i18n.lang));
  }
}

// The switch: applied at once (the page's texts and the shown data), and remembered.
function setLang(lang) {
  if (!(lang in LOCALES)) return;
  i18n.lang = lang;
  localStorage.setItem(LANG_KEY, lang);
  applyStatic();
  if (state.authMode === null) return; // still starting
  if (state.actor === null) {
    if (state.authMode === "header") $("denied-text").textContent = t("auth.denied.text");
    return;
  }
  showWho();
  showAccessNote();
  if (!mayView()) {
    showForbidden();
    return;
  }
  if (state.fileId) renderList(); // the list behind the file page, shown on the way back
  refreshViews();
  tick();
}

// --- helpers ----------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function pad(n) {
  return String(n).padStart(2, "0");
}

// A timestamp in the browser's time zone and the chosen language's format, with the
// zone's offset: "30/11/2026, 08:53:25 GMT+1" (en-GB), "30.11.2026, 08:53:25 GMT+1" (ru-RU).
function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return new Intl.DateTimeFormat(locale(), {
    year: "numeric",
    month: "2-digit",
    day: "2-digit",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    hourCycle: "h23",
    timeZoneName: "shortOffset",
  }).format(d);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.round(Number(seconds));
  if (s < 60) return t("age.s", { s });
  if (s < 3600) return t("age.ms", { m: Math.floor(s / 60), s: s % 60 });
  if (s < 86400) return t("age.hm", { h: Math.floor(s / 3600), m: Math.floor((s % 3600) / 60) });
  return t("age.dh", { d: Math.floor(s / 86400), h: Math.floor((s % 86400) / 3600) });
}

// What a status code means ("dlq: given up, …"), or null.
function meaning(status, kind) {
  return explain(`${kind}status.${status}`);
}

// A status code as it is ("dlq", "UPLOADED"), its meaning in the title.
function badge(status, kind) {
  if (!status) return h("span", { class: "badge none", text: "—" });
  return h("span", {
    class: `badge ${kind} s-${status.toLowerCase()}`,
    text: status,
    title: meaning(status, kind),
  });
}

function show(id, visible) {
  $(id).hidden = !visible;
}

// --- access levels ----------------------------------------------------------------

// The console's reads need the viewer level (the operator's includes it); retries the
// operator's. The server checks every request: these only decide what the page offers.
function mayView() {
  return state.levels.includes("viewer") || state.levels.includes("operator");
}

function mayRetry() {
  return state.levels.includes("operator");
}

// A level's name in the chosen language (one this page does not know, as it is).
function levelName(level) {
  return level ? (explain(`level.${level}`) ?? level) : t("level.none");
}

// The retry controls of the page's own markup (class "operator-only"): shown to an
// operator only. Those drawn from data (a row's button, the file page's) are not drawn.
function applyLevel() {
  for (const el of document.querySelectorAll(".operator-only")) el.hidden = !mayRetry();
  if (!mayRetry()) state.selected.clear();
}

// --- the API ----------------------------------------------------------------------

class SignedOut extends Error {}

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (options.json !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.json !== undefined ? JSON.stringify(options.json) : undefined,
    cache: "no-store",
    credentials: "same-origin",
  });
  let body = null;
  try {
    body = await resp.json();
  } catch {
    body = null;
  }
  if (resp.status === 401 && !options.public) {
    signedOut(state.authMode === "token" ? t("auth.expired") : null);
    throw new SignedOut();
  }
  if (resp.status === 403 && !options.public) recheckAccess({ status: resp.status, body });
  return { status: resp.status, body };
}

// A 403 the page did not expect: the credential's levels may have changed since the
// page asked (a token re-issued at another level, a user moved to another group). Ask
// again; if they did, say so with the server's message and offer what they allow now.
let rechecking = false;

async function recheckAccess(refused) {
  if (rechecking || state.actor === null) return;
  rechecking = true;
  try {
    const me = await whoami();
    if (state.actor === null) return;
    if (me.actor === null) {
      signedOut(state.authMode === "token" ? t("auth.expired") : null);
      return;
    }
    if (me.actor === state.actor && String(me.levels) === String(state.levels)) return;
    signedIn(me);
    state.accessNote = refused;
    showAccessNote();
  } catch {
    // No answer: the request's own error is shown where it was made.
  } finally {
    rechecking = false;
  }
}

function errorText(resp) {
  const err = resp.body && resp.body.error;
  if (!err) return `HTTP ${resp.status}`;
  // The code as it is; in Russian its meaning too, then the server's (English) message.
  const meaning = i18n.lang === "en" ? null : explain(`api.${err.code}`);
  return meaning ? `${err.code}: ${meaning} (${err.message})` : `${err.code}: ${err.message}`;
}

// --- sign-in ----------------------------------------------------------------------

async function whoami() {
  const resp = await api("/api/v1/whoami", { public: true });
  if (resp.status !== 200 || !resp.body) throw new Error(errorText(resp));
  return resp.body;
}

function signedOut(message) {
  stopPolling();
  sessionStorage.removeItem(TOKEN_KEY);
  state.actor = null;
  state.level = null;
  state.levels = [];
  state.items = [];
  state.file = null;
  state.answers.clear();
  state.selected.clear();
  $("files").tBodies[0].replaceChildren();
  $("file").replaceChildren();
  $("status").replaceChildren();
  show("console", false);
  show("forbidden", false);
  show("signout", false);
  state.accessNote = null;
  showAccessNote();
  $("who").textContent = "";
  $("live").textContent = "";
  if (state.authMode === "token") {
    show("signin", true);
    $("signin-error").textContent = message || "";
    $("token").value = "";
    $("token").focus();
  } else if (state.authMode === "header") {
    show("denied", true);
    $("denied-text").textContent = t("auth.denied.text");
  }
}

// The note of a level that changed under the page: the level now, and what the server said.
function showAccessNote() {
  const refused = state.accessNote;
  $("access-note").textContent = refused
    ? t("auth.changed", { level: levelName(state.level), error: errorText(refused) })
    : "";
}

// Who is signed in and at which level: "signed in as ivanova · viewer" (the level's
// title says what it allows). AUTH_MODE=none: everyone is anonymous, with every level.
function showWho() {
  if (state.authMode === "none") {
    $("who").textContent = t("auth.none");
    return;
  }
  const level = h("span", {
    id: "level",
    class: "level",
    "data-level": state.level ?? "",
    title: state.level ? explain(`level.${state.level}.about`) : null,
    text: levelName(state.level),
  });
  $("who").replaceChildren(t("auth.as", { actor: state.actor }), " · ", level);
}

// Signed in without a level that opens the console: said, and nothing else is asked for.
function showForbidden() {
  const held = state.levels.map(levelName).join(", ");
  $("forbidden-text").textContent = held
    ? t("auth.forbidden.text", { actor: state.actor, levels: held })
    : t("auth.forbidden.none", { actor: state.actor });
  $("forbidden-hint").textContent =
    state.authMode === "token" ? t("auth.forbidden.token") : t("auth.forbidden.header");
  show("forbidden-signin", state.authMode === "token");
}

function signedIn(me) {
  state.actor = me.actor;
  state.level = me.level ?? null;
  state.levels = Array.isArray(me.levels) ? me.levels : [];
  state.accessNote = null;
  showAccessNote();
  show("signin", false);
  show("denied", false);
  showWho();
  show("signout", state.authMode === "token");
  if (!mayView()) {
    stopPolling();
    show("console", false);
    show("forbidden", true);
    showForbidden();
    return;
  }
  show("forbidden", false);
  show("console", true);
  applyLevel();
  route();
}

async function onSignIn(event) {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  $("signin-submit").disabled = true;
  try {
    sessionStorage.setItem(TOKEN_KEY, token);
    const me = await whoami();
    if (me.actor === null) {
      sessionStorage.removeItem(TOKEN_KEY);
      $("signin-error").textContent = t("auth.rejected");
      return;
    }
    $("signin-error").textContent = "";
    signedIn(me);
  } catch (err) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("signin-error").textContent = t("auth.no_answer", { message: err.message });
  } finally {
    $("signin-submit").disabled = false;
  }
}

// --- routing and polling ----------------------------------------------------------

function route() {
  if (state.actor === null || !mayView()) return;
  const hash = location.hash || "#/";
  const file = hash.match(/^#\/files\/([0-9a-fA-F-]{36})$/);
  stopPolling();
  if (file) {
    show("list-view", false);
    show("file-view", true);
    $("back").setAttribute("href", state.listHash);
    state.file = null;
    $("file").replaceChildren();
    $("file-error").textContent = "";
    state.fileId = file[1];
  } else {
    state.fileId = null;
    state.listHash = hash;
    state.listQuery = hash.includes("?") ? hash.slice(hash.indexOf("?") + 1) : "";
    fillFilters(new URLSearchParams(state.listQuery));
    state.items = [];
    state.nextCursor = null;
    show("file-view", false);
    show("list-view", true);
  }
  tick();
}

function stopPolling() {
  if (state.timer !== null) clearTimeout(state.timer);
  state.timer = null;
}

async function tick() {
  // Each tick schedules the next only if no newer tick started meanwhile (a retry or a
  // navigation ticks at once): one polling loop, never two.
  stopPolling();
  state.generation += 1;
  const generation = state.generation;
  if (document.hidden) return; // a hidden tab does not poll; visibilitychange resumes
  const work = [loadStatus(), loadSeries()];
  work.push(state.fileId ? loadFile() : loadList());
  const results = await Promise.allSettled(work);
  if (state.actor === null || !mayView() || generation !== state.generation) return; // superseded
  const failed = results.find((r) => r.status === "rejected" && !(r.reason instanceof SignedOut));
  $("live").textContent = failed
    ? t("live.stale", { message: failed.reason.message })
    : t("live.ok", { when: when(new Date().toISOString()) });
  $("live").classList.toggle("stale", Boolean(failed));
  if (state.actor !== null && generation === state.generation) {
    state.timer = setTimeout(tick, POLL_MS);
  }
}

// --- status -----------------------------------------------------------------------

const ORDER = {
  job: ["queued", "published", "processing", "done", "needs_check", "error", "timeout", "dlq"],
  file: ["UPLOADED", "PROCESSING", "ERROR"],
};

// Per-status counts in the path's order (a status this page does not know goes last).
function counts(title, map, kind) {
  const known = ORDER[kind];
  const entries = Object.entries(map || {}).sort(
    ([a], [b]) => (known.indexOf(a) + 1 || 99) - (known.indexOf(b) + 1 || 99),
  );
  return h(
    "div",
    { class: "counts" },
    h("span", { class: "label", text: title }),
    entries.length === 0 ? h("span", { class: "muted", text: t("status.none") }) : null,
    entries.map(([s, n]) =>
      h("span", { class: n ? "count" : "count zero", [`data-${kind}-status`]: s }, badge(s, kind), ` ${num(n)}`),
    ),
  );
}

function figure(label, value, warn) {
  return h(
    "div",
    { class: warn ? "figure warn" : "figure" },
    h("span", { class: "label", text: label }),
    h("span", { class: "value", text: num(value) }),
  );
}

async function loadStatus() {
  const resp = await api("/api/v1/status");
  const el = $("status");
  if (resp.status !== 200 || !resp.body) {
    el.replaceChildren(h("p", { class: "muted", text: t("status.unavailable", { error: errorText(resp) }) }));
    return;
  }
  const s = resp.body;
  $("footer").textContent = t("footer.version", { version: s.version });
  const sweep = s.last_sweep || {};
  const bridge = s.bridge;
  el.replaceChildren(
    counts(t("status.jobs"), s.jobs, "job"),
    counts(t("status.files"), s.files, "file"),
    h(
      "div",
      { class: "figures" },
      figure(t("status.oldest_queued"), age(s.oldest_queued_age_seconds), s.oldest_queued_age_seconds > 60),
      figure(t("status.unacked_overdue"), s.unacked_overdue ?? "—", s.unacked_overdue > 0),
      figure(t("status.past_deadline"), s.past_deadline_unswept ?? "—", s.past_deadline_unswept > 0),
      figure(
        t("status.last_sweep"),
        sweep.at
          ? [
              when(sweep.at),
              sweep.result != null ? t("status.sweep_result", { n: sweep.result }) : "",
              sweep.error ?? "",
            ].filter(Boolean).join(" · ")
          : t("status.never"),
        Boolean(sweep.error),
      ),
      bridge
        ? figure(
            t("status.bridge"),
            t("status.bridge_state", { nats: bridge.nats, listener: bridge.listener }),
            bridge.nats !== "ok" || bridge.listener !== "ok",
          )
        : null,
    ),
    bridges(s.bridges || [], bridge),
    pacing(s.pacing || []),
  );
}

// Each pipeline's pacing (docs/pacing.md): how many jobs its service may hold and holds,
// what waits, and whether it answers — which service is the bottleneck.
function pacing(rows) {
  const figures = rows.map((p) => {
    const parts = [
      p.in_flight_limit == null
        ? t("status.pacing_off", { in_flight: p.in_flight, queued: p.queued })
        : t("status.pacing_state", {
            limit: p.in_flight_limit,
            in_flight: p.in_flight,
            queued: p.queued,
            held: p.held_back,
          }),
      p.pinned ? t("status.pacing_pinned") : "",
      p.answering ? "" : t("status.pacing_silent", { when: p.silent_since ? when(p.silent_since) : "—" }),
    ];
    const el = figure(t("status.pacing", { pipeline: p.pipeline }), parts.filter(Boolean).join(" · "), !p.answering);
    el.dataset.pipeline = p.pipeline;
    return el;
  });
  return h("div", { class: "figures pacing" }, figures);
}

// Every bridge that says it is alive (arm.bridge_instances), but this process's own,
// shown above as it is now: what a console whose process runs no bridge has to go by.
function bridges(rows, own) {
  const others = rows.filter((b) => !own || b.name !== own.name);
  const figures = others.map((b) => {
    const loops = Object.entries(b.loops || {})
      .map(([name, state]) => `${name} ${state}`)
      .join(", ");
    const seen = age(b.seen_seconds_ago);
    const parts = [
      t("status.bridge_state", { nats: b.nats, listener: b.listener }),
      b.silent ? t("status.bridge_silent", { age: seen }) : t("status.bridge_seen", { age: seen }),
      loops ? t("status.bridge_loops", { loops }) : "",
    ];
    const warn = b.silent || b.nats !== "ok" || b.listener !== "ok" || Boolean(loops);
    const el = figure(`${b.name} (${b.version})`, parts.filter(Boolean).join(" · "), warn);
    el.dataset.bridge = b.name;
    return el;
  });
  if (!own && figures.length === 0) {
    figures.push(figure(t("status.bridges"), t("status.no_bridges"), true));
  }
  return h("div", { class: "figures bridges" }, figures);
}

// --- charts of the last hour (GET /api/v1/status/series) ----------------------------
// Drawn here as SVG, no library: one sample a minute, kept by the database (its periodic
// task sample_status); the waits are those the bridges observed (arm_job_wait_seconds).

const SERIES_MS = 10000; // a sample comes once a minute: the charts ask every 10 s
const HOUR_MS = 3600 * 1000;
const OUTCOMES = ["done", "needs_check", "error", "timeout", "dlq"];
const SVG_NS = "http://www.w3.org/2000/svg";
const CHART = { w: 210, h: 60, top: 10, bottom: 2 }; // px; the y scale's label sits in `top`

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c) el.append(c);
  return el;
}

// A point's tooltip (the browser's own, on hover).
function tip(text) {
  const title = document.createElementNS(SVG_NS, "title");
  title.textContent = text;
  return title;
}

function secs(v) {
  if (v === null || v === undefined) return "—";
  if (v < 1) return t("unit.ms", { n: Math.round(v * 1000).toLocaleString(locale()) });
  if (v < 60) return t("unit.s", { n: v.toLocaleString(locale(), { maximumFractionDigits: 1 }) });
  return age(v);
}

function clock(iso) {
  return new Intl.DateTimeFormat(locale(), { hour: "2-digit", minute: "2-digit", hourCycle: "h23" }).format(
    new Date(iso),
  );
}

function perMinute(p, outcome) {
  return p.finished && p.seconds > 0 ? (p.finished[outcome] * 60) / p.seconds : 0;
}

async function loadSeries() {
  if (Date.now() - state.seriesAt < SERIES_MS) return;
  state.seriesAt = Date.now();
  const resp = await api("/api/v1/status/series?minutes=60");
  if (resp.status === 200 && resp.body) {
    state.series = resp.body.points;
    state.seriesError = null;
  } else {
    state.seriesError = errorText(resp);
    state.seriesAt = 0; // ask again on the next tick
  }
  renderCharts();
}

// One small chart: a caption (its name, the latest figure) over an SVG of the hour, x by
// time (gaps show as gaps), y from 0 to the hour's highest value.
function chart(key, title, latest, yMax, yLabel, draw) {
  const plot = svg("g", { class: "plot" }, draw);
  return h(
    "figure",
    { class: "chart", "data-chart": key },
    h(
      "figcaption",
      {},
      h("span", { class: "label", text: title }),
      h("span", { class: "value", text: latest }),
    ),
    svg(
      "svg",
      {
        viewBox: `0 0 ${CHART.w} ${CHART.h}`,
        width: CHART.w,
        height: CHART.h,
        role: "img",
        "aria-label": `${title}: ${latest}`,
      },
      svg("line", { class: "axis", x1: 0, x2: CHART.w, y1: CHART.h - 0.5, y2: CHART.h - 0.5 }),
      svg("text", { class: "scale", x: 1, y: 8 }, document.createTextNode(yLabel)),
      plot,
    ),
  );
}

function xOf(iso, now) {
  return (CHART.w * (new Date(iso).getTime() - (now - HOUR_MS))) / HOUR_MS;
}

function yOf(v, yMax) {
  const span = CHART.h - CHART.top - CHART.bottom;
  return CHART.h - CHART.bottom - (span * v) / (yMax || 1);
}

// Lines through the points that have a value, a dot per point (with its tooltip).
function lines(points, now, yMax, series) {
  return series.map(({ cls, value, label }) => {
    const dots = points
      .filter((p) => value(p) !== null && value(p) !== undefined)
      .map((p) => [xOf(p.at, now), yOf(value(p), yMax), p]);
    return svg(
      "g",
      { class: `series ${cls}` },
      svg("polyline", { points: dots.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ") }),
      dots.map(([x, y, p]) =>
        svg("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 1.6, "data-at": p.at }, tip(`${clock(p.at)} ${label(p)}`)),
      ),
    );
  });
}

function renderCharts() {
  const el = $("charts");
  if (!el) return;
  if (state.seriesError !== null) {
    el.replaceChildren(h("p", { class: "muted", text: t("charts.unavailable", { error: state.seriesError }) }));
    return;
  }
  const points = state.series || [];
  const now = Date.now();
  const last = points[points.length - 1];
  const title = h("div", { class: "charts-title" }, h("span", { class: "label", text: t("charts.title") }));
  if (points.length < 2) {
    el.replaceChildren(title, h("p", { class: "muted", text: t("charts.none") }));
    return;
  }

  // Finished per minute, stacked by outcome.
  const totals = points.map((p) => OUTCOMES.reduce((sum, o) => sum + perMinute(p, o), 0));
  const finishedMax = Math.max(1, ...totals);
  const bars = points
    .filter((p) => p.finished && p.seconds > 0)
    .map((p) => {
      const x1 = xOf(p.at, now);
      const width = Math.max(1.5, (CHART.w * p.seconds * 1000) / HOUR_MS - 1);
      let base = 0;
      const parts = OUTCOMES.filter((o) => p.finished[o] > 0).map((o) => {
        const v = perMinute(p, o);
        const rect = svg("rect", {
          class: `o-${o}`,
          "data-outcome": o,
          "data-n": p.finished[o],
          x: (x1 - width).toFixed(1),
          width: width.toFixed(1),
          y: yOf(base + v, finishedMax).toFixed(1),
          height: (yOf(base, finishedMax) - yOf(base + v, finishedMax)).toFixed(1),
        });
        base += v;
        return rect;
      });
      const summary = OUTCOMES.filter((o) => p.finished[o] > 0)
        .map((o) => `${o} ${num(p.finished[o])}`)
        .join(", ");
      return svg("g", { class: "bar", "data-at": p.at }, parts, tip(`${clock(p.at)} ${summary || "0"}`));
    });
  const lastRate = last.finished ? Math.round(OUTCOMES.reduce((s, o) => s + perMinute(last, o), 0)) : null;
  const finished = chart(
    "finished",
    t("charts.finished"),
    lastRate === null ? "—" : t("charts.per_min", { n: num(lastRate) }),
    finishedMax,
    num(Math.round(finishedMax)),
    bars,
  );
  const legend = h(
    "div",
    { class: "legend" },
    OUTCOMES.map((o) => h("span", { class: `key status-code o-${o}`, title: meaning(o, "job"), text: o })),
  );
  finished.append(legend);

  const queuedMax = Math.max(1, ...points.map((p) => p.queued));
  const queued = chart("queued", t("charts.queued"), num(last.queued), queuedMax, num(queuedMax), [
    lines(points, now, queuedMax, [{ cls: "queued", value: (p) => p.queued, label: (p) => num(p.queued) }]),
  ]);
  const ageMax = Math.max(1, ...points.map((p) => p.oldest_queued_age_seconds));
  const oldest = chart("oldest", t("charts.oldest"), secs(last.oldest_queued_age_seconds), ageMax, secs(ageMax), [
    lines(points, now, ageMax, [
      { cls: "oldest", value: (p) => p.oldest_queued_age_seconds, label: (p) => secs(p.oldest_queued_age_seconds) },
    ]),
  ]);

  const phases = [
    ["queued", t("charts.wait.queued")],
    ["ack", t("charts.wait.ack")],
    ["processing", t("charts.wait.processing")],
  ];
  const waits = phases.map(([phase, name]) => {
    const has = points.filter((p) => p.waits && p.waits[phase]);
    const w = (p) => (p.waits && p.waits[phase]) || null;
    const yMax = Math.max(0.001, ...has.map((p) => w(p).p99));
    const newest = has[has.length - 1];
    const latest = newest ? t("charts.p50_p99", { p50: secs(w(newest).p50), p99: secs(w(newest).p99) }) : "—";
    const label = (p) => t("charts.p50_p99", { p50: secs(w(p).p50), p99: secs(w(p).p99) });
    const figure = chart(`wait-${phase}`, name, latest, yMax, secs(yMax), [
      lines(has, now, yMax, [
        { cls: "p99", value: (p) => w(p).p99, label },
        { cls: "p50", value: (p) => w(p).p50, label },
      ]),
    ]);
    figure.append(
      h(
        "div",
        { class: "legend" },
        ["p50", "p99"].map((q) => h("span", { class: `key status-code q-${q}`, text: q })),
      ),
    );
    return figure;
  });
  el.replaceChildren(title, h("div", { class: "chart-row" }, finished, queued, oldest, ...waits));
}

// --- the file list ----------------------------------------------------------------

function fillFilters(params) {
  const form = $("filters");
  for (const box of form.querySelectorAll("input[type=checkbox]")) {
    box.checked = params.getAll(box.name).includes(box.value);
  }
  for (const name of ["q", "file_type", "consolidation_id"]) {
    form.elements[name].value = params.get(name) || "";
  }
  for (const name of ["updated_after", "updated_before"]) {
    const iso = params.get(name);
    const d = iso ? new Date(iso) : null;
    form.elements[name].value =
      d && !Number.isNaN(d.getTime())
        ? `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T` +
          `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
        : "";
  }
}

function onFilter(event) {
  event.preventDefault();
  const form = $("filters");
  const params = new URLSearchParams();
  for (const box of form.querySelectorAll("input[type=checkbox]:checked")) {
    params.append(box.name, box.value);
  }
  for (const name of ["q", "file_type", "consolidation_id"]) {
    const v = form.elements[name].value.trim();
    if (v) params.set(name, v);
  }
  for (const name of ["updated_after", "updated_before"]) {
    const v = form.elements[name].value;
    if (v) params.set(name, new Date(v).toISOString()); // local time → UTC
  }
  const query = params.toString();
  location.hash = query ? `#/?${query}` : "#/";
}

async function loadList(more = false) {
  const params = new URLSearchParams(state.listQuery);
  if (more) {
    params.set("cursor", state.nextCursor);
    params.set("limit", "50");
  } else {
    // A refresh re-reads as many rows as are shown, so "load more" pages stay live.
    params.set("limit", String(Math.min(500, Math.max(50, state.items.length))));
  }
  const generation = state.generation;
  const resp = await api(`/api/v1/files?${params}`);
  if (!more && generation !== state.generation) return; // a newer read is on its way
  if (resp.status !== 200 || !resp.body) {
    $("list-error").textContent =
      resp.status === 404 || resp.status === 405
        ? t("list.no_list")
        : t("list.error", { error: errorText(resp) });
    if (resp.status >= 500) throw new Error(errorText(resp)); // keep the rows; try again
    if (!more) {
      // A refused filter (400) shows no rows that would look like its answer.
      state.items = [];
      state.nextCursor = null;
      renderList();
      show("empty", false);
    }
    return;
  }
  $("list-error").textContent = "";
  state.items = more ? state.items.concat(resp.body.items) : resp.body.items;
  state.nextCursor = resp.body.next_cursor;
  renderList();
}

function answerCell(fileId) {
  const a = state.answers.get(fileId);
  if (state.inFlight.has(fileId)) return h("span", { class: "answer pending", text: t("retry.pending") });
  if (!a) return "";
  return h("span", { class: `answer ${a.kind}`, text: a.text });
}

// A recognised file stays PROCESSING: it waits for the mapping step of another
// specification (seed 004), which is not part of this service. Said beside such a file.
function awaitingMapping(fileStatus, jobStatus) {
  if (fileStatus !== "PROCESSING" || !["done", "needs_check"].includes(jobStatus)) return null;
  return h("span", { class: "note mapping", title: t("file.awaiting_mapping_why"), text: t("file.awaiting_mapping") });
}

function renderList() {
  const rows = state.items.map((item) => {
    const job = item.current_job || {};
    const id = item.id;
    // An operator's row: a box to select it, its retry button and the retry's answer; a
    // viewer's row has none of the three (nor their columns: index.html "operator-only").
    const operator = mayRetry();
    const select =
      operator &&
      h(
        "td",
        {},
        h("input", {
          type: "checkbox",
          class: "select",
          "aria-label": t("list.select", { name: item.original_name }),
          checked: state.selected.has(id),
          onchange: (e) => {
            if (e.target.checked) state.selected.add(id);
            else state.selected.delete(id);
            renderSelection();
          },
        }),
      );
    const retry =
      operator &&
      h(
        "td",
        {},
        h("button", {
          type: "button",
          class: "retry",
          disabled: !item.retryable || state.inFlight.has(id),
          title: item.retryable ? t("retry.can") : t("retry.cannot"),
          onclick: (e) => retryOne(id, job.job_id, e.target),
          text: t("retry.button"),
        }),
      );
    return h(
      "tr",
      { "data-file-id": id, class: state.answers.has(id) ? "answered" : null },
      select,
      h("td", { class: "name" }, h("a", { href: `#/files/${id}`, text: item.original_name })),
      h("td", { text: item.file_type }),
      h("td", {}, badge(item.status, "file"), awaitingMapping(item.status, job.status)),
      h("td", {}, badge(job.status, "job")),
      h("td", { class: "attempt", text: job.attempt ? `${job.attempt} / ${job.max_attempts}` : "—" }),
      h("td", { class: "code", text: job.error_code || "", title: explainCode(job.error_code, job.status) }),
      h("td", { class: "when", text: when(item.updated_at), title: item.updated_at }),
      retry,
      operator && h("td", { class: "answer-cell" }, answerCell(id)),
    );
  });
  $("files").tBodies[0].replaceChildren(...rows);
  show("empty", state.items.length === 0);
  show("more", Boolean(state.nextCursor));
  renderSelection();
}

function renderSelection() {
  const n = state.selected.size;
  $("selection").textContent = n ? t("list.selected", { n: num(n) }) : "";
  $("retry-selected").disabled = n === 0 || state.batchInFlight;
  $("retry-selected").textContent = n ? t("list.retry_selected_n", { n: num(n) }) : t("list.retry_selected");
  const shown = state.items.map((i) => i.id);
  $("select-all").checked = shown.length > 0 && shown.every((id) => state.selected.has(id));
}

function onSelectAll(event) {
  for (const item of state.items) {
    if (event.target.checked) state.selected.add(item.id);
    else state.selected.delete(item.id);
  }
  renderList();
}

// Every shown file whose current job failed with attempts left (the list's `retryable`).
function onSelectRetryable() {
  if (!mayRetry()) return;
  state.selected.clear();
  for (const item of state.items) if (item.retryable) state.selected.add(item.id);
  renderList();
}

// --- retry ------------------------------------------------------------------------

// A refused retry in words (the 409's or the batch entry's details).
function whySkipped(details) {
  if (!details) return t("retry.skipped");
  switch (details.reason) {
    case "not_failed":
      return LIVE.has(details.current_status)
        ? t("retry.still_running", { status: details.current_status })
        : t("retry.not_failed", { status: details.current_status });
    case "attempts_exhausted":
      return t("retry.exhausted", { attempt: details.current_attempt, max: details.max_attempts });
    case "no_job":
      return t("retry.no_job");
    case "attempt_changed":
      return t("retry.attempt_changed", { attempt: details.current_attempt, status: details.current_status });
    case "archived":
      return t("retry.archived");
    default:
      return t("retry.other", { reason: details.reason });
  }
}

function singleAnswer(resp) {
  if (resp.status === 201) return { kind: "retried", text: t("retry.done", { attempt: resp.body.attempt }) };
  const err = (resp.body && resp.body.error) || {};
  if (resp.status === 409) return { kind: "skipped", text: whySkipped(err.details) };
  if (resp.status === 404) return { kind: "skipped", text: t("retry.not_found") };
  if (resp.status === 403) return { kind: "error", text: t("retry.forbidden", { error: errorText(resp) }) };
  return { kind: "error", text: t("retry.failed", { error: errorText(resp) }) };
}

function batchAnswer(entry) {
  if (entry.outcome === "retried") return { kind: "retried", text: t("retry.done", { attempt: entry.attempt }) };
  if (entry.reason === "FILE_NOT_FOUND") return { kind: "skipped", text: t("retry.not_found") };
  return { kind: "skipped", text: whySkipped(entry.details) };
}

async function retryOne(fileId, jobId, button) {
  // One click, one request: the button stays disabled until the answer is in, so a double
  // click asks once (a second ask of a live job would only be refused as still running).
  // It names the attempt shown (jobId): if the file moved on meanwhile — another click,
  // another operator, even one whose attempt already failed — the answer is "skipped".
  if (state.inFlight.has(fileId) || !mayRetry()) return;
  state.inFlight.add(fileId);
  if (button) button.disabled = true;
  refreshViews();
  try {
    const json = jobId ? { job_id: jobId } : {};
    const resp = await api(`/api/v1/files/${fileId}/retry`, { method: "POST", json });
    state.answers.set(fileId, singleAnswer(resp));
  } catch (err) {
    if (err instanceof SignedOut) return;
    state.answers.set(fileId, { kind: "error", text: t("retry.failed", { error: err.message }) });
  } finally {
    state.inFlight.delete(fileId);
  }
  refreshViews();
  tick();
}

async function retrySelected() {
  if (state.batchInFlight || state.selected.size === 0 || !mayRetry()) return;
  const ids = [...state.selected];
  state.batchInFlight = true;
  for (const id of ids) state.inFlight.add(id);
  $("batch-summary").textContent = t("batch.pending", { n: num(ids.length) });
  renderList();
  try {
    // Each file with the attempt this page shows for it (null: not on the page any more).
    const shown = new Map(state.items.map((item) => [item.id, item.current_job?.job_id]));
    const files = ids.map((id) => ({ file_id: id, job_id: shown.get(id) ?? null }));
    const resp = await api("/api/v1/files/retry", { method: "POST", json: { files } });
    if (resp.status !== 200) {
      const error = errorText(resp);
      $("batch-summary").textContent =
        resp.status === 403 ? t("batch.forbidden", { error }) : t("batch.failed", { error });
      return;
    }
    let retried = 0;
    for (const entry of resp.body.results) {
      const answer = batchAnswer(entry);
      if (answer.kind === "retried") retried += 1;
      state.answers.set(entry.file_id, answer);
    }
    const skipped = resp.body.results.length - retried;
    $("batch-summary").textContent = t("batch.summary", {
      total: num(resp.body.results.length),
      retried: num(retried),
      skipped: num(skipped),
    });
    state.selected.clear();
  } catch (err) {
    if (err instanceof SignedOut) return;
    $("batch-summary").textContent = t("batch.failed", { error: err.message });
  } finally {
    state.batchInFlight = false;
    for (const id of ids) state.inFlight.delete(id);
  }
  renderList();
  tick();
}

function refreshViews() {
  renderCharts();
  if (state.fileId) {
    if (state.file) renderFile();
  } else {
    renderList();
  }
}

// --- the file page ----------------------------------------------------------------

async function loadFile() {
  const id = state.fileId;
  const generation = state.generation;
  const resp = await api(`/api/v1/files/${id}`);
  if (id !== state.fileId || generation !== state.generation) return; // superseded
  if (resp.status !== 200 || !resp.body) {
    $("file-error").textContent =
      resp.status === 404 ? t("file.none") : t("file.error", { error: errorText(resp) });
    if (resp.status >= 500) throw new Error(errorText(resp));
    return;
  }
  $("file-error").textContent = "";
  state.file = resp.body;
  renderFile();
}

function dl(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", {}, v === null || v === undefined ? "—" : v)]),
  );
}

function event(label, at, extra) {
  return h(
    "li",
    { class: at ? "event" : "event missing" },
    h("span", { class: "event-label", text: label }),
    h("span", { class: "when", text: when(at), title: at || "" }),
    extra ? h("span", { class: "muted", text: ` ${extra}` }) : null,
  );
}

function attemptCard(job, currentId) {
  const service = job.service ? `${job.service.name}${job.service.version ? ` ${job.service.version}` : ""}` : null;
  return h(
    "li",
    { class: "attempt-card", "data-attempt": job.attempt },
    h(
      "h4",
      {},
      `${t("attempt.title", { attempt: job.attempt, max: job.max_attempts })} `,
      badge(job.status, "job"),
      job.job_id === currentId ? h("span", { class: "tag", text: t("attempt.current") }) : null,
    ),
    h(
      "ol",
      { class: "timeline" },
      event(t("attempt.requested"), job.requested_at),
      event(
        t("attempt.published"),
        job.published_at,
        job.republish_count ? t("attempt.republished", { n: num(job.republish_count) }) : null,
      ),
      event(t("attempt.started"), job.started_at),
      event(t("attempt.finished"), job.finished_at),
    ),
    dl([
      [t("attempt.job"), h("code", { text: job.job_id })],
      [t("attempt.pipeline"), job.pipeline],
      [t("attempt.deadline"), when(job.reply_deadline)],
      [t("attempt.republish_count"), num(job.republish_count ?? 0)],
      [t("attempt.service"), service],
      [
        t("attempt.error"),
        job.error
          ? h(
              "span",
              { class: "code", title: explainCode(job.error.code, job.status) },
              job.error.code,
              job.error.message ? ` — ${job.error.message}` : "",
            )
          : null,
      ],
      [t("attempt.result"), job.result ? h("pre", { text: JSON.stringify(job.result, null, 2) }) : null],
      [t("attempt.metrics"), job.metrics ? h("pre", { text: JSON.stringify(job.metrics, null, 2) }) : null],
    ]),
  );
}

function renderFile() {
  const doc = state.file;
  const f = doc.file;
  const current = doc.current_job;
  // An archived file (arm.archive_files) keeps its history, read-only: never retryable.
  const archived = Boolean(f.archived_at);
  const retryable =
    !archived &&
    current &&
    ["error", "timeout", "dlq"].includes(current.status) &&
    current.attempt < current.max_attempts;
  const retries = doc.retries || [];
  const byJob = new Map(doc.attempts.map((j) => [j.job_id, j.attempt]));
  // The retry button and its answer: an operator's only.
  const actions =
    mayRetry() &&
    h(
      "div",
      { class: "actions" },
      h("button", {
        id: "file-retry",
        type: "button",
        class: "retry",
        disabled: !retryable || state.inFlight.has(f.id),
        onclick: (e) => retryOne(f.id, f.current_job_id, e.target),
        text: t("file.retry"),
      }),
      h("span", { id: "file-answer" }, answerCell(f.id)),
    );
  $("file").replaceChildren(
    h("h2", { class: "name", text: f.original_name }),
    archived ? h("p", { id: "file-archived", class: "archived", text: t("file.archived_note") }) : null,
    actions,
    dl([
      [t("file.id"), h("code", { text: f.id })],
      [t("file.status"), [badge(f.status, "file"), awaitingMapping(f.status, doc.current_job && doc.current_job.status)]],
      [t("file.type"), f.file_type],
      [t("file.consolidation"), f.consolidation_id ? h("code", { text: f.consolidation_id }) : null],
      [t("file.object"), h("code", { text: `s3://${f.s3.bucket}/${f.s3.key}` })],
      [t("file.created"), when(f.created_at)],
      [t("file.updated"), when(f.updated_at)],
      ...(archived ? [[t("file.archived"), when(f.archived_at)]] : []),
    ]),
    h("h3", { text: t("file.attempts", { n: num(doc.attempts.length) }) }),
    h("ol", { id: "attempts", class: "attempts" }, doc.attempts.map((j) => attemptCard(j, f.current_job_id))),
    h("h3", { text: t("file.retries", { n: num(retries.length) }) }),
    retries.length === 0
      ? h("p", { class: "muted", text: t("file.no_retries") })
      : h(
          "table",
          { id: "retries", class: "files" },
          h(
            "thead",
            {},
            h("tr", {}, h("th", { text: t("file.when") }), h("th", { text: t("file.who") }), h("th", { text: t("file.what") })),
          ),
          h(
            "tbody",
            {},
            retries.map((r) =>
              h(
                "tr",
                {},
                h("td", { class: "when", text: when(r.retried_at), title: r.retried_at }),
                // Who, and the level the API took them at (none for a retry made in SQL).
                h("td", { text: r.actor_level ? `${r.actor} · ${t(`level.${r.actor_level}`)}` : r.actor }),
                h("td", {
                  text: t("file.retry_step", {
                    from: byJob.get(r.old_job_id) ?? "?",
                    to: r.new_attempt ?? byJob.get(r.new_job_id) ?? "?",
                  }),
                }),
              ),
            ),
          ),
        ),
  );
}

// --- start ------------------------------------------------------------------------

async function start() {
  i18n.lang = initialLang();
  try {
    await loadMessages();
  } catch (err) {
    // Without its texts the page cannot say much: in both languages, then.
    $("loading").textContent =
      `The console could not load its texts / Консоль не смогла загрузить тексты: ${err.message}`;
    return;
  }
  applyStatic();
  for (const button of document.querySelectorAll("#lang button")) {
    button.addEventListener("click", () => setLang(button.dataset.lang));
  }
  renderSelection();
  $("signin-form").addEventListener("submit", onSignIn);
  $("signout").addEventListener("click", () => signedOut(null));
  $("forbidden-signin").addEventListener("click", () => signedOut(null));
  $("filters").addEventListener("submit", onFilter);
  $("clear").addEventListener("click", () => {
    location.hash = "#/";
  });
  $("select-all").addEventListener("change", onSelectAll);
  $("select-retryable").addEventListener("click", onSelectRetryable);
  $("retry-selected").addEventListener("click", retrySelected);
  $("more").addEventListener("click", () => loadList(true));
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && state.actor !== null && mayView()) tick();
  });
  try {
    const me = await whoami();
    state.authMode = me.auth_mode;
    show("loading", false);
    if (me.actor === null) signedOut(null);
    else signedIn(me);
  } catch (err) {
    $("loading").textContent = t("app.failed", { message: err.message });
  }
}

start();
