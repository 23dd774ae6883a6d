// Events and audit log: what changed, who changed it, what was refused.

import { h, replace, setText } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";

/** Rows kept on the page: the server keeps 1,000 in memory and the rest on disk. */
const KEEP = 100;

export function eventRow() {
  return h("tr", null, h("td", { class: "time" }), h("td", { class: "severity" }),
    h("td", { class: "kind" }), h("td", { class: "message" }), h("td", { class: "actor" }));
}

export function updateEventRow(row, e) {
  row.dataset.seq = String(e.seq);
  row.className = `sev-${e.severity}`;
  setText(row.children[0], fmt.dateTime(e.time_ms));
  setText(row.children[1], e.severity);
  setText(row.children[2], e.kind);
  setText(row.children[3], e.message);
  setText(row.children[4], e.actor || "");
  return row;
}

export function events(root) {
  const body = h("tbody");
  replace(root,
    h("h1", { text: "Events" }),
    h("p", { class: "hint", text: `The newest ${KEEP}; the array keeps its log in events.jsonl in its data directory.` }),
    h("table", { class: "list events" },
      h("thead", null, h("tr", null, ["time", "severity", "kind", "what", "by"].map((t) => h("th", { text: t })))),
      body));
  let after = null;

  async function tick(signal) {
    const ev = await api.get(after === null ? `/api/v1/events?limit=${KEEP}` : `/api/v1/events?after=${after}`, signal);
    after = ev.next;
    for (const e of ev.events) body.prepend(updateEventRow(eventRow(), e));
    while (body.children.length > KEEP) body.lastElementChild.remove();
  }

  return { tick, destroy() {} };
}
