// Hosts and connections: hosts (create, edit IQNs and CHAP in place, delete), live sessions,
// initiators refused recently (one click makes a host of one), and which host sees which
// volume at which LUN. CHAP secrets go to the API and never come back: the field is emptied
// after a change succeeds.

import { h, replace, setText, syncRows } from "../dom.js";
import * as api from "../api.js";
import * as fmt from "../format.js";
import { actionForm, input } from "./volumes.js";

function iqnList(text) {
  return text.split(/[\s,]+/).map((s) => s.trim()).filter(Boolean);
}

/** A host name from an initiator name: its last part, in the characters names allow. */
export function hostNameFor(iqn) {
  const tail = iqn.split(/[:.]/).filter(Boolean).pop() || "host";
  const name = tail.replace(/[^A-Za-z0-9._-]/g, "-").replace(/^[^A-Za-z0-9]+/, "").slice(0, 63);
  return name || "host";
}

function chapFields() {
  const user = input("chap_user", { placeholder: "optional" });
  const secret = input("chap_secret", { type: "password", placeholder: "12 to 255 characters" });
  return { user, secret };
}

function editForm(host, ctx, onDone) {
  const iqns = h("textarea", { name: "iqns", rows: 2, required: true });
  iqns.value = host.iqns.join("\n");
  const { user, secret } = chapFields();
  user.value = host.chap_user || "";
  const clear = h("input", { type: "checkbox", name: "clear_chap" });
  const form = actionForm(`Edit ${host.name}`, [
    { label: "initiator names (IQN), one per line", input: iqns },
    { label: "CHAP user", input: user },
    { label: "CHAP secret (given again to change CHAP)", input: secret },
    { label: "remove CHAP", input: clear },
  ], "Save", async () => {
    const body = { iqns: iqnList(iqns.value) };
    if (clear.checked) body.clear_chap = true;
    else if (secret.value) {
      body.chap_user = user.value;
      body.chap_secret = secret.value;
    }
    await api.send("PATCH", `/api/v1/hosts/${api.enc(host.name)}`, body);
    secret.value = "";
    onDone();
    ctx.refresh();
  }, h("p", { class: "hint", text: "Sessions logged in keep their login: CHAP applies from the next one." }));
  return form;
}

export function hosts(root, ctx) {
  const hostsBody = h("tbody");
  const sessionsBody = h("tbody");
  const refusedBody = h("tbody");
  const matrix = h("table", { class: "list matrix" });
  const edit = h("div", { class: "panel", hidden: true });
  const name = input("name", { required: true, placeholder: "esx01" });
  const iqns = h("textarea", { name: "iqns", rows: 2, required: true, placeholder: "iqn.1998-01.com.vmware:esx01-1a2b3c4d" });
  const { user, secret } = chapFields();
  const create = actionForm("Create host", [
    { label: "name", input: name },
    { label: "initiator names (IQN), one per line", input: iqns },
    { label: "CHAP user", input: user },
    { label: "CHAP secret", input: secret },
  ], "Create", async () => {
    const body = { name: name.value, iqns: iqnList(iqns.value) };
    if (user.value || secret.value) {
      body.chap_user = user.value;
      body.chap_secret = secret.value;
    }
    await api.send("POST", "/api/v1/hosts", body);
    name.value = "";
    iqns.value = "";
    user.value = "";
    secret.value = "";
    ctx.refresh();
  });
  const refusedError = h("p", { class: "error", role: "alert", hidden: true });
  const noHosts = h("p", { class: "hint", hidden: true, text: "No hosts: volumes connected to * are open to every initiator." });
  const noSessions = h("p", { class: "hint", hidden: true, text: "No initiator is logged in." });
  const noRefused = h("p", { class: "hint", hidden: true, text: "None refused recently." });
  replace(root,
    h("h1", { text: "Hosts and connections" }),
    h("div", { class: "panel" }, h("h2", { text: "Hosts" }),
      h("table", { class: "list stack hosts" },
        h("thead", null, h("tr", null, ["host", "initiators", "CHAP", "volumes", ""].map((t) => h("th", { text: t })))),
        hostsBody),
      noHosts),
    edit,
    h("div", { class: "panel" }, create),
    h("div", { class: "panel" }, h("h2", { text: "Sessions" }),
      h("table", { class: "list stack sessions" },
        h("thead", null, h("tr", null, ["initiator", "host", "kind", "from", "portal", "since", "CHAP"].map((t) => h("th", { text: t })))),
        sessionsBody), noSessions),
    h("div", { class: "panel" }, h("h2", { text: "Refused initiators" }),
      h("p", { class: "hint", text: "Initiators that tried to log in or discover without belonging to a host." }),
      refusedError,
      h("table", { class: "list stack refused" },
        h("thead", null, h("tr", null, ["initiator", "from", "reason", "last", "count", ""].map((t) => h("th", { text: t })))),
        refusedBody), noRefused),
    h("div", { class: "panel" }, h("h2", { text: "Volumes × hosts (LUN)" }), matrix));

  let list = [];
  let editing = null;

  function openEdit(host) {
    editing = host.name;
    replace(edit, editForm(host, ctx, () => {
      editing = null;
      edit.hidden = true;
    }));
    edit.hidden = false;
  }

  async function remove(host, errorCell) {
    try {
      await api.send("DELETE", `/api/v1/hosts/${api.enc(host)}`);
      ctx.refresh();
    } catch (e) {
      errorCell.hidden = false;
      errorCell.textContent = e.message;
    }
  }

  async function addRefused(r) {
    refusedError.hidden = true;
    try {
      await api.send("POST", "/api/v1/hosts", { name: hostNameFor(r.initiator), iqns: [r.initiator] });
      ctx.refresh();
    } catch (e) {
      refusedError.hidden = false;
      refusedError.textContent = e.message;
    }
  }

  async function tick(signal) {
    list = await api.get("/api/v1/hosts", signal);
    const sessions = await api.get("/api/v1/sessions", signal);
    const refused = await api.get("/api/v1/initiators/refused", signal);
    const vols = await api.get("/api/v1/volumes", signal);

    syncRows(hostsBody, list, (x) => x.name,
      (x) => {
        const err = h("p", { class: "error", role: "alert", hidden: true });
        return h("tr", null, h("td", { text: x.name }), h("td"), h("td"), h("td"),
          h("td", null,
            h("button", { type: "button", class: "small", text: "Edit", on: { click: () => openEdit(list.find((y) => y.name === x.name) || x) } }),
            h("button", { type: "button", class: "small danger", text: "Delete", on: { click: () => remove(x.name, err) } }),
            err));
      },
      (row, x) => {
        setText(row.children[1], x.iqns.join(", "));
        setText(row.children[2], x.chap_user ? `user ${x.chap_user}` : "none");
        setText(row.children[3], x.volumes.join(", ") || "–");
      });
    if (editing && !list.some((x) => x.name === editing)) {
      editing = null;
      edit.hidden = true;
    }

    syncRows(sessionsBody, sessions, (s) => `${s.initiator} ${s.isid} ${s.tsih}`,
      () => h("tr", null, [0, 1, 2, 3, 4, 5, 6].map(() => h("td"))),
      (row, s) => {
        setText(row.children[0], s.alias ? `${s.initiator} (${s.alias})` : s.initiator);
        setText(row.children[1], s.host || "–");
        setText(row.children[2], s.kind);
        setText(row.children[3], s.remote);
        setText(row.children[4], s.portal);
        setText(row.children[5], fmt.dateTime(s.login_ms));
        setText(row.children[6], s.chap ? "yes" : "no");
      });

    const newest = [...refused].reverse();
    syncRows(refusedBody, newest, (r) => r.initiator,
      (r) => h("tr", null, h("td"), h("td"), h("td"), h("td"), h("td", { class: "num" }),
        h("td", null, h("button", { type: "button", class: "small", text: "Add as host", on: { click: () => addRefused(r) } }))),
      (row, r) => {
        setText(row.children[0], r.initiator);
        setText(row.children[1], r.remote);
        setText(row.children[2], r.reason);
        setText(row.children[3], fmt.dateTime(r.last_ms));
        setText(row.children[4], String(r.count));
      });

    noHosts.hidden = list.length > 0;
    noSessions.hidden = sessions.length > 0;
    noRefused.hidden = refused.length > 0;
    // Columns: every host, and * (every initiator) when a volume is connected to it.
    const columns = list.map((x) => x.name);
    if (vols.some((v) => v.connections.some((c) => c.host === "*"))) columns.unshift("*");
    const key = JSON.stringify([columns, vols.map((v) => [v.name, v.connections])]);
    if (matrix.dataset.key !== key) {
      matrix.dataset.key = key;
      replace(matrix,
        h("thead", null, h("tr", null, h("th", { text: "volume" }), columns.map((x) => h("th", { class: "num", text: x })))),
        h("tbody", null, vols.map((v) => h("tr", null, h("th", { text: v.name }), columns.map((x) => {
          const c = v.connections.find((y) => y.host === x);
          return h("td", { class: c ? "num on" : "num", text: c ? String(c.lun) : "·" });
        })))));
    }
  }

  return { tick, destroy() {} };
}
