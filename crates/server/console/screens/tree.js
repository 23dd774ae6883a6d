// Snapshots and clones as a tree: each volume under the one it was taken from, with when it
// was made and what keeping it costs (the space only it holds).

import { h, replace } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";

export function tree(root) {
  const forest = h("ul", { class: "tree" });
  replace(root,
    h("h1", { text: "Snapshots and clones" }),
    h("p", { class: "hint", text: "Each copy is listed under its source; \"own\" is the space that deleting it would free." }),
    forest);

  function node(v, children) {
    const kids = children.get(v.id) || [];
    return h("li", { data: { volume: v.name } },
      h("a", { href: `#/volumes/${encodeURIComponent(v.name)}`, text: v.name }),
      h("span", { class: "tag", text: v.kind === "snapshot" ? "snapshot" : v.source_id ? "clone" : "volume" }),
      h("span", { class: "hint", text: ` ${fmt.dateTime(v.created_ms)} · ${fmt.bytes(v.mapped_bytes)} mapped · ${fmt.bytes(v.physical_bytes)} own` }),
      kids.length ? h("ul", null, kids.map((k) => node(k, children))) : null);
  }

  async function tick(signal) {
    const vols = await api.get("/api/v1/volumes", signal);
    const key = JSON.stringify(vols.map((v) => [v.name, v.source_id, v.mapped_bytes, v.physical_bytes]));
    if (forest.dataset.key === key) return;
    forest.dataset.key = key;
    const ids = new Set(vols.map((v) => v.id));
    const children = new Map();
    const roots = [];
    for (const v of vols) {
      if (v.source_id && ids.has(v.source_id)) {
        if (!children.has(v.source_id)) children.set(v.source_id, []);
        children.get(v.source_id).push(v);
      } else {
        roots.push(v);
      }
    }
    const byTime = (a, b) => (a.created_ms || 0) - (b.created_ms || 0);
    roots.sort(byTime);
    for (const list of children.values()) list.sort(byTime);
    replace(forest, roots.map((v) => node(v, children)));
  }

  return { tick, destroy() {} };
}
