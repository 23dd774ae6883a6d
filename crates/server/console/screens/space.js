// Space and reclaim: physical, live and reclaimable space over the last hour (a point every
// 5 s) or the last day (a point a minute), the collector's relocation rate beside the hosts'
// write rate, write amplification, what each volume gave back (UNMAP) and zeroed (WRITE
// SAME), and the collector's priority.

import { h, replace, setText, syncRows, field, errorSlot, showError } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";
import { TimeChart } from "../charts.js";
import { figure, setFigure } from "./dashboard.js";

/** The server's two rings: a point every 5 s for an hour, a point a minute for a day. A new
 * array has no minute points yet, so the hour is shown first. */
const RANGES = [
  { key: "hour", label: "last hour", step: 5, points: 720, every: "every 5 s" },
  { key: "day", label: "last 24 h", step: 60, points: 1440, every: "a minute" },
];

export const GC_PRIORITIES = ["off", "low", "medium", "high"];

export function gcForm(current, ctx) {
  const select = h("select", { name: "gc_priority" }, GC_PRIORITIES.map((p) => h("option", { value: p, text: p, selected: p === current })));
  const custom = h("input", { name: "gc_rate", placeholder: "or a rate, e.g. 100MB/s", autocomplete: "off" });
  if (!GC_PRIORITIES.includes(current)) custom.value = current;
  const error = errorSlot();
  const button = h("button", { type: "submit", text: "Apply" });
  const form = h("form", { class: "action", data: { action: "gc" } },
    field("garbage collection priority", select), field("rate limit", custom), h("div", { class: "buttons" }, button), error);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    showError(error, null);
    button.disabled = true;
    try {
      await api.send("PATCH", "/api/v1/array", { gc_priority: custom.value.trim() || select.value });
      ctx.refresh();
    } catch (e) {
      showError(error, e.message);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

export function space(root, ctx) {
  const figures = h("div", { class: "figures" },
    figure("used", "physical_used_bytes"),
    figure("live", "live_bytes", "data still referenced"),
    figure("reclaimable", "reclaimable_bytes", "what collection returns"),
    figure("write amplification", "write_amplification", "(host + relocated) / host bytes"),
    figure("relocated by GC", "relocated_bytes"),
    figure("written by hosts", "host_written_bytes"));
  const chartBox = h("div", { class: "grid charts" });
  let range = RANGES[0];
  let charts = [];
  let since = 0;
  /** Charts for `range`, empty: the next poll fills them from its ring. */
  function showRange(r) {
    for (const c of charts) c.destroy();
    range = r;
    since = 0;
    charts = [
      new TimeChart(`Space (${r.label})`, [
        { label: "used", value: (p) => p.space && p.space.physical_used_bytes },
        { label: "live", value: (p) => p.space && p.space.live_bytes },
        { label: "reclaimable", value: (p) => p.space && p.space.reclaimable_bytes },
      ], fmt.bytes, r.points, r.every, true),
      new TimeChart(`Host writes and GC relocation (${r.label})`, [
        { label: "host writes", value: (p) => p.host_written_bytes_per_s },
        { label: "GC relocation", value: (p) => p.gc_relocated_bytes_per_s },
      ], fmt.rate, r.points, r.every, true),
    ];
    replace(chartBox, charts.map((c) => c.el));
    for (const b of rangeButtons.children) b.setAttribute("aria-pressed", String(b.dataset.range === r.key));
  }
  const rangeButtons = h("div", { class: "buttons range", role: "group", "aria-label": "time range" },
    RANGES.map((r) => h("button", {
      type: "button", class: "small", text: r.label, data: { range: r.key },
      on: { click: () => { if (r !== range) { showRange(r); ctx.refresh(); } } },
    })));
  showRange(range);
  const body = h("tbody");
  const gc = h("div", { class: "panel" });
  replace(root,
    h("h1", { text: "Space and reclaim" }),
    h("div", { class: "panel" }, figures),
    rangeButtons,
    chartBox,
    h("div", { class: "panel" }, h("h2", { text: "Reclaim by volume (since start)" }),
      h("table", { class: "list stack reclaim" },
        h("thead", null, h("tr", null, ["volume", "UNMAP", "unmapped", "WRITE SAME", "zeroed", "physical"].map((t) => h("th", { text: t })))),
        body)),
    gc);
  let gcShown = null;

  async function tick(signal) {
    const a = await api.get("/api/v1/array", signal);
    setFigure(root, "physical_used_bytes", a.physical_used_bytes, fmt.bytes(a.physical_used_bytes));
    setFigure(root, "live_bytes", a.live_bytes, fmt.bytes(a.live_bytes));
    setFigure(root, "reclaimable_bytes", a.reclaimable_bytes, fmt.bytes(a.reclaimable_bytes));
    setFigure(root, "write_amplification", a.gc.write_amplification, a.gc.write_amplification.toFixed(2));
    setFigure(root, "relocated_bytes", a.gc.relocated_bytes, fmt.bytes(a.gc.relocated_bytes));
    setFigure(root, "host_written_bytes", a.gc.host_written_bytes, fmt.bytes(a.gc.host_written_bytes));
    if (gcShown !== a.gc.priority) {
      gcShown = a.gc.priority;
      replace(gc, h("h2", { text: "Garbage collection" }),
        h("p", { class: "hint", text: `Now: ${a.gc.priority}. Higher priority returns space sooner and takes more of the disk from hosts.` }),
        gcForm(a.gc.priority, ctx));
    }
    const asked = range;
    const hist = await api.get(`/api/v1/stats/history?step=${asked.step}&since=${since}`, signal);
    // A range switched while the request was out: its charts wait for their own points.
    if (asked === range && hist.points.length) {
      since = hist.points[hist.points.length - 1].time_ms;
      for (const c of charts) c.add(hist.points);
    }
    const vols = await api.get("/api/v1/volumes", signal);
    syncRows(body, vols, (v) => v.name,
      () => h("tr", null, h("td"), h("td", { class: "num" }), h("td", { class: "num" }), h("td", { class: "num" }), h("td", { class: "num" }), h("td", { class: "num" })),
      (row, v) => {
        setText(row.children[0], v.name);
        setText(row.children[1], String(v.vaai.delete));
        setText(row.children[2], fmt.bytes(v.vaai.deleted_bytes));
        setText(row.children[3], String(v.vaai.zero));
        setText(row.children[4], fmt.bytes(v.vaai.zeroed_bytes || 0));
        setText(row.children[5], fmt.bytes(v.physical_bytes));
      });
  }

  return {
    tick,
    setStale: (stale) => charts.forEach((c) => c.setStale(stale)),
    destroy: () => charts.forEach((c) => c.destroy()),
  };
}
