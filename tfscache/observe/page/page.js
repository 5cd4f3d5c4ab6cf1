// The status page's script (docs/status-page.md): every REFRESH_MS it fetches /status and the
// timeline's new events (/status/events?since=SEQ) and updates the page in place. Read-only.
// With 10,000 models only one page of PAGE_SIZE rows is in the DOM, filtered by the search box.
"use strict";

const REFRESH_MS = 1500;
const PAGE_SIZE = 50;
const TIMELINE_ROWS = 500;  // the server keeps 500 events (tfscache.observe.timeline)

const view = { token: sessionStorage.getItem("tfscache-token") || "", status: null, seq: 0,
  page: 0, search: "", node: "", waitingForToken: false, timer: null };

const $ = (id) => document.getElementById(id);

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function ago(seconds) {
  if (!seconds) return "-";
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 120) return s.toFixed(1) + " s ago";
  if (s < 7200) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (className) td.className = className;
  return td;
}

// A used-against-cap cell: a bar when there is a cap, the use alone when there is none (0).
function barCell(row, used, cap, format) {
  const td = row.insertCell();
  if (cap) {
    const bar = document.createElement("span");
    bar.className = used >= cap ? "bar full" : "bar";
    const fill = document.createElement("span");
    fill.style.width = Math.min(100, (100 * used) / cap).toFixed(1) + "%";
    bar.appendChild(fill);
    td.appendChild(bar);
    td.appendChild(document.createTextNode(format(used) + " / " + format(cap)));
  } else {
    td.textContent = used === null || used === undefined ? "-" : format(used) + " (no cap)";
  }
  return td;
}

async function getJSON(path) {
  const headers = view.token ? { Authorization: "Bearer " + view.token } : {};
  const reply = await fetch(path, { headers, cache: "no-store" });
  if (reply.status === 401) {
    const body = await reply.json().catch(() => ({}));
    throw Object.assign(new Error(body.error || "admin token required"), { status: 401 });
  }
  if (!reply.ok) throw new Error(path + ": HTTP " + reply.status);
  return reply.json();
}

function renderSummary(doc) {
  $("hit-ratio").textContent =
    doc.hit_ratio === null ? "-" : (100 * doc.hit_ratio).toFixed(1) + " %";
  $("hits").textContent = doc.hits + " hits, " + doc.misses + " misses";
  const advice = { "1": "+1 more nodes", "0": "hold", "-1": "-1 fewer nodes" };
  $("scale-advice").textContent = doc.scale ? advice[String(doc.scale.advice)] || doc.scale.advice
    : "-";
  $("scale-reason").textContent = doc.scale ? doc.scale.reason : "";
  const tier = doc.disk_tier;
  $("disk-tier").textContent = tier
    ? bytes(tier.bytes) + (tier.cap_bytes ? " / " + bytes(tier.cap_bytes) : "") : "none";
  $("disk-tier-detail").textContent = tier
    ? tier.versions + " versions, " + tier.downloads_in_flight + " downloading, " + tier.url
    : "the model repository is a directory";
}

function renderNodes(doc) {
  const body = document.createElement("tbody");
  body.id = "nodes";
  const select = $("node-filter");
  const known = new Set(Array.from(select.options, (o) => o.value));
  for (const node of doc.nodes) {
    const row = body.insertRow();
    row.dataset.node = node.name;
    cell(row, node.name);
    cell(row, node.kind);
    cell(row, node.tier || "-");
    cell(row, node.healthy ? "healthy" : "down", node.healthy ? "healthy" : "unhealthy");
    if (node.kind === "node") {
      const states = node.model_states || {};
      const count = (states.loading || {}).models + (states.available || {}).models;
      const held = (states.loading || {}).bytes + (states.available || {}).bytes;
      const caps = node.caps || {};
      barCell(row, count, caps.max_models, String);
      barCell(row, held, caps.memory_bytes, bytes);
      const gpu = node.gpu || { bytes: 0, cap_bytes: 0 };  // no GPU cap and nothing measured: "-"
      if (gpu.cap_bytes || gpu.bytes) barCell(row, gpu.bytes, gpu.cap_bytes, bytes);
      else cell(row, "-");
      cell(row, node.leases);
      cell(row, (node.queue || []).length);
    } else {
      for (let i = 0; i < 5; i++) cell(row, "-");  // a peer sidecar: its own page tells
    }
    if (node.kind === "node" && !known.has(node.name)) {
      select.add(new Option(node.name, node.name));
    }
  }
  $("nodes").replaceWith(body);
}

// Every resident version of every local node, as rows; filtered and paged in renderModels.
function modelRows(doc) {
  const copies = (doc.copies && doc.copies.models) || {};
  const rows = [];
  for (const node of doc.nodes) {
    for (const m of node.models || []) rows.push({ node: node.name, copies: copies[m.name], ...m });
  }
  return rows;
}

function renderModels() {
  if (!view.status) return;
  const needle = view.search.trim().toLowerCase();
  const rows = modelRows(view.status).filter((m) =>
    (!needle || m.name.toLowerCase().includes(needle)) && (!view.node || m.node === view.node));
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_SIZE));
  view.page = Math.min(view.page, pages - 1);
  const first = view.page * PAGE_SIZE;
  const body = document.createElement("tbody");
  body.id = "models";
  for (const m of rows.slice(first, first + PAGE_SIZE)) {
    const row = body.insertRow();
    row.dataset.model = m.name;
    row.dataset.node = m.node;
    cell(row, m.name);
    cell(row, m.version);
    cell(row, m.node);
    cell(row, m.state + (m.pinned ? " (pinned)" : ""), "state-" + m.state);
    cell(row, bytes(m.bytes) + (m.measured ? "" : " (estimated)"));
    cell(row, ago(m.last_use));
    cell(row, m.leases);
    cell(row, m.copies ? m.copies.length : 1);
  }
  $("models").replaceWith(body);
  $("page-info").textContent = rows.length
    ? "page " + (view.page + 1) + " of " + pages + " (" + (first + 1) + "-" +
      Math.min(first + PAGE_SIZE, rows.length) + " of " + rows.length + ")"
    : "no model matches";
  $("prev").disabled = view.page === 0;
  $("next").disabled = view.page >= pages - 1;
}

function addEvents(doc) {
  const body = $("timeline");
  for (const e of doc.events) {  // oldest first: each new one goes on top
    const row = body.insertRow(0);
    row.className = "ev-" + e.kind.replace(/[^a-z_]/gi, "");
    row.dataset.kind = e.kind;
    row.dataset.model = e.model;
    cell(row, new Date(e.time * 1000).toLocaleTimeString());
    cell(row, e.node);
    cell(row, e.kind);  // an open string: kinds this page does not know show as they are
    cell(row, e.model);
    cell(row, e.version);
    cell(row, e.seconds === null ? "-" : e.seconds.toFixed(3) + " s");
    cell(row, e.bytes === null ? "-" : bytes(e.bytes));
    cell(row, e.reason, "reason");
  }
  while (body.rows.length > TIMELINE_ROWS) body.deleteRow(body.rows.length - 1);
  view.seq = doc.seq;
  $("timeline-info").textContent = "(" + body.rows.length + " shown, newest first" +
    (doc.dropped ? "; " + doc.dropped + " missed while away" : "") + ")";
}

async function tick() {
  view.timer = null;
  try {
    const [status, events] = await Promise.all([getJSON("status"),
      getJSON("status/events?since=" + view.seq)]);
    view.status = status;
    renderSummary(status);
    renderNodes(status);
    renderModels();
    addEvents(events);
    $("error").hidden = true;
    $("token-form").hidden = true;
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    if (err.status === 401) {
      $("token-form").hidden = false;
      $("token-error").textContent = view.token ? err.message : "";
      view.waitingForToken = true;
      return;  // until a token is given
    }
    $("error").textContent = String(err.message || err);
    $("error").hidden = false;
  }
  view.timer = setTimeout(tick, REFRESH_MS);
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  view.token = $("token").value;
  sessionStorage.setItem("tfscache-token", view.token);
  if (view.waitingForToken) { view.waitingForToken = false; tick(); }
});
$("search").addEventListener("input", () => {
  view.search = $("search").value;
  view.page = 0;
  renderModels();
});
$("node-filter").addEventListener("change", () => {
  view.node = $("node-filter").value;
  view.page = 0;
  renderModels();
});
$("prev").addEventListener("click", () => {
  view.page = Math.max(0, view.page - 1);
  renderModels();
});
$("next").addEventListener("click", () => { view.page += 1; renderModels(); });
tick();
