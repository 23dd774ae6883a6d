// Dashboard: capacity, data reduction as the headline (every other ratio labelled), IOPS,
// bandwidth and latency live and over the last hour, top volumes, VAAI activity under esxtop's
// names, recent events.

import { h, replace, setText, syncRows } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";
import { TimeChart, bar } from "../charts.js";
import { eventRow, updateEventRow } from "./events.js";

/** The array ring keeps 720 points of 5 s: one hour. */
const HOUR_POINTS = 720;

export function figure(label, key, hint) {
  return h("div", { class: "figure", data: { figure: key } },
    h("div", { class: "value", text: "–" }),
    h("div", { class: "label", text: label }),
    hint ? h("div", { class: "hint", text: hint }) : null);
}

/** Show `text` in the figure named `key` under `root`, its raw value in `data-value`, and
 * `hint` (when given) under its label. */
export function setFigure(root, key, raw, text, hint) {
  const el = root.querySelector(`[data-figure="${key}"]`);
  if (!el) return;
  el.dataset.value = String(raw);
  setText(el.querySelector(".value"), text);
  const hintEl = el.querySelector(".hint");
  if (hint !== undefined && hintEl) setText(hintEl, hint);
}

/** IOPS, bandwidth and latency charts over history points, keeping at most `limit`. */
export function ioCharts(limit) {
  return [
    new TimeChart("IOPS", [
      { label: "read", value: (p) => p.read_iops },
      { label: "write", value: (p) => p.write_iops },
      { label: "other", value: (p) => p.other_iops },
    ], (v) => fmt.count(v), limit),
    new TimeChart("Bandwidth", [
      { label: "read", value: (p) => p.read_bytes_per_s },
      { label: "write", value: (p) => p.write_bytes_per_s },
    ], (v) => fmt.rate(v), limit),
    new TimeChart("Latency", [
      { label: "read avg", value: (p) => (p.read_iops > 0 ? p.read_latency_us : null) },
      { label: "write avg", value: (p) => (p.write_iops > 0 ? p.write_latency_us : null) },
      { label: "p99 (bucket bound)", value: (p) => p.p99_latency_us },
    ], (v) => fmt.micros(v), limit),
  ];
}

/** The VAAI rates of the newest history point, under esxtop's column names. */
export function vaaiTable() {
  const rows = [
    ["ATS/s", "ats_per_s", fmt.count],
    ["ATSF/s", "ats_failed_per_s", fmt.count],
    ["CLONE_WR/s", "clone_write_per_s", fmt.count],
    ["ZERO/s", "zero_per_s", fmt.count],
    ["DELETE/s", "delete_per_s", fmt.count],
    ["MBDEL/s", "deleted_bytes_per_s", (v) => (v / 2 ** 20).toFixed(1)],
    ["MBZERO/s", "zeroed_bytes_per_s", (v) => (v / 2 ** 20).toFixed(1)],
    ["MBC_WR/s", "cloned_bytes_per_s", (v) => (v / 2 ** 20).toFixed(1)],
  ];
  const body = h("tbody", null, rows.map(([name, key]) =>
    h("tr", { data: { vaai: key } }, h("th", { text: name }), h("td", { class: "num", text: "–" }))));
  const el = h("table", { class: "vaai" }, body);
  el.update = (point) => {
    for (const [, key, f] of rows) {
      const td = body.querySelector(`[data-vaai="${key}"] td`);
      const v = point ? point[key] : null;
      td.dataset.value = v === null ? "" : String(v);
      setText(td, v === null || v === undefined ? "–" : f(v));
    }
  };
  return el;
}

export function dashboard(root, ctx) {
  const banner = h("div", { class: "banner warning", role: "status", hidden: true });
  const poisoned = h("div", { class: "banner error", role: "alert", hidden: true });
  const capacityBar = h("div", { class: "capacity" });
  const figures = h("div", { class: "figures" },
    figure("data reduction", "data_reduction", "data mapped / unique data stored (dedup × compression)"),
    figure("used", "physical_used_bytes"),
    figure("capacity", "capacity_bytes"),
    figure("reclaimable", "reclaimable_bytes", "freed by garbage collection"),
    figure("provisioned", "provisioned_bytes"),
    figure("oversubscription", "oversubscription", "provisioned / capacity"),
    figure("total reduction", "total_reduction", "provisioned / used (thin provisioning included)"),
    figure("GC write amplification", "write_amplification"),
    figure("volumes", "volumes"),
    figure("hosts", "hosts"));
  const charts = ioCharts(HOUR_POINTS);
  const vaai = vaaiTable();
  const topBody = h("tbody");
  const eventsBody = h("tbody");
  replace(root,
    h("h1", { text: "Dashboard" }),
    poisoned, banner,
    h("div", { class: "panel" }, h("h2", { text: "Capacity" }), capacityBar, figures),
    h("div", { class: "grid charts" }, charts.map((c) => c.el)),
    h("div", { class: "grid" },
      h("div", { class: "panel" }, h("h2", { text: "Top volumes (last 5 s)" }),
        h("table", { class: "list" },
          h("thead", null, h("tr", null, ["volume", "IOPS", "MB/s", "reduction"].map((t) => h("th", { text: t })))),
          topBody)),
      h("div", { class: "panel" }, h("h2", { text: "VAAI activity (esxtop)" }), vaai)),
    h("div", { class: "panel" }, h("h2", { text: "Recent events" }),
      h("table", { class: "list events" }, eventsBody)));

  let since = 0;
  let eventsAfter = null;
  const previous = new Map();

  async function tick(signal) {
    const a = await api.get("/api/v1/array", signal);
    const used = a.physical_used_bytes;
    replace(capacityBar, bar([
      { label: `live ${fmt.bytes(a.live_bytes)}`, value: a.live_bytes, class: "live" },
      { label: `reclaimable ${fmt.bytes(a.reclaimable_bytes)}`, value: a.reclaimable_bytes, class: "reclaimable" },
    ], a.capacity_bytes, a.soft_threshold < 1 ? a.soft_threshold : null),
    h("div", { class: "caption", text: `${fmt.bytes(used)} of ${fmt.bytes(a.capacity_bytes)} used (${fmt.percent(used / a.capacity_bytes)}); soft threshold ${fmt.percent(a.soft_threshold)}` }));
    // The two ratios with the figures they divide: admins compare them with other arrays'
    // dashboards, which define them differently.
    setFigure(root, "data_reduction", a.data_reduction, fmt.ratio(a.data_reduction),
      `${fmt.bytes(a.mapped_bytes)} mapped / ${fmt.bytes(a.live_bytes)} stored (dedup × compression)`);
    setFigure(root, "physical_used_bytes", used, fmt.bytes(used));
    setFigure(root, "capacity_bytes", a.capacity_bytes, fmt.bytes(a.capacity_bytes));
    setFigure(root, "reclaimable_bytes", a.reclaimable_bytes, fmt.bytes(a.reclaimable_bytes));
    setFigure(root, "provisioned_bytes", a.provisioned_bytes, fmt.bytes(a.provisioned_bytes));
    const over = a.capacity_bytes > 0 ? a.provisioned_bytes / a.capacity_bytes : 0;
    setFigure(root, "oversubscription", over, `${over.toFixed(2)}x`);
    setFigure(root, "total_reduction", a.total_reduction, fmt.ratio(a.total_reduction),
      `${fmt.bytes(a.provisioned_bytes)} provisioned / ${fmt.bytes(used)} used (thin provisioning included)`);
    setFigure(root, "write_amplification", a.gc.write_amplification, a.gc.write_amplification.toFixed(2));
    setFigure(root, "volumes", a.volumes, a.volumes);
    setFigure(root, "hosts", a.hosts, a.hosts);
    banner.hidden = !a.soft_threshold_exceeded;
    setText(banner, a.soft_threshold_exceeded
      ? `Space in use passed the soft threshold (${fmt.percent(a.soft_threshold)}): hosts get thin-provisioning warnings. Free space (UNMAP, delete volumes) or add capacity.`
      : "");
    poisoned.hidden = !a.poisoned;
    setText(poisoned, a.poisoned ? `The engine stopped accepting writes: ${a.poisoned}` : "");

    const hist = await api.get(`/api/v1/stats/history?since=${since}`, signal);
    if (hist.points.length) {
      since = hist.points[hist.points.length - 1].time_ms;
      for (const c of charts) c.add(hist.points);
      vaai.update(hist.points[hist.points.length - 1]);
    }

    const stats = await api.get("/api/v1/stats", signal);
    const rows = [];
    for (const v of stats.volumes) {
      let commands = 0;
      let bytesMoved = 0;
      for (const c of Object.values(v.classes)) {
        commands += c.commands;
        bytesMoved += c.bytes;
      }
      const before = previous.get(v.name);
      previous.set(v.name, { commands, bytes: bytesMoved, time: stats.time_ms });
      if (!before || stats.time_ms <= before.time) continue;
      const s = (stats.time_ms - before.time) / 1000;
      rows.push({ name: v.name, iops: (commands - before.commands) / s, bw: (bytesMoved - before.bytes) / s, reduction: v.data_reduction });
    }
    for (const name of previous.keys()) {
      if (!stats.volumes.some((v) => v.name === name)) previous.delete(name);
    }
    rows.sort((x, y) => y.iops - x.iops);
    syncRows(topBody, rows.slice(0, 5), (r) => r.name,
      (r) => h("tr", null, h("td", null, h("a", { href: `#/volumes/${encodeURIComponent(r.name)}`, text: r.name })),
        h("td", { class: "num" }), h("td", { class: "num" }), h("td", { class: "num" })),
      (row, r) => {
        setText(row.children[1], fmt.count(r.iops));
        setText(row.children[2], fmt.rate(r.bw));
        setText(row.children[3], fmt.ratio(r.reduction));
      });

    const ev = await api.get(eventsAfter === null ? "/api/v1/events?limit=10" : `/api/v1/events?after=${eventsAfter}`, signal);
    eventsAfter = ev.next;
    for (const e of ev.events) eventsBody.prepend(updateEventRow(eventRow(), e));
    while (eventsBody.children.length > 10) eventsBody.lastElementChild.remove();
  }

  return {
    tick,
    setStale: (stale) => charts.forEach((c) => c.setStale(stale)),
    destroy: () => charts.forEach((c) => c.destroy()),
  };
}
