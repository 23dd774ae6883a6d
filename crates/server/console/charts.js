// Time charts over uPlot (vendored, pinned by vendor/SHA256SUMS). A chart keeps at most the
// points of the server ring it mirrors, updates in place, and says how many points it has
// in `data-points` (the browser tests watch it grow).

import uPlot from "./vendor/uPlot.esm.js";
import { h } from "./dom.js";

const COLORS = ["#2f6fdf", "#e0742b", "#2a9d6f", "#9b59b6", "#c0392b", "#7f8c8d"];

/** uPlot's time axis steps of a minute and more (s). */
const MINUTE_STEPS = [60, 300, 600, 900, 1800, 3600, 7200, 10800, 14400, 21600, 28800, 43200, 86400];

/** Width of the value axis from its widest label (a fixed width clipped "10.0 MB/s"). */
function axisWidth(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  // uPlot calls this again while the layout converges; the first answers stand.
  if (cycleNum > 1) return axis._size;
  let widest = 0;
  if (values && values.length) {
    u.ctx.font = axis.font[0];
    for (const v of values) widest = Math.max(widest, u.ctx.measureText(v).width);
  }
  return Math.ceil(axis.ticks.size + axis.gap + widest / devicePixelRatio) + 4;
}

export class TimeChart {
  /**
   * `series`: [{label, value: point => number|null, unit: "iops"|"bytes"|"us"|"bytes/s"}];
   * `limit`: most points kept; `every`: how often the ring gains a point, for the text shown
   * until the first one; `minutes`: label the time axis in whole minutes only, however few
   * the points (uPlot otherwise labels a few seconds of them in seconds and their fractions).
   */
  constructor(title, series, format, limit, every = "every 5 s", minutes = false) {
    this.series = series;
    this.minutes = minutes;
    this.limit = limit;
    this.format = format;
    this.times = [];
    this.values = series.map(() => []);
    this.empty = h("p", { class: "empty", text: `Waiting for the first samples (one ${every}).` });
    this.el = h("figure", { class: "chart", data: { points: 0, chart: title } },
      h("figcaption", { text: title }), this.empty);
    this.plot = null;
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(this.el);
  }

  /** Append history points (oldest first), dropping those already shown. */
  add(points) {
    const last = this.times.length ? this.times[this.times.length - 1] : -Infinity;
    for (const p of points) {
      const t = p.time_ms / 1000;
      if (t <= last && this.times.length) continue;
      this.times.push(t);
      this.series.forEach((s, i) => this.values[i].push(s.value(p) ?? null));
    }
    const extra = this.times.length - this.limit;
    if (extra > 0) {
      this.times.splice(0, extra);
      for (const v of this.values) v.splice(0, extra);
    }
    this.el.dataset.points = String(this.times.length);
    // The largest value shown (the tests check that I/O reached the chart).
    let peak = 0;
    for (const v of this.values) for (const x of v) if (x !== null && x > peak) peak = x;
    this.el.dataset.peak = String(peak);
    this.draw();
  }

  /** Grey while the data is stale. */
  setStale(stale) {
    this.el.classList.toggle("stale", stale);
  }

  width() {
    return Math.max(240, Math.floor(this.el.clientWidth || 480) - 8);
  }

  draw() {
    const data = [this.times, ...this.values];
    if (!this.plot) {
      if (!this.el.isConnected || !this.times.length) return;
      this.empty.remove();
      const fmt = this.format;
      const x = { time: true };
      const timeAxis = {};
      if (this.minutes) {
        // The shown range widened to whole minutes (one at least), ticks a minute apart or more.
        x.range = (u, min, max) => {
          const from = Math.floor(min / 60) * 60;
          return [from, Math.max(Math.ceil(max / 60) * 60, from + 60)];
        };
        timeAxis.incrs = MINUTE_STEPS;
      }
      this.plot = new uPlot({
        width: this.width(),
        height: 180,
        legend: { live: true },
        cursor: { drag: { x: false, y: false } },
        scales: { x },
        axes: [timeAxis, { values: (u, ticks) => ticks.map((v) => fmt(v)), size: axisWidth }],
        // The time axis's labels as drawn, in `data-time-labels` (the browser tests read them;
        // `_values` is the vendored uPlot's own, pinned by vendor/SHA256SUMS).
        hooks: { draw: [(u) => { this.el.dataset.timeLabels = JSON.stringify(u.axes[0]._values || []); }] },
        series: [{}, ...this.series.map((s, i) => ({
          label: s.label,
          stroke: COLORS[i % COLORS.length],
          width: 1.5,
          value: (u, v) => (v === null || v === undefined ? "–" : fmt(v)),
        }))],
      }, data, this.el);
    } else {
      this.plot.setData(data);
    }
  }

  resize() {
    if (this.plot) this.plot.setSize({ width: this.width(), height: 180 });
    else if (this.times.length) this.draw();
  }

  destroy() {
    this.observer.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}

/** A horizontal bar of parts (`[{label, value, class}]`) out of `total`, with a marker. */
export function bar(parts, total, marker) {
  const el = h("div", { class: "bar", role: "img" });
  const label = [];
  for (const p of parts) {
    const seg = h("div", { class: `seg ${p.class}`, title: p.title || p.label });
    seg.style.width = `${total > 0 ? Math.min(100, (100 * p.value) / total) : 0}%`;
    el.append(seg);
    label.push(p.label);
  }
  if (marker !== undefined && marker !== null) {
    const m = h("div", { class: "marker", title: "soft threshold" });
    m.style.left = `${Math.min(100, marker * 100)}%`;
    el.append(m);
  }
  el.setAttribute("aria-label", label.join(", "));
  return el;
}
