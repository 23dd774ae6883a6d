// DOM helpers. Text reaches the page only through text nodes and attributes: there is no
// HTML string anywhere in the console (the CSP's Trusted Types rule would refuse one).

/** An element: `h("td", {class: "num", data: {value: 3}, on: {click}}, "text", child)`. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "on") {
        for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      } else if (k === "data") {
        for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv);
      } else if (k === "text") {
        el.textContent = String(v);
      } else if (k === "value") {
        el.value = v;
      } else if (k === "checked" || k === "disabled" || k === "selected") {
        el[k] = Boolean(v);
      } else if (k === "style") {
        throw new Error("styles go through classes or the CSSOM, never attributes");
      } else {
        el.setAttribute(k, v === true ? "" : String(v));
      }
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replace the children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Set the text of `el` only when it changed (no layout work on every poll). */
export function setText(el, text) {
  const t = String(text);
  if (el.textContent !== t) el.textContent = t;
}

/**
 * Keep `tbody` in step with `items`: one row per key, rows built by `build(item)` once and
 * refreshed by `update(row, item)`, removed when their item goes, in the items' order.
 */
export function syncRows(tbody, items, key, build, update) {
  const old = new Map();
  for (const row of tbody.children) old.set(row.dataset.key, row);
  let at = 0;
  for (const item of items) {
    const k = String(key(item));
    let row = old.get(k);
    if (row) old.delete(k);
    else {
      row = build(item);
      row.dataset.key = k;
      labelCells(tbody, row);
    }
    update(row, item);
    if (tbody.children[at] !== row) tbody.insertBefore(row, tbody.children[at] || null);
    at++;
  }
  for (const row of old.values()) row.remove();
}

/** Each cell of a new row carries its column's header as `data-label`: on a phone-sized
 * screen a table marked `stack` shows each row as a card of "label value" lines, so no
 * column (the actions last of all) ends up off-screen. */
function labelCells(tbody, row) {
  const head = tbody.parentElement && tbody.parentElement.tHead;
  if (!head || !head.rows.length) return;
  const names = [...head.rows[0].cells].map((c) => c.textContent);
  [...row.cells].forEach((cell, i) => {
    if (names[i]) cell.dataset.label = names[i];
  });
}

/** A labelled form field. */
export function field(label, input, hint) {
  return h("label", { class: "field" }, h("span", { class: "label", text: label }), input,
    hint ? h("span", { class: "hint", text: hint }) : null);
}

/** The place where an action's error sentence is shown, next to its control. */
export function errorSlot() {
  return h("p", { class: "error", role: "alert", hidden: true });
}

export function showError(slot, message) {
  if (message) {
    slot.textContent = message;
    slot.hidden = false;
  } else {
    slot.textContent = "";
    slot.hidden = true;
  }
}
