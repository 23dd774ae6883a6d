// Figures as admins read them: binary units for space (as the API's sizes and the CLI),
// decimal for rates (as esxtop and fio), ratios as "4.2:1".

const IEC = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  let v = Number(n);
  let i = 0;
  while (Math.abs(v) >= 1024 && i < IEC.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)} ${IEC[i]}`;
}

export function rate(bytesPerSecond) {
  if (bytesPerSecond === null || bytesPerSecond === undefined) return "–";
  const v = Number(bytesPerSecond) / 1e6;
  return `${v < 10 ? v.toFixed(2) : v.toFixed(1)} MB/s`;
}

export function count(n) {
  if (n === null || n === undefined) return "–";
  const v = Number(n);
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)} M`;
  if (v >= 1e4) return `${(v / 1e3).toFixed(1)} k`;
  return v < 10 && !Number.isInteger(v) ? v.toFixed(1) : v.toFixed(0);
}

export function ratio(r) {
  if (r === null || r === undefined || !Number.isFinite(r) || r <= 0) return "–";
  return `${r < 10 ? r.toFixed(1) : r.toFixed(0)}:1`;
}

export function percent(share) {
  if (share === null || share === undefined || !Number.isFinite(share)) return "–";
  return `${(share * 100).toFixed(share < 0.1 ? 1 : 0)} %`;
}

export function micros(us) {
  if (us === null || us === undefined) return "–";
  const v = Number(us);
  if (v >= 1e6) return `${(v / 1e6).toFixed(2)} s`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(v >= 1e4 ? 0 : 1)} ms`;
  return `${v.toFixed(0)} µs`;
}

export function clock(ms) {
  if (!ms) return "–";
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

export function dateTime(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  return `${d.toLocaleDateString()} ${d.toLocaleTimeString([], { hour12: false })}`;
}

/** "1.5T", "100G", "512M" or a byte count into bytes; null when not a size. */
export function parseSize(text) {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)?\s*$/i.exec(text);
  if (!m) return null;
  const power = { "": 0, k: 1, m: 2, g: 3, t: 4, p: 5 }[m[2].toLowerCase()];
  const v = Number(m[1]) * 1024 ** power;
  return Number.isFinite(v) && v > 0 ? Math.round(v) : null;
}
