// Settings: the soft threshold, the collector's priority, what this array is (version,
// target name, portals, start time, the API certificate's fingerprint), and the OpenAPI
// document and metrics, fetched with the token and shown as text (a plain link could not
// carry it).

import { h, replace, setText, field, errorSlot, showError } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";
import { gcForm } from "./space.js";

export function settings(root, ctx) {
  const about = h("dl", { class: "about" });
  const threshold = h("input", { name: "soft_threshold", type: "number", min: 1, max: 100, step: 1, required: true });
  const error = errorSlot();
  const button = h("button", { type: "submit", text: "Apply" });
  const form = h("form", { class: "action", data: { action: "threshold" } },
    h("h3", { text: "Soft threshold" }),
    field("percent of capacity in use that warns hosts (100 turns it off)", threshold),
    h("div", { class: "buttons" }, button), error);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    showError(error, null);
    button.disabled = true;
    try {
      await api.send("PATCH", "/api/v1/array", { soft_threshold: Number(threshold.value) / 100 });
      delete threshold.dataset.shown;
      ctx.refresh();
    } catch (e) {
      showError(error, e.message);
    } finally {
      button.disabled = false;
    }
  });
  const gc = h("div");
  const doc = h("pre", { class: "document", hidden: true });
  const docError = errorSlot();
  const show = (path) => async () => {
    showError(docError, null);
    try {
      const text = await api.getText(path);
      doc.textContent = path.endsWith(".json") ? JSON.stringify(JSON.parse(text), null, 2) : text;
      doc.hidden = false;
    } catch (e) {
      showError(docError, e.message);
    }
  };
  replace(root,
    h("h1", { text: "Settings" }),
    h("div", { class: "panel" }, form),
    h("div", { class: "panel" }, gc),
    h("div", { class: "panel" }, h("h2", { text: "This array" }), about),
    h("div", { class: "panel" }, h("h2", { text: "Interfaces" }),
      h("div", { class: "buttons" },
        h("button", { type: "button", text: "OpenAPI document", on: { click: show("/api/openapi.json") } }),
        h("button", { type: "button", text: "Prometheus metrics", on: { click: show("/metrics") } })),
      docError, doc));
  let gcShown = null;

  async function tick(signal) {
    const a = await api.get("/api/v1/array", signal);
    if (threshold.dataset.shown !== String(a.soft_threshold) && document.activeElement !== threshold) {
      threshold.dataset.shown = String(a.soft_threshold);
      threshold.value = String(Math.round(a.soft_threshold * 100));
    }
    if (gcShown !== a.gc.priority) {
      gcShown = a.gc.priority;
      replace(gc, h("h3", { text: "Garbage collection" }), gcForm(a.gc.priority, ctx));
    }
    const rows = [
      ["version", a.version],
      ["target name", a.target_name],
      ["iSCSI portals", a.portals.join(", ")],
      ["started", fmt.dateTime(a.started_ms)],
      ["engine", a.poisoned ? `stopped accepting writes: ${a.poisoned}` : "healthy"],
      // What an administrator compares with the fingerprint `sliver serve` printed, and what
      // the CLI pins (--api-fingerprint).
      ["certificate (SHA-256)", a.tls_fingerprint || "none: plain HTTP on loopback"],
    ];
    if (about.children.length !== rows.length * 2) {
      replace(about, rows.map(([k]) => [h("dt", { text: k }), h("dd", { data: { about: k } })]));
    }
    for (const [k, v] of rows) setText(about.querySelector(`[data-about="${k}"]`), v);
  }

  return { tick, destroy() {} };
}
