// Off-site copy (RFC 0003): how far the object store is behind, its error, the restore
// points (take a named one, delete one), and the command that restores each elsewhere.
// Without a copy configured: how to configure one. An array restored on demand and still
// fetching its data from the store shows that first: what is left, the reads that waited.

import { h, replace, setText, syncRows } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";
import { figure, setFigure } from "./dashboard.js";
import { actionForm, input } from "./volumes.js";

/** The `sliver restore` command for `point` (null: the newest state) of the copy at `target`. */
export function restoreCommand(target, point) {
  const at = point ? ` --point ${point}` : "";
  return `sliver restore --from ${target}${at} --data-dir NEW-DIR [--s3-endpoint URL]`;
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 120) return `${s} s ago`;
  if (s < 7200) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

export function copy(root, ctx) {
  const notConfigured = h("div", { class: "panel", hidden: true, data: { copy: "none" } },
    h("h2", { text: "No off-site copy" }),
    h("p", { text: "This array ships no copy. Start it with --replicate-to s3://BUCKET/PREFIX (and --s3-endpoint for stores other than AWS), or give it a [replication] section:" }),
    h("pre", { class: "document", text: '[replication]\nto = "s3://BUCKET/PREFIX"\nendpoint = "http://store:8333"\npoints_every = "1h"\nkeep_points = 24' }));
  const error = h("div", { class: "banner error", role: "alert", hidden: true, data: { copy: "error" } });
  const figures = h("div", { class: "figures" },
    figure("state", "state"),
    figure("lag", "lag_seconds", "age of the oldest write the store does not hold yet"),
    figure("backlog", "backlog_bytes", "writes waiting for the store (held in RAM)"),
    figure("shipped", "shipped_bytes", "since start"),
    figure("restarts", "resyncs", "times the backlog bound made the copy start over"),
    figure("deleted by retention", "deleted_objects", "objects no restore point needed, since start"),
    figure("newest restore point", "newest_point"));
  const target = h("p", { class: "hint", data: { copy: "target" } });
  const pointsBody = h("tbody");
  const newName = input("name", { required: true, placeholder: "before-upgrade" });
  const take = actionForm("Take a restore point", [{
    label: "name", input: newName,
    hint: "letters, digits, . _ - :; kept until you delete it",
  }], "Take point", async () => {
    await api.send("POST", "/api/v1/replication/points", { name: newName.value });
    newName.value = "";
    ctx.refresh();
  });
  const newest = h("code", { data: { copy: "restore-newest" } });
  const configured = h("div", { hidden: true, data: { copy: "configured" } },
    error,
    h("div", { class: "panel" }, h("h2", { text: "Copy" }), target, figures),
    h("div", { class: "panel" }, h("h2", { text: "Restore points" }),
      h("table", { class: "list stack points" },
        h("thead", null, h("tr", null, ["name", "time (UTC)", "kind", "objects", "restore", ""].map((t) => h("th", { text: t })))),
        pointsBody),
      h("p", { class: "hint" }, "The newest state: ", newest)),
    h("div", { class: "panel" }, take));
  const hydrationError = h("div", { class: "banner error", role: "alert", hidden: true, data: { hydration: "error" } });
  const hydrationFigures = h("div", { class: "figures" },
    figure("still in the store", "bytes_left", "fetched when read, and in the background"),
    figure("fetched", "fetched_bytes", "since start"),
    figure("reads that waited", "on_demand_fetches", "reads of data not yet local"),
    figure("background rate", "rate"));
  const hydrationSource = h("p", { class: "hint", data: { hydration: "source" } });
  const hydration = h("div", { class: "panel", hidden: true, data: { hydration: "active" } },
    h("h2", { text: "Restore in progress" }),
    hydrationSource, hydrationError, hydrationFigures,
    h("p", { class: "hint", text: "The array serves while its data comes from the store it was restored from; keep that store reachable until nothing is left. An off-site copy of this array can start once it is done." }));
  replace(root, h("h1", { text: "Off-site copy" }), hydration, notConfigured, configured);
  let targetUrl = "";

  function pointRow(p) {
    const del = h("button", { type: "button", text: "Delete", data: { delete: p.name } });
    const slot = h("span", { class: "error", role: "alert", hidden: true });
    del.addEventListener("click", async () => {
      del.disabled = true;
      slot.hidden = true;
      try {
        await api.send("DELETE", `/api/v1/replication/points/${api.enc(p.name)}`);
        ctx.refresh();
      } catch (e) {
        setText(slot, e.message);
        slot.hidden = false;
        del.disabled = false;
      }
    });
    return h("tr", { data: { point: p.name } },
      h("td", { class: "name" }), h("td", { class: "time" }), h("td", { class: "kind" }),
      h("td", { class: "num objects" }), h("td", null, h("code", { class: "command" })),
      h("td", null, del, slot));
  }

  function updatePoint(row, p) {
    setText(row.querySelector(".name"), p.name);
    setText(row.querySelector(".time"), p.time);
    setText(row.querySelector(".kind"), p.scheduled ? "scheduled" : "named");
    setText(row.querySelector(".objects"), `${p.base}..${p.through}`);
    setText(row.querySelector(".command"), restoreCommand(targetUrl, p.name));
  }

  async function tick(signal) {
    const hy = await api.get("/api/v1/hydration", signal);
    hydration.hidden = !hy.active || hy.done;
    if (hy.active && !hy.done) {
      const pct = hy.bytes_at_start ? Math.round(100 * (1 - hy.bytes_left / hy.bytes_at_start)) : 100;
      setText(hydrationSource, `from ${hy.source}: ${pct}% of what was left at start is local`);
      hydrationError.hidden = !hy.error;
      setText(hydrationError, hy.error ? `Fetching: ${hy.error}` : "");
      setFigure(hydrationFigures, "bytes_left", hy.bytes_left, fmt.bytes(hy.bytes_left));
      setFigure(hydrationFigures, "fetched_bytes", hy.fetched_bytes, fmt.bytes(hy.fetched_bytes));
      setFigure(hydrationFigures, "on_demand_fetches", hy.on_demand_fetches, fmt.count(hy.on_demand_fetches),
        `${fmt.bytes(hy.on_demand_bytes)} they needed`);
      setFigure(hydrationFigures, "rate", hy.rate, `${fmt.bytes(hy.rate)}/s`);
    }
    const r = await api.get("/api/v1/replication", signal);
    notConfigured.hidden = r.configured;
    configured.hidden = !r.configured;
    if (!r.configured) return;
    targetUrl = r.target;
    setText(target, `to ${r.target}, array ${r.pool}`);
    error.hidden = !r.error;
    setText(error, r.error ? `The copy: ${r.error}` : "");
    setFigure(figures, "state", r.state, r.state);
    setFigure(figures, "lag_seconds", r.lag_seconds, `${r.lag_seconds.toFixed(1)} s`);
    setFigure(figures, "backlog_bytes", r.backlog_bytes, fmt.bytes(r.backlog_bytes));
    setFigure(figures, "shipped_bytes", r.shipped_bytes, fmt.bytes(r.shipped_bytes),
      `${fmt.count(r.shipped_objects)} objects since start, through object ${r.shipped_through}`);
    setFigure(figures, "resyncs", r.resyncs, String(r.resyncs));
    setFigure(figures, "deleted_objects", r.deleted_objects, fmt.count(r.deleted_objects));
    const p = r.newest_point;
    setFigure(figures, "newest_point", p ? p.name : "", p ? p.name : "none yet",
      p ? `${p.time} (${ago(p.time_ms)})` : "scheduled points come every points_every");
    setText(newest, restoreCommand(r.target, null));
    const points = await api.get("/api/v1/replication/points", signal);
    syncRows(pointsBody, points.slice().reverse(), (q) => q.name, pointRow, updatePoint);
  }

  return { tick, destroy() {} };
}
