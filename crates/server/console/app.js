// The console's shell: hash routes, the poller, the live indicator and the login.
//
// Polling discipline (RFC 0002): one poller per tab; a screen's tick runs its GETs one after
// another, so at most one poll request is in flight; the next tick starts 5 s after the
// previous one started, scheduled once the previous one settled (never setInterval); nothing
// runs while the tab is hidden; a failed tick says "retrying", two in a row "stale since".

import { h, replace, setText } from "./dom.js";
import * as api from "./api.js";
import { clock } from "./format.js";
import { dashboard } from "./screens/dashboard.js";
import { volumes } from "./screens/volumes.js";
import { volume } from "./screens/volume.js";
import { hosts } from "./screens/hosts.js";
import { tree } from "./screens/tree.js";
import { space } from "./screens/space.js";
import { settings } from "./screens/settings.js";
import { events } from "./screens/events.js";
import { copy } from "./screens/copy.js";

const NAV = [
  ["#/", "Dashboard", dashboard],
  ["#/volumes", "Volumes", volumes],
  ["#/hosts", "Hosts", hosts],
  ["#/snapshots", "Snapshots", tree],
  ["#/space", "Space", space],
  ["#/copy", "Off-site copy", copy],
  ["#/events", "Events", events],
  ["#/settings", "Settings", settings],
];

/** `?poll=MS` (200 at least) sets the interval, for the browser tests. */
const POLL_MS = (() => {
  const v = Number(new URLSearchParams(location.search).get("poll"));
  return Number.isFinite(v) && v >= 200 ? v : 5000;
})();

const main = document.getElementById("main");
const status = document.getElementById("status");
const nav = document.getElementById("nav");

let screen = null;
let timer = null;
let inflight = null;
let controller = null;
let again = false;
let failures = 0;
let staleSince = null;
let loginShown = false;

function route() {
  const hash = location.hash || "#/";
  const m = /^#\/volumes\/(.+)$/.exec(hash);
  if (m) return { make: volume, arg: decodeURIComponent(m[1]), nav: "#/volumes" };
  const entry = NAV.find(([href]) => href === hash) || NAV[0];
  return { make: entry[2], arg: null, nav: entry[0] };
}

function buildNav() {
  replace(nav, NAV.map(([href, label]) => h("a", { href, text: label, data: { nav: href } })));
}

function markNav(current) {
  for (const a of nav.querySelectorAll("a")) {
    if (a.dataset.nav === current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

const ctx = {
  /** Run a tick now (after an action), or right after the one in flight. */
  refresh: () => {
    if (inflight) again = true;
    else schedule(0);
  },
  go: (hash) => {
    location.hash = hash;
  },
  pollMs: POLL_MS,
};

async function show() {
  if (loginShown) return;
  const r = route();
  markNav(r.nav);
  if (controller) controller.abort();
  if (inflight) await inflight.catch(() => {});
  if (screen) screen.destroy();
  const root = h("section", { class: "screen" });
  replace(main, root);
  screen = r.make(root, ctx, r.arg);
  schedule(0);
}

function schedule(delay) {
  clearTimeout(timer);
  timer = null;
  if (document.hidden || loginShown) return;
  timer = setTimeout(tick, delay);
}

async function tick() {
  timer = null;
  if (inflight) {
    // Never two polls at once: this one runs when the one in flight settles.
    again = true;
    return;
  }
  if (document.hidden || loginShown || !screen) return;
  const started = performance.now();
  const current = screen;
  controller = new AbortController();
  const signal = controller.signal;
  inflight = current.tick(signal);
  try {
    await inflight;
    if (current === screen && !signal.aborted) live();
  } catch (e) {
    if (!signal.aborted && current === screen) failed(e);
  } finally {
    inflight = null;
  }
  if (current === screen && !loginShown) {
    schedule(again ? 0 : Math.max(0, POLL_MS - (performance.now() - started)));
  }
  again = false;
}

function live() {
  failures = 0;
  staleSince = null;
  status.className = "status live";
  setText(status, "live");
  if (screen && screen.setStale) screen.setStale(false);
}

function failed(e) {
  if (e instanceof api.ApiError && e.status === 401) return;
  failures++;
  if (failures === 1) staleSince = Date.now();
  if (failures >= 2) {
    status.className = "status stale";
    setText(status, `stale since ${clock(staleSince)}`);
    if (screen && screen.setStale) screen.setStale(true);
  } else {
    status.className = "status retrying";
    setText(status, "retrying");
  }
  status.title = e.message;
}

function showLogin() {
  if (loginShown) return;
  loginShown = true;
  clearTimeout(timer);
  timer = null;
  if (controller) controller.abort();
  const input = h("input", { type: "password", id: "token", autocomplete: "off", required: true });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const form = h("form", { class: "login", on: { submit: login } },
    h("h2", { text: "sliver console" }),
    h("p", { text: "This array requires its API token." }),
    h("label", { class: "field" }, h("span", { class: "label", text: "API token" }), input),
    error,
    h("button", { type: "submit", text: "Sign in" }));
  async function login(ev) {
    ev.preventDefault();
    api.setToken(input.value);
    try {
      await api.get("/api/v1/array");
    } catch (e) {
      api.setToken(null);
      error.textContent = e.message;
      error.hidden = false;
      return;
    }
    input.value = "";
    loginShown = false;
    nav.hidden = false;
    show();
  }
  nav.hidden = true;
  status.className = "status";
  setText(status, "signed out");
  replace(main, form);
  input.focus();
}

api.whenUnauthorized(showLogin);

document.addEventListener("visibilitychange", () => {
  if (document.hidden) {
    // A request in flight finishes; nothing new starts.
    clearTimeout(timer);
    timer = null;
  } else {
    schedule(0);
  }
});

window.addEventListener("hashchange", show);
buildNav();
show();
