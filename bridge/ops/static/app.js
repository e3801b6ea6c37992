// The status page: reads /status (any token: it answers each with what that token may see) and,
// for admins, /admin/sessions; polls every 2 s.
// Data only ever reaches the page as text (textContent), never as markup.
"use strict";

const POLL_MS = 2000;
const KEY = "mcp-bridge-token";
const $ = (id) => document.getElementById(id);
let timer = null;
let admin = null; // asked once per sign-in: a viewer's refusal is logged by the bridge, so not every poll

function headers() {
  const token = sessionStorage.getItem(KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

async function api(method, path, json) {
  // Relative: the page works wherever a proxy mounts the bridge.
  const init = { method, headers: headers(), cache: "no-store", credentials: "omit" };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  }
  const response = await fetch(path, init);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  return { status: response.status, body };
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

function seconds(s) {
  if (s === null || s === undefined) return "-";
  if (s < 90) return Math.round(s) + "s";
  if (s < 5400) return Math.round(s / 60) + "m";
  return Math.round(s / 3600) + "h";
}

function renderServers(servers) {
  const body = $("servers").tBodies[0];
  body.replaceChildren();
  for (const [name, s] of Object.entries(servers)) {
    const row = document.createElement("tr");
    row.dataset.server = name;
    cell(row, name, "name");
    cell(row, s.mode);
    cell(row, s.ready ? "ready" : "not ready", s.ready ? "ok" : "bad");
    cell(row, s.sessions, "num sessions");
    cell(row, s.in_flight, "num");
    cell(row, s.processes.map((p) =>
      `${p.pid ?? "-"} ${p.state}${p.uptime_s != null ? " " + seconds(p.uptime_s) : ""}${p.failure ? " (" + p.failure + ")" : ""}`).join("\n") || "none", "lines");
    cell(row, s.processes.reduce((n, p) => n + p.restarts, 0), "num restarts");
    if (admin) {
      // Only admins get a process's stderr (a shared process's mixes every principal's traffic).
      const stderr = cell(row, "", "stderr");
      const pre = document.createElement("pre");
      pre.textContent = s.processes.flatMap((p) => (p.stderr_tail ?? []).slice(-5)).join("\n");
      stderr.replaceChildren(pre);
      const actions = cell(row, "");
      actions.replaceChildren(button("Restart", () => act("POST", `admin/servers/${encodeURIComponent(name)}/restart`, `restart ${name}`)));
    }
    body.appendChild(row);
  }
}

function renderGroups(groups) {
  // An admin sees every group, its readiness and sessions by transport; a token without the
  // admin role, the groups it may use, the members it may use and its own session count.
  $("groups-part").hidden = !groups || Object.keys(groups).length === 0;
  const body = $("groups").tBodies[0];
  body.replaceChildren();
  for (const [name, g] of Object.entries(groups ?? {})) {
    const row = document.createElement("tr");
    row.dataset.group = name;
    cell(row, name, "name");
    cell(row, g.members.join(", "));
    cell(row, g.ready === undefined ? "-" : g.ready ? "ready" : `not ready: ${g.not_ready}`, g.ready === false ? "bad" : "ok");
    cell(row, typeof g.sessions === "number" ? g.sessions : Object.values(g.sessions).reduce((n, k) => n + k, 0), "num sessions");
    body.appendChild(row);
  }
}

function renderSessions(sessions) {
  const body = $("sessions").tBodies[0];
  body.replaceChildren();
  for (const s of sessions) {
    const row = document.createElement("tr");
    row.dataset.session = s.id;
    cell(row, s.id, "mono");  // whole: what `mcp-bridge ctl end` takes (or any unique prefix of it)
    cell(row, s.server);
    cell(row, s.principal);
    cell(row, s.transport);
    cell(row, s.protocol_version);
    cell(row, seconds(s.age_s), "num");
    cell(row, s.in_flight, "num");
    cell(row, seconds(s.idle_s), "num");
    const actions = cell(row, "");
    actions.replaceChildren(button("End", () => act("DELETE", `admin/sessions/${encodeURIComponent(s.id)}`, `end session ${s.id}`)));
    body.appendChild(row);
  }
}

function renderPins(servers) {
  // Admins only: /status gives the pending items of pinned servers to them alone.
  const body = $("pins").tBodies[0];
  body.replaceChildren();
  for (const [name, s] of Object.entries(servers)) {
    for (const p of s.pins?.pending ?? []) {
      const row = document.createElement("tr");
      row.dataset.pin = `${name} ${p.kind} ${p.name}`;
      cell(row, name, "name");
      cell(row, p.kind);
      cell(row, p.name, "mono");
      cell(row, p.status, p.status === "pending" ? "bad" : "");
      cell(row, p.changed.join(", "));
      const actions = cell(row, "");
      const path = `admin/pins/${encodeURIComponent(name)}`;
      const names = { names: [p.name] };
      actions.replaceChildren(
        button("Approve", () => act("POST", `${path}/approve`, `approve ${p.kind} ${p.name} of ${name}`, names)),
        button("Reject", () => act("POST", `${path}/reject`, `reject ${p.kind} ${p.name} of ${name}`, names)));
      body.appendChild(row);
    }
  }
  $("pins-part").hidden = body.rows.length === 0;
}

async function act(method, path, what, json) {
  if (!window.confirm(`Really ${what}?`)) return;
  const { status, body } = await api(method, path, json);
  $("error").textContent = status < 400 ? "" : `${what}: ${status} ${body?.error?.message ?? ""}`;
  refresh();
}

function showSignIn(message) {
  clearTimeout(timer);
  $("status").hidden = true;
  $("signin").hidden = false;
  $("signout").hidden = sessionStorage.getItem(KEY) === null;
  $("viewer").textContent = "";
  $("signin-error").textContent = message;
}

async function refresh() {
  clearTimeout(timer);
  try {
    const status = await api("GET", "status");
    if (status.status === 401 || status.status === 403) {
      const refused = sessionStorage.getItem(KEY) !== null;
      sessionStorage.removeItem(KEY);
      admin = null;
      showSignIn(refused ? "That token was refused." : "");
      return;
    }
    if (status.status !== 200) throw new Error(`status: ${status.status}`);
    const sessions = admin === false ? null : await api("GET", "admin/sessions");
    admin = sessions !== null && sessions.status === 200;
    $("signin").hidden = true;
    $("status").hidden = false;
    $("signout").hidden = sessionStorage.getItem(KEY) === null;
    $("viewer").textContent = admin ? "admin" : "read-only";
    for (const el of document.querySelectorAll(".admin")) el.hidden = !admin;
    $("sessions-part").hidden = !admin;
    renderServers(status.body.servers);
    renderGroups(status.body.groups);
    if (admin) renderSessions(sessions.body.sessions);
    if (admin) renderPins(status.body.servers);
    else $("pins-part").hidden = true;
    $("updated").textContent = new Date().toLocaleTimeString();
    $("error").textContent = "";
  } catch (e) {
    $("error").textContent = `Cannot reach the bridge: ${e.message}`;
  }
  timer = setTimeout(refresh, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    admin = null;
    refresh();
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    admin = null;
    showSignIn("");
  });
  $("reload").addEventListener("click", () => act("POST", "admin/reload", "reload the config"));
  refresh();
});
