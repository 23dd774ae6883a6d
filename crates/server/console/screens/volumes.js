// Volumes: the table, create, and each volume's actions (resize, rename, snapshot, clone,
// connect, disconnect, delete with its name typed). Every failure shows the API's sentence
// beside the control and keeps what was typed.

import { h, replace, setText, syncRows, field, errorSlot, showError } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";

/** A small form: `fields` [{name, label, input}], `submit(values) -> Promise`. */
export function actionForm(title, fields, submitLabel, submit, extra) {
  const error = errorSlot();
  const button = h("button", { type: "submit", text: submitLabel });
  const form = h("form", { class: "action", data: { action: title } },
    h("h3", { text: title }),
    extra || null,
    fields.map((f) => field(f.label, f.input, f.hint)),
    h("div", { class: "buttons" }, button),
    error);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    button.disabled = true;
    showError(error, null);
    try {
      await submit();
    } catch (e) {
      showError(error, e.message);
    } finally {
      button.disabled = false;
    }
  });
  form.error = error;
  return form;
}

export function input(name, attrs) {
  return h("input", { name, autocomplete: "off", ...attrs });
}

/** What each write cache setting means, for the hosts that may use it. */
export const WRITE_CACHE = [
  ["write-through", "write-through: every write durable before it is answered (any host, ESXi included)"],
  ["write-back", "write-back: durable at the host's flush (only hosts that flush: Linux, QEMU/Proxmox, Windows)"],
];

function writeCacheSelect(value) {
  return h("select", { name: "write_cache" }, WRITE_CACHE.map(([v, text]) =>
    h("option", { value: v, text, selected: v === value })));
}

/** The actions on one volume, in a panel under the table (volume screen uses them too). */
export function volumeActions(v, hostNames, ctx, afterDelete, afterChange) {
  const path = `/api/v1/volumes/${api.enc(v.name)}`;
  const done = (renamed) => {
    afterChange(renamed || v.name);
    ctx.refresh();
  };
  const forms = [];
  if (!v.read_only) {
    const size = input("size", { value: fmt.bytes(v.provisioned_bytes).replace(" ", ""), required: true });
    forms.push(actionForm("Resize", [{ label: "new size (grow only)", input: size, hint: "e.g. 200G, 1.5T" }], "Resize", async () => {
      const bytes = fmt.parseSize(size.value);
      if (bytes === null) throw new Error(`'${size.value}' is not a size (e.g. 200G)`);
      await api.send("PATCH", path, { size_bytes: bytes });
      done();
    }));
  }
  if (!v.read_only) {
    const cache = writeCacheSelect(v.write_cache);
    forms.push(actionForm("Write cache", [{ label: "answer writes", input: cache, hint: "connected hosts are told at once" }], "Set", async () => {
      await api.send("PATCH", path, { write_cache: cache.value });
      done();
    }));
  }
  const newName = input("name", { value: v.name, required: true });
  forms.push(actionForm("Rename", [{ label: "new name", input: newName }], "Rename", async () => {
    await api.send("PATCH", path, { name: newName.value });
    done(newName.value);
  }));
  const snapName = input("snapshot", { value: `${v.name}-snap`, required: true });
  forms.push(actionForm("Snapshot", [{ label: "snapshot name", input: snapName }], "Take snapshot", async () => {
    await api.send("POST", `${path}/snapshots`, { name: snapName.value });
    done();
  }));
  const cloneName = input("clone", { value: `${v.name}-clone`, required: true });
  forms.push(actionForm("Clone", [{ label: "clone name", input: cloneName }], "Clone", async () => {
    await api.send("POST", `${path}/clones`, { name: cloneName.value });
    done();
  }));
  const host = h("select", { name: "host" }, hostNames.map((n) => h("option", { value: n, text: n })));
  const lun = input("lun", { type: "number", min: 0, max: 16383, placeholder: "next free" });
  forms.push(actionForm("Connect", [{ label: "host", input: host }, { label: "LUN", input: lun }], "Connect", async () => {
    const body = { host: host.value };
    if (lun.value !== "") body.lun = Number(lun.value);
    await api.send("POST", `${path}/connections`, body);
    done();
  }));
  if (v.connections.length) {
    const conn = h("select", { name: "connection" }, v.connections.map((c) =>
      h("option", { value: c.host, text: `${c.host} (LUN ${c.lun})` })));
    forms.push(actionForm("Disconnect", [{ label: "host", input: conn }], "Disconnect", async () => {
      await api.send("DELETE", `${path}/connections/${api.enc(conn.value)}`);
      done();
    }));
  }
  const confirm = input("confirm", { placeholder: v.name, required: true });
  forms.push(actionForm("Delete", [{ label: `type "${v.name}" to delete it and its data`, input: confirm }], "Delete", async () => {
    if (confirm.value !== v.name) throw new Error(`type the volume's name, ${v.name}, to delete it`);
    await api.send("DELETE", path);
    afterDelete();
    done();
  }));
  return h("div", { class: "actions" }, forms);
}

export function volumes(root, ctx) {
  const body = h("tbody");
  const panel = h("div", { class: "panel", hidden: true });
  const name = input("name", { required: true, placeholder: "datastore1" });
  const size = input("size", { required: true, placeholder: "100G" });
  const cache = writeCacheSelect("write-through");
  const create = actionForm("Create volume", [
    { label: "name", input: name },
    { label: "size", input: size, hint: "thin: space is used as data is written" },
    { label: "write cache", input: cache },
  ], "Create", async () => {
    const bytes = fmt.parseSize(size.value);
    if (bytes === null) throw new Error(`'${size.value}' is not a size (e.g. 100G)`);
    await api.send("POST", "/api/v1/volumes", { name: name.value, size_bytes: bytes, write_cache: cache.value });
    name.value = "";
    size.value = "";
    ctx.refresh();
  });
  const none = h("p", { class: "hint", text: "No volumes yet: create one below.", hidden: true });
  replace(root,
    h("h1", { text: "Volumes" }),
    h("div", { class: "panel" },
      h("table", { class: "list stack volumes" },
        h("thead", null, h("tr", null, ["name", "kind", "size", "mapped", "physical", "reduction", "connected to", ""].map((t) => h("th", { text: t })))),
        body),
      none),
    panel,
    h("div", { class: "panel" }, create));

  let selected = null;
  /** What the panel was built from: rebuilt when the volume's name, its connections or the
   * hosts change (an action's inputs are kept otherwise). */
  let panelKey = null;
  let hostNames = [];
  let list = [];
  const keyOf = (v) => JSON.stringify([v.name, v.read_only, v.write_cache, v.connections, hostNames]);

  function open(v) {
    selected = v.name;
    panelKey = keyOf(v);
    replace(panel, h("h2", { text: `Volume ${v.name}` }), volumeActions(v, hostNames, ctx, () => {
      selected = null;
      panel.hidden = true;
    }, (name) => {
      selected = name;
    }));
    panel.hidden = false;
  }

  async function tick(signal) {
    list = await api.get("/api/v1/volumes", signal);
    hostNames = (await api.get("/api/v1/hosts", signal)).map((x) => x.name);
    syncRows(body, list, (v) => v.name,
      (v) => h("tr", null,
        h("td", null, h("a", { href: `#/volumes/${encodeURIComponent(v.name)}`, text: v.name })),
        h("td"), h("td", { class: "num" }), h("td", { class: "num" }), h("td", { class: "num" }),
        h("td", { class: "num" }), h("td"),
        h("td", null, h("button", { type: "button", class: "small", text: "Actions", on: { click: () => open(list.find((x) => x.name === v.name) || v) } }))),
      (row, v) => {
        setText(row.children[1], v.kind);
        setText(row.children[2], fmt.bytes(v.provisioned_bytes));
        setText(row.children[3], fmt.bytes(v.mapped_bytes));
        setText(row.children[4], fmt.bytes(v.physical_bytes));
        setText(row.children[5], fmt.ratio(v.data_reduction));
        setText(row.children[6], v.connections.map((c) => `${c.host}:${c.lun}`).join(", ") || "–");
        row.children[2].dataset.value = String(v.provisioned_bytes);
      });
    none.hidden = list.length > 0;
    const current = selected && list.find((v) => v.name === selected);
    if (selected && !current) {
      selected = null;
      panel.hidden = true;
    } else if (current && keyOf(current) !== panelKey) {
      open(current);
    }
  }

  return { tick, destroy() {} };
}
