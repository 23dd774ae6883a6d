// One volume: how to connect to it, its space, live charts, its commands by class with their
// latency histogram, its VAAI counters, its snapshots and clones, and its actions.

import { h, replace, setText, syncRows } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";
import { figure, setFigure, ioCharts } from "./dashboard.js";
import { volumeActions } from "./volumes.js";

/** The volume ring keeps 60 points of 5 s: five minutes. */
const POINTS = 60;

function portalText(portal) {
  // A wildcard listen address is reached by the name this page was loaded from.
  const m = /^(0\.0\.0\.0|\[::\]):(\d+)$/.exec(portal);
  return m ? `${location.hostname}:${m[2]}` : portal;
}

export function snippets(targetName, portals) {
  const p = portalText(portals[0] || "127.0.0.1:3260");
  const host = p.replace(/:\d+$/, "");
  const port = (/:(\d+)$/.exec(p) || [null, "3260"])[1];
  return [
    ["VMware ESXi", [
      `esxcli iscsi adapter discovery sendtarget add -A vmhba64 -a ${p}`,
      "esxcli storage core adapter rescan -A vmhba64",
    ]],
    ["Linux (open-iscsi)", [
      `iscsiadm -m discovery -t sendtargets -p ${p}`,
      `iscsiadm -m node -T ${targetName} -p ${p} --login`,
    ]],
    ["Windows (PowerShell)", [
      `New-IscsiTargetPortal -TargetPortalAddress ${host} -TargetPortalPortNumber ${port}`,
      `Connect-IscsiTarget -NodeAddress ${targetName} -IsPersistent $true`,
    ]],
  ];
}

function copyButton(text) {
  return h("button", { type: "button", class: "small", text: "Copy", on: {
    click: (ev) => {
      navigator.clipboard.writeText(text()).then(
        () => setText(ev.target, "Copied"),
        () => setText(ev.target, "Copy failed"));
    },
  } });
}

/** A latency histogram as one row of bars (bucket bounds in each bar's tooltip). */
function histogram(bounds, buckets) {
  const top = Math.max(1, ...buckets);
  const bars = h("div", { class: "histogram", role: "img" });
  const parts = [];
  buckets.forEach((n, i) => {
    const label = i < bounds.length ? `≤ ${fmt.micros(bounds[i])}` : `> ${fmt.micros(bounds[bounds.length - 1])}`;
    const bar = h("div", { class: n ? "bucket used" : "bucket", title: `${label}: ${n}` });
    bar.style.height = `${n ? Math.max(8, (100 * n) / top) : 4}%`;
    bars.append(bar);
    if (n) parts.push(`${label}: ${n}`);
  });
  bars.setAttribute("aria-label", parts.join(", ") || "no commands");
  return h("div", { class: "histo" }, bars,
    h("div", { class: "axis" }, h("span", { text: fmt.micros(bounds[0]) }), h("span", { text: `> ${fmt.micros(bounds[bounds.length - 1])}` })));
}

export function volume(root, ctx, name) {
  const title = h("h1", { text: `Volume ${name}` });
  const missing = h("p", { class: "banner error", hidden: true });
  const connect = h("div", { class: "panel connect" });
  const figures = h("div", { class: "figures" },
    figure("provisioned", "provisioned_bytes"),
    figure("mapped", "mapped_bytes", "logical data written"),
    figure("physical", "physical_bytes", "stored only for this volume"),
    figure("shared", "shared_bytes", "stored once, used by others too"),
    figure("data reduction", "data_reduction"),
    figure("thin provisioning", "thin_provisioning", "provisioned / mapped"),
    figure("write cache", "write_cache"));
  const charts = ioCharts(POINTS);
  const classes = h("tbody");
  const vaai = h("tbody");
  const family = h("ul", { class: "tree" });
  const actions = h("div", { class: "panel" });
  replace(root, title, missing, connect,
    h("div", { class: "panel" }, h("h2", { text: "Space" }), figures),
    h("div", { class: "grid charts" }, charts.map((c) => c.el)),
    h("div", { class: "panel" }, h("h2", { text: "Commands by class (since start)" }),
      h("table", { class: "list stack classes" },
        h("thead", null, h("tr", null, ["class", "commands", "errors", "bytes", "avg latency", "latency histogram"].map((t) => h("th", { text: t })))),
        classes)),
    h("div", { class: "grid" },
      h("div", { class: "panel" }, h("h2", { text: "VAAI (since start)" }), h("table", { class: "vaai" }, vaai)),
      h("div", { class: "panel" }, h("h2", { text: "Snapshots and clones" }), family)),
    actions);

  let array = null;
  let since = 0;
  let actionsFor = null;
  const path = `/api/v1/volumes/${api.enc(name)}`;

  async function tick(signal) {
    if (!array) array = await api.get("/api/v1/array", signal);
    const all = await api.get("/api/v1/volumes", signal);
    const v = all.find((x) => x.name === name);
    if (!v) {
      missing.hidden = false;
      setText(missing, `There is no volume named ${name} (deleted or renamed).`);
      return;
    }
    missing.hidden = true;
    const hostNames = (await api.get("/api/v1/hosts", signal)).map((x) => x.name);
    const hist = await api.get(`${path}/history?since=${since}`, signal);
    if (hist.points.length) {
      since = hist.points[hist.points.length - 1].time_ms;
      for (const c of charts) c.add(hist.points);
    }
    const stats = await api.get("/api/v1/stats", signal);

    // Connect panel.
    const key = JSON.stringify(v.connections);
    if (connect.dataset.key !== key) {
      connect.dataset.key = key;
      replace(connect, h("h2", { text: "Connect" }),
        v.connections.length
          ? h("ul", null, v.connections.map((c) => h("li", null,
            h("code", { text: c.url }), " ", copyButton(() => c.url), ` host ${c.host}, LUN ${c.lun}`)))
          : h("p", { text: "Not connected to any host yet: connect it below, then log in from the host." }),
        h("p", { class: "hint", text: `Target ${array.target_name}` }),
        snippets(array.target_name, array.portals).map(([os, lines]) => h("details", null,
          h("summary", { text: os }),
          h("pre", { text: lines.join("\n") }),
          copyButton(() => lines.join("\n")))));
    }

    setFigure(root, "provisioned_bytes", v.provisioned_bytes, fmt.bytes(v.provisioned_bytes));
    setFigure(root, "mapped_bytes", v.mapped_bytes, fmt.bytes(v.mapped_bytes));
    setFigure(root, "physical_bytes", v.physical_bytes, fmt.bytes(v.physical_bytes));
    setFigure(root, "shared_bytes", v.shared_bytes, fmt.bytes(v.shared_bytes));
    setFigure(root, "data_reduction", v.data_reduction, fmt.ratio(v.data_reduction));
    setFigure(root, "thin_provisioning", v.thin_provisioning, fmt.ratio(v.thin_provisioning));
    setFigure(root, "write_cache", v.write_cache, v.write_cache,
      v.write_cache === v.write_cache_saved
        ? (v.write_cache === "write-through" ? "durable before answered" : "durable at the host's flush")
        : `set by a host until restart (saved: ${v.write_cache_saved})`);

    const s = stats.volumes.find((x) => x.name === name);
    if (s) {
      syncRows(classes, Object.entries(s.classes), ([c]) => c,
        ([c]) => h("tr", null, h("th", { text: c }), h("td", { class: "num" }), h("td", { class: "num" }),
          h("td", { class: "num" }), h("td", { class: "num" }), h("td")),
        (row, [, c]) => {
          setText(row.children[1], String(c.commands));
          setText(row.children[2], String(c.errors));
          setText(row.children[3], fmt.bytes(c.bytes));
          setText(row.children[4], c.commands ? fmt.micros(c.latency_sum_us / c.commands) : "–");
          const k = c.latency_buckets.join(",");
          if (row.children[5].dataset.key !== k) {
            row.children[5].dataset.key = k;
            replace(row.children[5], histogram(stats.latency_bounds_us, c.latency_buckets));
          }
        });
      const counters = [
        ["ATS", s.vaai.ats], ["ATSF", s.vaai.ats_failed], ["CLONE_RD", s.vaai.clone_read],
        ["CLONE_WR", s.vaai.clone_write], ["CLONE_F", s.vaai.clone_failed], ["ZERO", s.vaai.zero],
        ["ZERO_F", s.vaai.zero_failed], ["DELETE", s.vaai.delete], ["DELETE_F", s.vaai.delete_failed],
        ["MBDEL", (s.vaai.deleted_bytes / 2 ** 20).toFixed(1)],
      ];
      syncRows(vaai, counters, ([n]) => n,
        ([n]) => h("tr", { data: { vaai: n } }, h("th", { text: n }), h("td", { class: "num" })),
        (row, [, value]) => {
          row.children[1].dataset.value = String(value);
          setText(row.children[1], String(value));
        });
    }

    const kids = all.filter((x) => x.source_id === v.id);
    syncRows(family, kids, (x) => x.name,
      (x) => h("li", null, h("a", { href: `#/volumes/${encodeURIComponent(x.name)}`, text: x.name }), h("span", { class: "hint" })),
      (li, x) => setText(li.children[1], ` ${x.kind === "snapshot" ? "snapshot" : "clone"}, ${fmt.dateTime(x.created_ms)}, ${fmt.bytes(x.physical_bytes)} of its own`));

    const actionsKey = JSON.stringify([v.connections, hostNames, v.read_only, v.write_cache]);
    if (actionsFor !== actionsKey) {
      actionsFor = actionsKey;
      replace(actions, h("h2", { text: "Actions" }), volumeActions(v, hostNames, ctx,
        () => ctx.go("#/volumes"),
        (renamed) => {
          if (renamed !== name) ctx.go(`#/volumes/${encodeURIComponent(renamed)}`);
        }));
    }
  }

  return {
    tick,
    setStale: (stale) => charts.forEach((c) => c.setStale(stale)),
    destroy: () => charts.forEach((c) => c.destroy()),
  };
}
