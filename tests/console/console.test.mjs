// The sliver console in a real browser: Debian's chromium, driven by playwright-core, against
// a real `sliver serve` on ephemeral ports, with real I/O from qemu-io (RFC 0002, "Test plan").
// Run by scripts/console-test.sh (a step of scripts/test.sh). Every sliver serves HTTPS
// (--api-tls) with one certificate made by OpenSSL for the run; chromium trusts exactly that
// certificate's key (--ignore-certificate-errors-spki-list), Node's requests its certificate.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFile, execFileSync } from "node:child_process";
import { promisify } from "node:util";
import { mkdtempSync, rmSync, mkdirSync, readFileSync, writeFileSync, copyFileSync, chmodSync } from "node:fs";
import { randomBytes, createHash, X509Certificate } from "node:crypto";
import https from "node:https";
import http from "node:http";
import { createServer } from "node:net";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";
import * as fmt from "../../crates/server/console/format.js";

const ROOT = new URL("../..", import.meta.url).pathname;
const SLIVER = process.env.SLIVER_BIN || `${ROOT}target/debug/sliver`;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const SHOTS = `${ROOT}target/console-screenshots`;
/** The console's poll interval in these tests (?poll=MS). */
const POLL = 400;

/** The run's certificate and key (an administrator's own files, as far as sliver can tell). */
const TLS_DIR = mkdtempSync("/tmp/sliver-console-tls-");
execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
  "-nodes", "-keyout", `${TLS_DIR}/key.pem`, "-out", `${TLS_DIR}/cert.pem`, "-days", "2",
  "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], { stdio: "ignore" });
const CERT_PEM = readFileSync(`${TLS_DIR}/cert.pem`);
const CERT = new X509Certificate(CERT_PEM);
/** Upper-case hex pairs joined by colons: how sliver prints a fingerprint too. */
const FINGERPRINT = CERT.fingerprint256;
const SPKI_SHA256 = createHash("sha256")
  .update(CERT.publicKey.export({ type: "spki", format: "der" })).digest("base64");

let browser;
const servers = [];

before(async () => {
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true,
    args: ["--no-sandbox", `--ignore-certificate-errors-spki-list=${SPKI_SHA256}`] });
  mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  for (const s of servers) await s.stop();
  if (browser) await browser.close();
  rmSync(TLS_DIR, { recursive: true, force: true });
});

/** `sliver serve` on a fresh data directory and ephemeral ports; resolves once it printed them. */
async function startSliver(extra = [], dir = mkdtempSync("/tmp/sliver-console-")) {
  // The pair where sliver keeps the one it generates: it serves it instead.
  copyFileSync(`${TLS_DIR}/cert.pem`, `${dir}/api-cert.pem`);
  copyFileSync(`${TLS_DIR}/key.pem`, `${dir}/api-key.pem`);
  chmodSync(`${dir}/api-key.pem`, 0o600);
  const child = spawn(SLIVER, ["serve", "--data-dir", dir, "--capacity", "1G", "--api-tls",
    "--iscsi-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", ...extra],
  { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d) => { stderr += d; });
  const lines = createInterface({ input: child.stdout });
  const server = await new Promise((resolve, reject) => {
    const found = {};
    const timer = setTimeout(() => reject(new Error(`sliver did not start: ${stderr}`)), 30000);
    child.on("exit", (code) => reject(new Error(`sliver exited (${code}): ${stderr}`)));
    lines.on("line", (line) => {
      const url = /iscsi:\/\/\S+/.exec(line);
      if (url && !found.lun) found.lun = url[0];
      const fingerprint = /^API certificate SHA-256 fingerprint: (\S+)/.exec(line);
      if (fingerprint) found.fingerprint = fingerprint[1];
      const api = /^API: (https:\/\/\S+)/.exec(line);
      if (api) found.api = api[1];
      const consoleUrl = /^console: (https:\/\/\S+)/.exec(line);
      if (consoleUrl) found.console = consoleUrl[1];
      if (found.api && found.console && found.lun) {
        clearTimeout(timer);
        resolve(found);
      }
    });
  });
  server.child = child;
  server.dir = dir;
  const exited = new Promise((resolve) => child.on("exit", resolve));
  server.stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGCONT");
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 10000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  servers.push(server);
  return server;
}

/** `method` on `url` with Node's own client: { status, text }. Over HTTPS it trusts the
 * run's certificate alone. */
function request(url, method = "GET", headers = {}, body = undefined) {
  const client = url.startsWith("https:") ? https : http;
  return new Promise((resolve, reject) => {
    const req = client.request(url, { method, headers, ca: CERT_PEM, timeout: 30000 }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => { text += d; });
      res.on("end", () => resolve({ status: res.statusCode, text }));
    });
    req.on("timeout", () => req.destroy(new Error(`${method} ${url}: no answer in 30 s`)));
    req.on("error", reject);
    req.end(body);
  });
}

/** The API from the test, as a client other than the console. */
async function apiCall(server, method, path, body, token) {
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await request(`${server.api}${path}`, method, headers, body === undefined ? undefined : JSON.stringify(body));
  return { status: r.status, body: r.text ? JSON.parse(r.text) : null };
}

/** A page on the console, recording console errors, page errors and every request. */
async function openConsole(server, hash = "#/", size = { width: 1280, height: 900 }, poll = POLL) {
  const context = await browser.newContext({ viewport: size });
  const page = await context.newPage();
  const record = { errors: [], requests: [], inflight: 0, maxInflight: 0, apiRequests: 0 };
  page.on("console", (m) => { if (m.type() === "error") record.errors.push(m.text()); });
  page.on("pageerror", (e) => record.errors.push(String(e)));
  const isPoll = (r) => r.url().includes("/api/") && r.method() === "GET";
  page.on("request", (r) => {
    record.requests.push(r.url());
    if (isPoll(r)) {
      record.apiRequests++;
      record.inflight++;
      record.maxInflight = Math.max(record.maxInflight, record.inflight);
    }
  });
  const done = (r) => { if (isPoll(r)) record.inflight--; };
  page.on("requestfinished", done);
  page.on("requestfailed", done);
  await page.goto(`${server.console}?poll=${poll}${hash}`);
  return { page, context, record };
}

/** qemu-io on the server's LUN. Asynchronous: a synchronous child would stop this process
 * from reading sliver's output, and sliver blocks once that pipe is full. */
async function qemuIo(server, commands) {
  const args = ["-f", "raw"];
  for (const c of commands) args.push("-c", c);
  args.push(server.lun);
  const { stdout } = await promisify(execFile)("qemu-io", args, { encoding: "utf8", timeout: 120000 });
  return stdout;
}

async function statusText(page) {
  return (await page.textContent("#status")).trim();
}

async function waitFor(what, fn, ms = 15000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what} (last: ${JSON.stringify(last)})`);
}

async function figureValue(page, key) {
  return page.getAttribute(`[data-figure="${key}"]`, "data-value");
}

test("a clean load: no console error, nothing leaves the origin, the dashboard equals the API", async () => {
  const server = await startSliver();
  const { page, context, record } = await openConsole(server);
  await waitFor("live", async () => (await statusText(page)) === "live");
  await waitFor("figures", async () => (await figureValue(page, "capacity_bytes")) !== null);
  const a = (await apiCall(server, "GET", "/api/v1/array")).body;
  for (const key of ["capacity_bytes", "physical_used_bytes", "provisioned_bytes", "reclaimable_bytes", "data_reduction", "total_reduction", "volumes", "hosts"]) {
    await waitFor(`${key} = ${a[key]}`, async () => Number(await figureValue(page, key)) === a[key]);
  }
  // Each ratio says what it divides, in the API's figures.
  const hint = async (key) => (await page.textContent(`[data-figure="${key}"] .hint`)).trim();
  assert.ok((await hint("data_reduction")).startsWith(`${fmt.bytes(a.mapped_bytes)} mapped / ${fmt.bytes(a.live_bytes)} stored`),
    await hint("data_reduction"));
  assert.ok((await hint("total_reduction")).startsWith(`${fmt.bytes(a.provisioned_bytes)} provisioned / ${fmt.bytes(a.physical_used_bytes)} used`),
    await hint("total_reduction"));
  await page.waitForTimeout(3 * POLL);
  assert.deepEqual(record.errors, [], "console errors");
  const origin = new URL(server.console).origin;
  const foreign = record.requests.filter((u) => new URL(u).origin !== origin);
  assert.deepEqual(foreign, [], "requests to other origins");
  await context.close();
  await server.stop();
});

test("HTTPS: the settings show the certificate's fingerprint, plain HTTP is refused", async () => {
  const server = await startSliver();
  assert.equal(server.fingerprint, FINGERPRINT, "sliver printed the certificate's fingerprint");
  const { page, context, record } = await openConsole(server, "#/settings");
  const shown = '[data-about="certificate (SHA-256)"]';
  await waitFor("the fingerprint in the settings", async () => (await page.textContent(shown)) === FINGERPRINT);
  const overHttp = record.requests.filter((u) => u.startsWith("http:"));
  assert.deepEqual(overHttp, [], "every request over HTTPS");
  assert.deepEqual(record.errors, [], "console errors");
  await context.close();
  const plain = await request(server.console.replace("https://", "http://"));
  assert.equal(plain.status, 400);
  assert.match(plain.text, /use https:\/\//);
  await server.stop();
});

test("charts gain points while I/O runs, and VAAI zeroing and unmapping show", async () => {
  const server = await startSliver();
  const { page, context, record } = await openConsole(server, "#/volumes/demo");
  await waitFor("live", async () => (await statusText(page)) === "live");
  const points = async () => Number(await page.getAttribute('[data-chart="IOPS"]', "data-points"));
  const before = await points();
  const end = Date.now() + 12000;
  let offset = 0;
  while (Date.now() < end) {
    await qemuIo(server, [`write -P 0x5a ${offset} 4M`]);
    offset = (offset + (4 << 20)) % (1 << 30);
  }
  await waitFor("new chart points", async () => (await points()) > before, 12000);
  await waitFor("the writes in the chart", async () =>
    Number(await page.getAttribute('[data-chart="IOPS"]', "data-peak")) > 0, 12000);
  await qemuIo(server, ["write -z 0 16M", "discard 0 16M"]);
  const stats = await waitFor("ZERO and DELETE in the API", async () => {
    const s = (await apiCall(server, "GET", "/api/v1/stats")).body;
    const v = s.volumes.find((x) => x.name === "demo");
    return v.vaai.zero > 0 && v.vaai.delete > 0 ? v.vaai : null;
  });
  await waitFor("ZERO in the volume's panel", async () =>
    Number(await page.getAttribute('[data-vaai="ZERO"] td', "data-value")) === stats.zero);
  await waitFor("DELETE in the volume's panel", async () =>
    Number(await page.getAttribute('[data-vaai="DELETE"] td', "data-value")) === stats.delete);
  assert.deepEqual(record.errors, []);
  await context.close();
  await server.stop();
});

test("the space screen's hour view labels its time axis in whole minutes, also with its first few points", async () => {
  const server = await startSliver();
  const { page, context, record } = await openConsole(server, "#/space");
  for (const title of ["Space (last hour)", "Host writes and GC relocation (last hour)"]) {
    const chart = `[data-chart="${title}"]`;
    await waitFor(`${title}: two points`, async () => Number(await page.getAttribute(chart, "data-points")) >= 2, 30000);
    const labels = await waitFor(`${title}: the time axis drawn`, async () => JSON.parse(await page.getAttribute(chart, "data-time-labels") || "null"));
    // Under a minute of the 5 s ring: where the axis fell to seconds and their fractions (":48.500").
    const points = Number(await page.getAttribute(chart, "data-points"));
    assert.ok(points < 12, `${title}: ${points} points, not a few`);
    assert.ok(labels.length >= 2, `${title}: time axis labels ${JSON.stringify(labels)}`);
    for (const label of labels) {
      assert.match(label.split("\n")[0], /^\d{1,2}:\d{2}(am|pm)$/, `${title}: a time axis label not in whole minutes among ${JSON.stringify(labels)}`);
    }
  }
  assert.deepEqual(record.errors, [], "console errors");
  await context.close();
  await server.stop();
});

test("polling: one request in flight at most, none while hidden, stale when the API fails or stops, then live", async () => {
  const server = await startSliver();
  const { page, context, record } = await openConsole(server);
  await waitFor("live", async () => (await statusText(page)) === "live");
  await page.waitForTimeout(6 * POLL);
  assert.equal(record.maxInflight, 1, "two poll requests were in flight at once");

  // Hidden: headless chromium keeps the page visible, so the test overrides visibilityState
  // and dispatches the event the browser would.
  await page.evaluate(() => {
    Object.defineProperty(document, "visibilityState", { value: "hidden", configurable: true });
    Object.defineProperty(document, "hidden", { value: true, configurable: true });
    document.dispatchEvent(new Event("visibilitychange"));
  });
  await waitFor("the request in flight to finish", async () => record.inflight === 0);
  const hiddenFrom = record.apiRequests;
  await page.waitForTimeout(4 * POLL);
  assert.equal(record.apiRequests, hiddenFrom, "polls while hidden");
  await page.evaluate(() => {
    Object.defineProperty(document, "visibilityState", { value: "visible", configurable: true });
    Object.defineProperty(document, "hidden", { value: false, configurable: true });
    document.dispatchEvent(new Event("visibilitychange"));
  });
  await waitFor("polling to resume", async () => record.apiRequests > hiddenFrom);

  // Every API request fails: stale within three polls; served again: live.
  await page.route("**/api/**", (route) => route.abort());
  const t0 = Date.now();
  await waitFor("stale", async () => (await statusText(page)).startsWith("stale since"));
  assert.ok(Date.now() - t0 <= 3 * POLL + 1500, `stale after ${Date.now() - t0} ms`);
  await page.unroute("**/api/**");
  await waitFor("live again", async () => (await statusText(page)) === "live");

  // The server stops answering (SIGSTOP): requests time out, stale; SIGCONT: live.
  process.kill(server.child.pid, "SIGSTOP");
  await waitFor("stale (stopped server)", async () => (await statusText(page)).startsWith("stale since"), 20000);
  process.kill(server.child.pid, "SIGCONT");
  await waitFor("live after SIGCONT", async () => (await statusText(page)) === "live", 20000);
  assert.equal(record.maxInflight, 1, "two poll requests were in flight at once");
  await context.close();
  await server.stop();
});

/** Fill the form titled `title` inside `scope` and submit it. */
async function submit(page, title, values, scope = "") {
  const form = page.locator(`${scope} form[data-action="${title}"]`.trim());
  for (const [name, value] of Object.entries(values)) {
    const el = form.locator(`[name="${name}"]`);
    const tag = await el.evaluate((e) => e.tagName);
    if (tag === "SELECT") await el.selectOption(value);
    else await el.fill(value);
  }
  await form.locator('button[type="submit"]').click();
  return form;
}

async function formError(form) {
  await waitFor("the error sentence", async () => !(await form.locator(".error").isHidden()));
  return (await form.locator(".error").textContent()).trim();
}

test("volumes: create, resize, rename, snapshot, clone, connect, disconnect, delete, with the API's own errors", async () => {
  const server = await startSliver();
  const { page, context, record } = await openConsole(server, "#/volumes");
  await waitFor("live", async () => (await statusText(page)) === "live");
  const volume = async (name) => (await apiCall(server, "GET", "/api/v1/volumes")).body.find((v) => v.name === name);

  let form = await submit(page, "Create volume", { name: "ui1", size: "64M" });
  await waitFor("ui1 created", () => volume("ui1"));
  await waitFor("ui1 listed", async () => (await page.locator('tr[data-key="ui1"]').count()) === 1);

  // The same name again: the API's sentence beside the form, the inputs kept.
  form = await submit(page, "Create volume", { name: "ui1", size: "64M" });
  const expected = (await apiCall(server, "POST", "/api/v1/volumes", { name: "ui1", size_bytes: 64 << 20 })).body.error.message;
  assert.equal(await formError(form), expected);
  assert.equal(await form.locator('[name="name"]').inputValue(), "ui1");

  await page.locator('tr[data-key="ui1"] button').click();
  form = await submit(page, "Resize", { size: "32M" });
  const shrink = (await apiCall(server, "PATCH", "/api/v1/volumes/ui1", { size_bytes: 32 << 20 })).body.error.message;
  assert.equal(await formError(form), shrink);
  assert.equal(await form.locator('[name="size"]').inputValue(), "32M", "the input was kept");
  await submit(page, "Resize", { size: "128M" });
  await waitFor("ui1 grown", async () => (await volume("ui1")).provisioned_bytes === 128 << 20);

  // New volumes are write-through; the panel turns the cache on, and the API shows it kept.
  assert.equal((await volume("ui1")).write_cache, "write-through");
  await submit(page, "Write cache", { write_cache: "write-back" });
  await waitFor("ui1 write-back", async () => {
    const v = await volume("ui1");
    return v.write_cache === "write-back" && v.write_cache_saved === "write-back";
  });

  // Each action shows the API's own sentence when refused: a name taken, a host connected.
  form = await submit(page, "Rename", { name: "demo" });
  assert.equal(await formError(form), (await apiCall(server, "PATCH", "/api/v1/volumes/ui1", { name: "demo" })).body.error.message);
  form = await submit(page, "Snapshot", { snapshot: "demo" });
  assert.equal(await formError(form), (await apiCall(server, "POST", "/api/v1/volumes/ui1/snapshots", { name: "demo" })).body.error.message);
  form = await submit(page, "Clone", { clone: "demo" });
  assert.equal(await formError(form), (await apiCall(server, "POST", "/api/v1/volumes/ui1/clones", { name: "demo" })).body.error.message);

  await submit(page, "Rename", { name: "ui2" });
  await waitFor("renamed", async () => (await volume("ui2")) && !(await volume("ui1")));
  await waitFor("the panel follows the new name", async () => (await page.locator('h2:text("Volume ui2")').count()) === 1);

  await submit(page, "Snapshot", { snapshot: "ui2-snap" });
  await waitFor("snapshot", async () => (await volume("ui2-snap"))?.source === "ui2");
  await submit(page, "Clone", { clone: "ui2-clone" });
  await waitFor("clone", async () => (await volume("ui2-clone"))?.source === "ui2");

  assert.equal((await apiCall(server, "POST", "/api/v1/hosts", { name: "h1", iqns: ["iqn.2026-11.test:h1"] })).status, 201);
  await waitFor("the host offered", async () => {
    await page.locator('tr[data-key="ui2"] button').click();
    return (await page.locator('form[data-action="Connect"] option[value="h1"]').count()) === 1;
  });
  await submit(page, "Connect", { host: "h1" });
  await waitFor("connected", async () => (await volume("ui2")).connections.some((c) => c.host === "h1"));
  await waitFor("the panel rebuilt", async () => (await page.locator('form[data-action="Disconnect"]').count()) === 1);
  form = await submit(page, "Connect", { host: "h1" });
  assert.equal(await formError(form), (await apiCall(server, "POST", "/api/v1/volumes/ui2/connections", { host: "h1" })).body.error.message);

  // A connection another admin removed meanwhile: the API's sentence beside Disconnect. The
  // polls are held off so that the form still offers it.
  await page.route("**/api/v1/**", (route) => (route.request().method() === "GET" ? route.abort() : route.continue()));
  assert.equal((await apiCall(server, "DELETE", "/api/v1/volumes/ui2/connections/h1")).status, 204);
  form = await submit(page, "Disconnect", { connection: "h1" });
  const gone = (await apiCall(server, "DELETE", "/api/v1/volumes/ui2/connections/h1")).body.error.message;
  assert.equal(await formError(form), gone);
  assert.equal((await apiCall(server, "POST", "/api/v1/volumes/ui2/connections", { host: "h1" })).status, 201);
  await page.unroute("**/api/v1/**");
  await waitFor("live again", async () => (await statusText(page)) === "live");

  // Delete while connected: the API refuses, the console shows why.
  await waitFor("the disconnect form", async () => (await page.locator('form[data-action="Disconnect"]').count()) === 1);
  form = await submit(page, "Delete", { confirm: "ui2" });
  const busy = (await apiCall(server, "DELETE", "/api/v1/volumes/ui2")).body.error.message;
  assert.equal(await formError(form), busy);

  await submit(page, "Disconnect", { connection: "h1" });
  await waitFor("disconnected", async () => (await volume("ui2")).connections.length === 0);
  // The panel is rebuilt for the new state (no disconnect form) before the next action.
  await waitFor("the panel rebuilt", async () => (await page.locator('form[data-action="Disconnect"]').count()) === 0);
  form = await submit(page, "Delete", { confirm: "wrong" });
  assert.match(await formError(form), /type the volume's name/);
  assert.ok(await volume("ui2"), "deleted without the name typed");
  await submit(page, "Delete", { confirm: "ui2" });
  await waitFor("deleted", async () => !(await volume("ui2")));
  await waitFor("unlisted", async () => (await page.locator('tr[data-key="ui2"]').count()) === 0);
  assert.deepEqual(record.errors.filter((e) => !e.includes("status of 4") && !e.includes("net::ERR_FAILED")), [],
    "console errors besides the refused and the held-off requests");
  await context.close();
  await server.stop();
});

test("hosts: create with CHAP, edit, refused initiators; the CHAP secret never reaches the browser", async () => {
  const server = await startSliver();
  const { page, context } = await openConsole(server, "#/hosts");
  const bodies = [];
  page.on("response", async (r) => {
    try { bodies.push(await r.text()); } catch { /* a body already gone */ }
  });
  await waitFor("live", async () => (await statusText(page)) === "live");
  const secret = "s3cret-chap-4711";
  await submit(page, "Create host", { name: "esx1", iqns: "iqn.1998-01.com.vmware:esx1", chap_user: "esx1", chap_secret: secret });
  await waitFor("esx1 created", async () => (await apiCall(server, "GET", "/api/v1/hosts")).body.some((h) => h.name === "esx1" && h.chap_user === "esx1"));
  await waitFor("esx1 listed", async () => (await page.locator('tr[data-key="esx1"]').count()) === 1);
  await page.locator('tr[data-key="esx1"] button:text("Edit")').click();
  await submit(page, "Edit esx1", { iqns: "iqn.1998-01.com.vmware:esx1\niqn.1998-01.com.vmware:esx1b", chap_user: "esx1", chap_secret: `${secret}-2` });
  await waitFor("edited", async () => (await apiCall(server, "GET", "/api/v1/hosts")).body.find((h) => h.name === "esx1")?.iqns.length === 2);
  await page.waitForTimeout(2 * POLL);
  const html = await page.evaluate(() => document.documentElement.outerHTML);
  const values = await page.evaluate(() => [...document.querySelectorAll("input, textarea")].map((e) => e.value));
  const storage = await page.evaluate(() => JSON.stringify([{ ...localStorage }, { ...sessionStorage }, document.cookie]));
  const dbs = await page.evaluate(async () => JSON.stringify(await indexedDB.databases()));
  for (const [where, text] of [["markup", html], ["inputs", values.join("\n")], ["storage", storage], ["IndexedDB", dbs], ["responses", bodies.join("\n")]]) {
    assert.ok(!text.includes(secret), `the CHAP secret is in the ${where}`);
  }

  // An initiator no host knows is refused at login and listed; one click makes it a host.
  assert.equal((await apiCall(server, "DELETE", "/api/v1/volumes/demo/connections/%2A")).status, 204);
  const stranger = "iqn.2026-11.test.console:stranger";
  const target = (await apiCall(server, "GET", "/api/v1/array")).body.target_name;
  const portal = new URL(server.lun.replace("iscsi://", "http://")).host;
  await assert.rejects(promisify(execFile)("qemu-io", ["--image-opts",
    `driver=iscsi,transport=tcp,portal=${portal},target=${target},lun=0,initiator-name=${stranger}`,
    "-c", "read 0 4k"], { timeout: 60000 }), "an unknown initiator logged in");
  await waitFor("the refused initiator listed", async () => (await page.locator(`tr[data-key="${stranger}"]`).count()) === 1);
  await page.locator(`tr[data-key="${stranger}"] button`).click();
  await waitFor("a host made of it", async () =>
    (await apiCall(server, "GET", "/api/v1/hosts")).body.find((h) => h.iqns.includes(stranger))?.name === "stranger");
  await waitFor("gone from the refused list", async () => (await page.locator(`tr[data-key="${stranger}"]`).count()) === 0);
  await context.close();
  await server.stop();
});

test("soft threshold: the banner shows past it and goes below it", async () => {
  const server = await startSliver();
  const { page, context } = await openConsole(server, "#/settings");
  await waitFor("live", async () => (await statusText(page)) === "live");
  await submit(page, "threshold", { soft_threshold: "1" });
  await waitFor("threshold set", async () => (await apiCall(server, "GET", "/api/v1/array")).body.soft_threshold === 0.01);
  // 32 MiB of incompressible data: more than 1 % of 1 GiB.
  execFileSync("sh", ["-c", `head -c 33554432 /dev/urandom > ${server.dir}/noise`]);
  await qemuIo(server, [`write -s ${server.dir}/noise 0 32M`]);
  await waitFor("exceeded", async () => (await apiCall(server, "GET", "/api/v1/array")).body.soft_threshold_exceeded);
  await page.goto(`${server.console}?poll=${POLL}#/`);
  await waitFor("banner", async () => page.locator(".banner.warning").isVisible());
  assert.equal((await apiCall(server, "PATCH", "/api/v1/array", { soft_threshold: 0.8 })).status, 200);
  await waitFor("banner gone", async () => page.locator(".banner.warning").isHidden());
  await context.close();
  await server.stop();
});

test("a token: login shown, the API's sentence for a wrong one, the dashboard for the right one, kept nowhere", async () => {
  const token = "console-test-token-0123456789";
  const server = await startSliver(["--api-token", token]);
  const { page, context, record } = await openConsole(server);
  await waitFor("the login", async () => page.locator("form.login").isVisible());
  await page.fill("#token", "wrong-token");
  await page.click('form.login button[type="submit"]');
  const expected = (await apiCall(server, "GET", "/api/v1/array", undefined, "wrong-token")).body.error.message;
  await waitFor("the refusal", async () => ((await page.textContent("form.login .error")) || "").trim() === expected);
  await page.fill("#token", token);
  await page.click('form.login button[type="submit"]');
  await waitFor("live", async () => (await statusText(page)) === "live");
  await waitFor("figures", async () => (await figureValue(page, "capacity_bytes")) !== null);
  const kept = await page.evaluate(() => JSON.stringify([{ ...localStorage }, { ...sessionStorage }, document.cookie, location.href]));
  assert.ok(!kept.includes(token), "the token was kept in storage or the URL");
  assert.ok(!record.requests.some((u) => u.includes(token)), "the token was put in a URL");
  await page.reload();
  await waitFor("the login again after a reload", async () => page.locator("form.login").isVisible());
  await page.screenshot({ path: `${SHOTS}/login-1280x900.png` });
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: `${SHOTS}/login-390x844.png` });
  const box = await page.locator('form.login button[type="submit"]').boundingBox();
  assert.ok(box && box.x >= 0 && box.x + box.width <= 390, `the login button is off-screen on a phone: ${JSON.stringify(box)}`);
  await context.close();
  await server.stop();
});

/** qemu-io as the initiator `iqn` (the server's LUN 0); `signal` ends it early. */
function qemuIoAs(server, iqn, commands, signal) {
  const target = new URL(server.lun.replace("iscsi://", "http://"));
  const [, name] = target.pathname.split("/");
  const args = ["--image-opts", `driver=iscsi,transport=tcp,portal=${target.host},target=${decodeURIComponent(name)},lun=0,initiator-name=${iqn}`];
  for (const c of commands) args.push("-c", c);
  return promisify(execFile)("qemu-io", args, { encoding: "utf8", timeout: 180000, signal });
}

test("every screen renders at 1280x900 and phone size without errors (screenshots in target/console-screenshots)", async () => {
  // An array as an admin would see it: a host whose initiator is the only one let in, data
  // that reduces as real data does (incompressible, the same again, log text, zeros), a
  // snapshot, a live session and I/O while the screens are taken, and a refused initiator.
  // docs/console.png is this test's dashboard-1280x900.png.
  const server = await startSliver();
  const esx = "iqn.1998-01.com.vmware:esx01-5f3c2a1b";
  assert.equal((await apiCall(server, "POST", "/api/v1/hosts", { name: "esx01", iqns: [esx] })).status, 201);
  assert.equal((await apiCall(server, "POST", "/api/v1/volumes/demo/connections", { host: "esx01" })).status, 201);
  assert.equal((await apiCall(server, "DELETE", "/api/v1/volumes/demo/connections/%2A")).status, 204);
  execFileSync("sh", ["-c", `head -c 16777216 /dev/urandom > ${server.dir}/random && ` +
    `awk 'BEGIN { for (i = 1; i <= 260000; i++) printf "2026-11-26T10:%02d:%02d sliver[4711]: volume demo wrote block %d and flushed it\\n", i / 60 % 60, i % 60, i }' | ` +
    `head -c 16777216 > ${server.dir}/text`]);
  await qemuIoAs(server, esx, [`write -s ${server.dir}/random 0 16M`, `write -s ${server.dir}/random 16M 16M`,
    `write -s ${server.dir}/text 32M 16M`, "write -z 48M 16M"]);
  assert.equal((await apiCall(server, "POST", "/api/v1/volumes/demo/snapshots", { name: "demo-snap" })).status, 201);
  await assert.rejects(qemuIoAs(server, "iqn.2026-11.test.console:stranger", ["read 0 4k"]), "an unknown initiator logged in");
  const stop = new AbortController();
  // One session stays logged in; another keeps I/O going.
  const session = qemuIoAs(server, esx, ["sleep 170000"], stop.signal).catch(() => {});
  const io = (async () => {
    let i = 0;
    while (!stop.signal.aborted) {
      await qemuIoAs(server, esx, ["read 0 32M", `write -P ${i++ % 200} 64M 8M`], stop.signal).catch(() => {});
    }
  })();
  await waitFor("the session listed", async () => (await apiCall(server, "GET", "/api/v1/sessions")).body.some((x) => x.initiator === esx), 20000);
  // Charts need samples of the server's 5 s sampler to draw rates over time.
  await waitFor("history points", async () =>
    (await apiCall(server, "GET", "/api/v1/stats/history")).body.points.length >= 5, 40000);
  for (const [w, h] of [[1280, 900], [390, 844]]) {
    const { page, context, record } = await openConsole(server, "#/", { width: w, height: h });
    for (const [name, hash] of [["dashboard", "#/"], ["volumes", "#/volumes"], ["volume", "#/volumes/demo"], ["hosts", "#/hosts"],
      ["snapshots", "#/snapshots"], ["space", "#/space"], ["copy", "#/copy"], ["events", "#/events"], ["settings", "#/settings"]]) {
      await page.evaluate((x) => { location.hash = x; }, hash);
      await waitFor(`${name} live`, async () => (await statusText(page)) === "live");
      await page.waitForTimeout(2 * POLL);
      if (name === "hosts") {
        await waitFor("the session and the refused initiator shown", async () =>
          (await page.locator("table.sessions tbody tr").count()) >= 1 && (await page.locator("table.refused tbody tr").count()) === 1);
      }
      if (name === "space") {
        await waitFor("the last hour's points", async () =>
          Number(await page.getAttribute('[data-chart="Space (last hour)"]', "data-points")) >= 2);
      }
      // Every action in a table is on screen, phones included (rows become cards there).
      for (const button of await page.locator("table.stack button").all()) {
        const box = await button.boundingBox();
        assert.ok(box && box.x >= 0 && box.x + box.width <= w, `a ${name} table button is off-screen at ${w}px: ${JSON.stringify(box)}`);
      }
      await page.screenshot({ path: `${SHOTS}/${name}-${w}x${h}.png`, fullPage: true });
    }
    // The space screen's day range: its own charts, from the minute ring.
    await page.evaluate(() => { location.hash = "#/space"; });
    await page.click('button[data-range="day"]');
    await waitFor("the day's charts", async () => (await page.locator('[data-chart="Space (last 24 h)"]').count()) === 1);
    assert.equal(await page.getAttribute('button[data-range="day"]', "aria-pressed"), "true");
    assert.equal(await page.locator('[data-chart="Space (last hour)"]').count(), 0);
    await page.click('button[data-range="hour"]');
    await waitFor("the hour again", async () =>
      Number(await page.getAttribute('[data-chart="Space (last hour)"]', "data-points")) >= 2);
    assert.deepEqual(record.errors, [], `console errors at ${w}x${h}`);
    assert.equal(record.maxInflight, 1);
    await context.close();
  }
  stop.abort();
  await Promise.all([session, io]);
  await server.stop();
});

test("a one-minute soak at a fast poll rate: heap, DOM and chart points stay bounded, one poll in flight", async (t) => {
  const server = await startSliver();
  await apiCall(server, "POST", "/api/v1/hosts", { name: "soak", iqns: ["iqn.2026-11.test:soak"] });
  // The fastest poll the console accepts.
  const { page, context, record } = await openConsole(server, "#/", undefined, 200);
  const cdp = await context.newCDPSession(page);
  await cdp.send("HeapProfiler.enable");
  const measure = async () => {
    await cdp.send("HeapProfiler.collectGarbage");
    const { usedSize } = await cdp.send("Runtime.getHeapUsage");
    const { nodes } = await cdp.send("Memory.getDOMCounters");
    return { heap: usedSize, nodes };
  };
  const screens = ["#/volumes", "#/volumes/demo", "#/hosts", "#/snapshots", "#/space", "#/events", "#/settings", "#/"];
  let i = 0;
  const cycle = async (until) => {
    while (Date.now() < until) {
      await page.evaluate((x) => { location.hash = x; }, screens[i++ % screens.length]);
      await page.waitForTimeout(750);
    }
    await page.evaluate(() => { location.hash = "#/"; });
    await waitFor("live on the dashboard", async () => (await statusText(page)) === "live");
    await page.waitForTimeout(1000);
  };
  const start = Date.now();
  // Background I/O keeps the charts and counters moving.
  const io = (async () => {
    while (Date.now() < start + 60000) await qemuIo(server, ["write -P 0x33 0 8M", "read 0 8M"]);
  })();
  await cycle(start + 10000);
  const early = await measure();
  await cycle(start + 60000);
  const late = await measure();
  await io;
  const grew = late.heap - early.heap;
  t.diagnostic(`JS heap after GC ${early.heap} B at 10 s, ${late.heap} B at 60 s; DOM nodes ${early.nodes} -> ${late.nodes}; ${record.apiRequests} polls`);
  assert.ok(grew < 2 * 2 ** 20, `the JS heap grew ${grew} bytes from 10 s to 60 s (${early.heap} -> ${late.heap})`);
  assert.ok(late.nodes < early.nodes * 1.5 + 500, `DOM nodes ${early.nodes} -> ${late.nodes}`);
  for (const el of await page.locator("figure.chart").all()) {
    assert.ok(Number(await el.getAttribute("data-points")) <= 720, "a chart holds more points than its ring");
  }
  assert.equal(record.maxInflight, 1, "two poll requests were in flight at once");
  assert.deepEqual(record.errors, []);
  await context.close();
  await server.stop();
});

/** A free loopback port. */
async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** SeaweedFS (`weed mini`, SLIVER_WEED) on loopback ports with one bucket; resolves with its
 * S3 endpoint once it answers. */
async function startWeed(bucket) {
  const weed = process.env.SLIVER_WEED;
  assert.ok(weed, "SLIVER_WEED names SeaweedFS's weed (scripts/console-test.sh sets it)");
  const dir = mkdtempSync("/tmp/sliver-console-weed-");
  const s3 = await freePort();
  const args = ["mini", `-dir=${dir}`, "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
    "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", `-bucket=${bucket}`, `-s3.port=${s3}`];
  for (const flag of ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port.grpc", "admin.port", "admin.port.grpc"]) {
    args.push(`-${flag}=${await freePort()}`);
  }
  const child = spawn(weed, args, { stdio: "ignore", env: { ...process.env } });
  const exited = new Promise((resolve) => child.on("exit", resolve));
  const endpoint = `http://127.0.0.1:${s3}`;
  await waitFor("SeaweedFS's S3 endpoint", async () => {
    try {
      return (await fetch(`${endpoint}/${bucket}`)).status > 0;
    } catch {
      return false;
    }
  }, 120000);
  const store = {
    endpoint,
    async stop() {
      child.kill("SIGKILL");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
  servers.push(store);
  return store;
}

test("off-site copy: state and lag as the API says, a named point taken, refused twice and deleted; the command that restores it", async () => {
  // Without a copy: how to configure one.
  const plain = await startSliver();
  {
    const { page, context, record } = await openConsole(plain, "#/copy");
    await waitFor("the how-to", async () => !(await page.locator('[data-copy="none"]').isHidden()));
    assert.ok((await page.textContent('[data-copy="none"]')).includes("--replicate-to"));
    assert.deepEqual(record.errors, []);
    await context.close();
  }
  await plain.stop();

  process.env.AWS_ACCESS_KEY_ID = "sliver";
  process.env.AWS_SECRET_ACCESS_KEY = "sliver-console";
  process.env.AWS_REGION = "us-east-1";
  const store = await startWeed("sliver-console");
  const server = await startSliver(["--replicate-to", "s3://sliver-console/array", "--s3-endpoint", store.endpoint]);
  await qemuIo(server, ["write -P 7 0 8M"]);
  const { page, context, record } = await openConsole(server, "#/copy");
  await waitFor("streaming", async () => (await page.getAttribute('[data-figure="state"]', "data-value")) === "streaming", 60000);
  const api = (await apiCall(server, "GET", "/api/v1/replication")).body;
  assert.equal(api.target, "s3://sliver-console/array");
  assert.ok((await page.textContent('[data-copy="target"]')).includes(api.pool));
  assert.ok(await page.locator('[data-copy="error"]').isHidden(), "an error shown while the copy is healthy");
  assert.ok((await page.textContent('[data-copy="restore-newest"]')).startsWith("sliver restore --from s3://sliver-console/array --data-dir"));

  // A named point from the form: listed with its restore command, as the API lists it.
  const form = await submit(page, "Take a restore point", { name: "before-upgrade" });
  await waitFor("the point listed", async () => (await page.locator('tr[data-key="before-upgrade"]').count()) === 1, 60000);
  const points = (await apiCall(server, "GET", "/api/v1/replication/points")).body;
  const p = points.find((x) => x.name === "before-upgrade");
  assert.ok(p && !p.scheduled, JSON.stringify(points));
  const row = page.locator('tr[data-key="before-upgrade"]');
  assert.equal((await row.locator(".kind").textContent()).trim(), "named");
  assert.equal((await row.locator(".time").textContent()).trim(), p.time);
  assert.equal((await row.locator(".command").textContent()).trim(),
    "sliver restore --from s3://sliver-console/array --point before-upgrade --data-dir NEW-DIR [--s3-endpoint URL]");
  await waitFor("the newest point figure", async () => (await page.getAttribute('[data-figure="newest_point"]', "data-value")) === "before-upgrade");
  // The same name again: the API's sentence beside the form.
  await submit(page, "Take a restore point", { name: "before-upgrade" });
  assert.equal(await formError(form), 'a restore point named "before-upgrade" exists');
  await page.screenshot({ path: `${SHOTS}/copy-live-1280x900.png`, fullPage: true });
  // On a phone the points are cards and the Delete button stays on screen.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(2 * POLL);
  const box = await row.locator('button[data-delete="before-upgrade"]').boundingBox();
  assert.ok(box && box.x >= 0 && box.x + box.width <= 390, `Delete off-screen on a phone: ${JSON.stringify(box)}`);
  await page.screenshot({ path: `${SHOTS}/copy-live-390x844.png`, fullPage: true });
  // Deleted from its row.
  await row.locator('button[data-delete="before-upgrade"]').click();
  await waitFor("the point gone", async () => (await page.locator('tr[data-key="before-upgrade"]').count()) === 0);
  assert.equal((await apiCall(server, "GET", "/api/v1/replication/points")).body.length, 0);
  // The browser logs the refused duplicate's 409; nothing else.
  assert.deepEqual(record.errors, ["Failed to load resource: the server responded with a status of 409 (Conflict)"]);
  assert.equal(record.maxInflight, 1);
  await context.close();
  // Data that does not reduce, so that reading it after the restore needs the store.
  const noise = `${mkdtempSync("/tmp/sliver-console-noise-")}/noise`;
  writeFileSync(noise, randomBytes(8 << 20));
  await qemuIo(server, [`write -s ${noise} 16M 8M`]);
  await waitFor("the copy drained", async () => {
    const r = (await apiCall(server, "GET", "/api/v1/replication")).body;
    return r.state === "streaming" && r.backlog_bytes === 0;
  }, 60000);
  await server.stop();

  // Restored on demand elsewhere, with the background fetches held back: the screen shows the
  // restore in progress as the API does, and a read of data still in the store is counted.
  const restored = mkdtempSync("/tmp/sliver-console-restored-");
  execFileSync(SLIVER, ["restore", "--from", "s3://sliver-console/array", "--s3-endpoint", store.endpoint,
    "--data-dir", restored], { stdio: "ignore" });
  const fork = await startSliver(["--hydrate-rate", "64K/s"], restored);
  {
    const { page, context, record } = await openConsole(fork, "#/copy");
    await waitFor("the restore in progress", async () => !(await page.locator('[data-hydration="active"]').isHidden()));
    const h = (await apiCall(fork, "GET", "/api/v1/hydration")).body;
    assert.ok(h.active && !h.done && h.bytes_left > 0, JSON.stringify(h));
    assert.ok((await page.textContent('[data-hydration="source"]')).includes("s3://sliver-console/array"));
    const before = Number(await page.getAttribute('[data-figure="on_demand_fetches"]', "data-value"));
    const out = await qemuIo(fork, ["read -P 7 0 8M", "read 16M 8M"]);
    assert.ok(!/fail/i.test(out), out);
    await waitFor("the reads that waited counted", async () =>
      Number(await page.getAttribute('[data-figure="on_demand_fetches"]', "data-value")) > before);
    const after = (await apiCall(fork, "GET", "/api/v1/hydration")).body;
    assert.equal(Number(await page.getAttribute('[data-figure="on_demand_fetches"]', "data-value")) > 0, after.on_demand_fetches > 0);
    await page.screenshot({ path: `${SHOTS}/copy-restoring-1280x900.png`, fullPage: true });
    assert.deepEqual(record.errors, []);
    assert.equal(record.maxInflight, 1);
    await context.close();
  }
  await fork.stop();
  rmSync(noise.replace(/\/noise$/, ""), { recursive: true, force: true });
  await store.stop();
});

test("the vendored uPlot is the package's own file", () => {
  for (const f of ["uPlot.esm.js", "uPlot.min.css"]) {
    const vendored = readFileSync(`${ROOT}crates/server/console/vendor/${f}`);
    const packaged = readFileSync(new URL(`./node_modules/uplot/dist/${f}`, import.meta.url));
    assert.ok(vendored.equals(packaged), `${f} differs from uplot@1.6.32's`);
  }
});
