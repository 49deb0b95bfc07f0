// kdelay console (proxy/http/console.py): a single page over the proxy's HTTP API, same origin.
// No framework and no third-party code; every value from the API is written with textContent.
"use strict";

const $ = (sel) => document.querySelector(sel);
const WAIT_S = 5; // ?wait= of a cancel: the master's decision, within 5 s
const REFRESH_MS = 5000;
const BUCKETS = { "15m": "1m", "1h": "5m", "6h": "15m", "24h": "1h", "7d": "6h" };
const UNITS = { ms: 1, s: 1000, m: 60000, h: 3600000, d: 86400000 };

let overviewTimer = null;
let pages = []; // cursors of the pages before the current one
let cursor = null; // the current page's cursor (null: the first)
let shown = null; // the message on the message page

// ---- helpers --------------------------------------------------------------------------------

// The page's own origin: a page opened as http://user:password@host/ui/ has those credentials
// in its URL, and fetch() refuses a URL that carries any (a relative one resolves to it). The
// browser keeps them for the realm and answers the API's challenge with them.
async function call(method, path, init) {
  let resp;
  try {
    resp = await fetch(location.origin + path, { method, credentials: "same-origin", ...init });
  } catch (e) {
    return { status: 0, body: { error: `the proxy did not answer (${e.message})` } };
  }
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  return { status: resp.status, body };
}

function api(method, path) {
  return call(method, path, { headers: { Accept: "application/json" } });
}

function send(method, path, doc) {
  return call(method, path, {
    headers: { Accept: "application/json", "Content-Type": "application/json" },
    body: JSON.stringify(doc),
  });
}

function why(answer) {
  const err = answer.body && answer.body.error;
  return `HTTP ${answer.status}${err ? ": " + err : ""}`;
}

function notice(text, ok) {
  const el = $("#notice");
  el.textContent = text || "";
  el.hidden = !text;
  el.className = ok ? "ok" : "";
}

function durationMs(text) {
  const m = /^\s*(\d+)\s*(ms|s|m|h|d)?\s*$/i.exec(text);
  return m ? Number(m[1]) * UNITS[(m[2] || "ms").toLowerCase()] : null;
}

function iso(ms) {
  return ms == null ? "–" : new Date(ms).toISOString().replace(".000Z", "Z");
}

function relative(ms) {
  if (ms == null) return "";
  const d = ms - Date.now();
  const a = Math.abs(d);
  const text = a < 60000 ? `${Math.round(a / 1000)}s` : a < 3600000 ? `${Math.round(a / 60000)}m`
    : a < 172800000 ? `${(a / 3600000).toFixed(1)}h` : `${(a / 86400000).toFixed(1)}d`;
  return d >= 0 ? `in ${text}` : `${text} ago`;
}

function seconds(s) {
  if (s == null) return "–";
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null ? "–" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }

// Asks "text"; with "word", the operator must type it first. Resolves true when confirmed.
function confirmAction(text, word, ok) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = ok;
  $("#confirm-typed").hidden = !word;
  $("#confirm-word").textContent = word || "";
  $("#confirm-input").value = "";
  $("#confirm-ok").disabled = Boolean(word);
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// ---- overview -------------------------------------------------------------------------------

async function loadOverview() {
  const answer = await api("GET", "/v1/cluster");
  if (answer.status !== 200) {
    notice(`Overview: ${why(answer)}`);
    return;
  }
  notice("");
  const doc = answer.body;
  const rel = doc.release;
  $("#rate").textContent = rel.rate_per_s == null ? "–" : `${rel.rate_per_s.toFixed(1)}/s`;
  $("#p50").textContent = seconds(rel.lateness_p50_s);
  $("#p99").textContent = seconds(rel.lateness_p99_s);
  $("#released").textContent = rel.released == null ? "–" : String(rel.released);
  $("#release-span").textContent = rel.span_s > 0
    ? `Releases over the last ${Math.round(rel.span_s)} s (window ${Math.round(rel.window_s / 60)} min), every replica summed.`
    : "Release rate and lateness: measuring (two samples are needed; the page refreshes every 5 s).";
  const body = $("#shards tbody");
  clear(body);
  for (const shard of doc.shards) {
    if (shard.replicas.length === 0) {
      const tr = document.createElement("tr");
      cell(tr, shard.shard);
      cell(tr, "no replica registered", "down");
      body.appendChild(tr);
    }
    for (const r of shard.replicas) {
      const tr = document.createElement("tr");
      tr.dataset.replica = r.name;
      cell(tr, shard.shard);
      cell(tr, r.name);
      cell(tr, r.role, r.role === "master" ? "role-master" : "");
      cell(tr, r.lag, "num");
      cell(tr, r.pending, "num");
      cell(tr, r.up ? "up" : `down: ${r.error}`, r.up ? "" : "down");
      body.appendChild(tr);
    }
  }
  const masters = doc.shards.map((s) => `shard ${s.shard}: ${s.master || "no master"}`).join(", ");
  $("#overview-as-of").textContent = `${masters}. As of ${iso(doc.as_of_ms)}.`;
}

// ---- pending --------------------------------------------------------------------------------

function filters() {
  return {
    window: $("#f-window").value,
    topic: $("#f-topic").value.trim(),
    prefix: $("#f-prefix").value.trim(),
    limit: Math.max(1, Math.min(1000, Number($("#f-limit").value) || 50)),
  };
}

function drawChart(doc, f) {
  const svg = $("#pending-chart");
  clear(svg);
  const ns = "http://www.w3.org/2000/svg";
  const width = svg.clientWidth || 900;
  const height = 180;
  const bucketMs = doc.bucket_ms;
  const first = Math.floor(doc.now_ms / bucketMs) * bucketMs;
  const n = Math.max(1, Math.ceil((doc.until_ms - first) / bucketMs));
  const counts = new Array(n).fill(0);
  let overdue = 0;
  for (const b of doc.buckets) {
    const c = b.count;
    const i = Math.floor((b.start - first) / bucketMs);
    if (i < 0) overdue += c; else if (i < n) counts[i] += c;
  }
  const all = [overdue, ...counts];
  const max = Math.max(1, ...all);
  const slot = (width - 40) / all.length;
  all.forEach((c, i) => {
    const h = Math.round((c / max) * (height - 40));
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", String(30 + i * slot + 1));
    rect.setAttribute("y", String(height - 20 - h));
    rect.setAttribute("width", String(Math.max(1, slot - 2)));
    rect.setAttribute("height", String(h));
    rect.setAttribute("class", i === 0 ? "bar overdue" : "bar");
    rect.dataset.count = String(c);
    const title = document.createElementNS(ns, "title");
    title.textContent = i === 0 ? `overdue: ${c}` : `${iso(first + (i - 1) * bucketMs)}: ${c}`;
    rect.appendChild(title);
    svg.appendChild(rect);
    if (c > 0) {
      const label = document.createElementNS(ns, "text");
      label.setAttribute("x", String(30 + i * slot + slot / 2));
      label.setAttribute("y", String(height - 24 - h));
      label.setAttribute("text-anchor", "middle");
      label.textContent = String(c);
      svg.appendChild(label);
    }
  });
  const step = Math.max(1, Math.ceil(all.length / 8));
  for (let i = 0; i < all.length; i += step) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", String(30 + i * slot));
    t.setAttribute("y", String(height - 6));
    t.textContent = i === 0 ? "overdue" : iso(first + (i - 1) * bucketMs).slice(5, 16);
    svg.appendChild(t);
  }
  const total = all.reduce((a, b) => a + b, 0);
  $("#chart-caption").textContent =
    `${total} pending${f.topic ? ` for ${f.topic}` : ""}${f.prefix ? ` whose id starts with ${f.prefix}` : ""}` +
    ` due within ${f.window}, per ${doc.bucket_ms / 60000} min (bars: count per bucket, first bar overdue)` +
    `${doc.truncated ? `; the scan stopped at ${doc.scan_limit} entries` : ""}. Answered by ${doc.answered_by}.`;
}

async function loadChart(f) {
  const q = new URLSearchParams({ bucket: BUCKETS[f.window], horizon: f.window });
  if (f.topic) q.set("topic", f.topic);
  if (f.prefix) q.set("id_prefix", f.prefix);
  const answer = await api("GET", `/v1/pending?${q}`);
  if (answer.status === 200) {
    drawChart(answer.body, f);
  } else {
    clear($("#pending-chart"));
    $("#chart-caption").textContent = `Counts per due time: ${why(answer)}`;
  }
}

async function loadPage(f) {
  const q = new URLSearchParams({ state: "pending", limit: String(f.limit) });
  if (f.topic) q.set("topic", f.topic);
  if (f.prefix) q.set("id_prefix", f.prefix);
  const windowMs = durationMs(f.window);
  q.set("due_before", new Date(Date.now() + windowMs).toISOString());
  if (cursor) q.set("cursor", cursor);
  const answer = await api("GET", `/v1/messages?${q}`);
  const body = $("#pending-table tbody");
  clear(body);
  if (answer.status !== 200) {
    notice(`Pending messages: ${why(answer)}`);
    $("#page-next").disabled = true;
    return;
  }
  notice("");
  for (const m of answer.body.messages) {
    const tr = document.createElement("tr");
    tr.dataset.id = m.id;
    const td = cell(tr, "");
    const a = document.createElement("a");
    a.href = `#/message/${encodeURIComponent(m.id)}`;
    a.textContent = m.id;
    td.appendChild(a);
    cell(tr, `${iso(m.deliver_at)} (${relative(m.deliver_at)})`);
    cell(tr, m.topic);
    cell(tr, m.partition == null ? "by key" : m.partition, "num");
    body.appendChild(tr);
  }
  $("#pending-empty").hidden = answer.body.messages.length > 0;
  $("#page-info").textContent = `page ${pages.length + 1}, ${answer.body.messages.length} shown`;
  $("#page-prev").disabled = pages.length === 0;
  const next = answer.body.next;
  $("#page-next").disabled = next == null;
  $("#page-next").dataset.cursor = next == null ? "" : next;
}

async function loadPending(fromStart) {
  const f = filters();
  if (fromStart) { pages = []; cursor = null; }
  const bulk = $("#bulk-cancel");
  bulk.disabled = !f.prefix;
  bulk.title = f.prefix ? "" : "give an id prefix first";
  await Promise.all([loadChart(f), loadPage(f)]);
}

async function bulkCancel() {
  const f = filters();
  if (!f.prefix) return;
  const scope = `every pending message whose id starts with "${f.prefix}"` +
    (f.topic ? ` and whose target topic is ${f.topic}` : ", whatever its topic") +
    " (due at any time, not only those listed)";
  if (!(await confirmAction(`Cancel ${scope}? This cannot be undone.`, f.prefix, "Cancel them"))) {
    return;
  }
  const q = new URLSearchParams({ id_prefix: f.prefix, wait: String(WAIT_S) });
  if (f.topic) q.set("topic", f.topic);
  const answer = await api("DELETE", `/v1/messages?${q}`);
  const out = $("#bulk-result");
  if (answer.status === 200) {
    out.textContent = `Cancelled ${answer.body.cancelled} pending message(s).`;
    out.className = "ok";
  } else if (answer.status === 202) {
    out.textContent = "The bulk cancel is accepted (not confirmed yet).";
    out.className = "ok";
  } else {
    out.textContent = `Bulk cancel failed: ${why(answer)}`;
    out.className = "bad";
  }
  await loadPending(true);
}

// ---- a message ------------------------------------------------------------------------------

function row(body, name, value) {
  const tr = document.createElement("tr");
  const th = document.createElement("th");
  th.textContent = name;
  tr.appendChild(th);
  cell(tr, value).dataset.field = name;
  body.appendChild(tr);
}

function eventLine(e) {
  const who = (by) => (by == null ? "" : typeof by === "string" ? ` by ${by}`
    : by.admin ? " by an administrator" : ` by ${by.principal}`);
  const what = { accepted: "accepted", delivered: "released", dead_lettered: "dead-lettered", cancelled: "cancelled" }[e.event] || e.event;
  let line = `${e.occurrence != null ? `occurrence ${e.occurrence}: ` : ""}${what} at ${iso(e.at)}${who(e.by)}`;
  if (e.event === "accepted" && e.deliver_at != null) line += `, due ${iso(e.deliver_at)}`;
  if (e.lateness_ms != null) line += ` (lateness ${seconds(e.lateness_ms / 1000)})`;
  if (e.offset != null) line += `, offset ${e.offset}`;
  if (e.reason) line += `: ${e.reason}`;
  return line;
}

function history(doc) {
  const out = (doc.history || []).map(eventLine);
  if (doc.state === "pending") out.push(`pending: due ${iso(doc.deliver_at)}${doc.occurrence != null ? `, occurrence ${doc.occurrence}` : ""}, not released yet`);
  return out;
}

function clearMessage() {
  shown = null;
  $("#m-body").hidden = true;
  clear($("#m-details tbody"));
  clear($("#m-history"));
  $("#m-result").textContent = "";
}

async function loadMessage(id) {
  clearMessage(); // never show the last message's details under this id
  $("#m-id").value = id;
  const answer = await api("GET", `/v1/messages/${encodeURIComponent(id)}`);
  const box = $("#m-body");
  if (answer.status !== 200) {
    box.hidden = true;
    shown = null;
    notice(`Message ${id}: ${why(answer)}`);
    return;
  }
  notice("");
  const doc = answer.body;
  shown = doc;
  const body = $("#m-details tbody");
  clear(body);
  row(body, "id", doc.id);
  row(body, "state", doc.state);
  row(body, "due", doc.deliver_at == null ? null : `${iso(doc.deliver_at)} (${relative(doc.deliver_at)})`);
  row(body, "target", doc.topic == null ? null : `${doc.topic}, partition ${doc.partition == null ? "by key" : doc.partition}`);
  if (doc.owner) row(body, "owner", doc.owner);
  if (doc.repeat) row(body, "repeat", doc.repeat);
  if (doc.headers) row(body, "headers", doc.headers.length === 0 ? "none" : doc.headers.map((h) => `${h.key}: ${h.value_base64 != null ? `(base64) ${h.value_base64}` : h.value == null ? "null" : h.value}`).join("; "));
  if (doc.accepted_at != null) row(body, "accepted", iso(doc.accepted_at));
  if (doc.reason) row(body, "dead-letter reason", doc.reason);
  if (doc.cancelled_by) row(body, "cancelled by", doc.cancelled_by.admin ? "an administrator" : doc.cancelled_by.principal);
  if (doc.buffer) row(body, "buffer record", `partition ${doc.buffer.partition}, offset ${doc.buffer.offset}`);
  if (doc.source) row(body, "known from", doc.source);
  row(body, "answered by", `${doc.answered_by} (${doc.role}), ingest lag ${doc.ingest_lag == null ? "unknown" : doc.ingest_lag}`);
  const list = $("#m-history");
  clear(list);
  for (const line of history(doc)) {
    const li = document.createElement("li");
    li.textContent = line;
    list.appendChild(li);
  }
  $("#m-missing").textContent = doc.state === "pending" ? "" : "Its headers and value left with it: a replica keeps only what became of it.";
  const pending = doc.state === "pending";
  $("#m-cancel").disabled = !pending;
  $("#r-go").disabled = !doc.topic;
  box.hidden = false;
}

async function cancelShown() {
  if (!shown) return;
  const id = shown.id;
  if (!(await confirmAction(`Cancel message ${id}, due ${iso(shown.deliver_at)}?`, null, "Cancel it"))) {
    return;
  }
  const answer = await api("DELETE", `/v1/messages/${encodeURIComponent(id)}?wait=${WAIT_S}`);
  const out = $("#m-result");
  if (answer.status === 200) {
    out.textContent = `Cancelled: ${id} will never be delivered.`;
    out.className = "ok";
  } else if (answer.status === 409) {
    out.textContent = `Too late: ${id} was already delivered at ${iso(answer.body.delivered_at)}.`;
    out.className = "bad";
  } else if (answer.status === 202) {
    out.textContent = `The cancel of ${id} is accepted (not confirmed yet).`;
    out.className = "ok";
  } else {
    out.textContent = `Cancel failed: ${why(answer)}`;
    out.className = "bad";
  }
  const result = out.textContent;
  const cls = out.className;
  await loadMessage(id);
  out.textContent = result;
  out.className = cls;
}

async function replaceShown(event) {
  event.preventDefault();
  if (!shown) return;
  const due = $("#r-due").value.trim();
  const doc = { topic: shown.topic, value: $("#r-value").value };
  if (shown.partition != null) doc.partition = shown.partition;
  const key = $("#r-key").value;
  if (key) doc.key = key;
  if (due.startsWith("+")) {
    const ms = durationMs(due.slice(1));
    if (ms == null) { notice("New due time: +N with a unit (ms, s, m, h, d), or an RFC 3339 time"); return; }
    doc.delay_ms = ms;
  } else {
    doc.deliver_at = due;
  }
  if (shown.repeat) doc.repeat = shown.repeat;
  const id = shown.id;
  const answer = await send("PUT", `/v1/messages/${encodeURIComponent(id)}`, doc);
  const out = $("#m-result");
  if (answer.status === 202) {
    out.textContent = `Replaced: ${id} is now due at ${iso(answer.body.deliver_at)}.`;
    out.className = "ok";
  } else {
    out.textContent = `Replace failed: ${why(answer)}`;
    out.className = "bad";
  }
}

// ---- navigation -----------------------------------------------------------------------------

function route() {
  const hash = location.hash || "#/overview";
  const [, page, ...rest] = hash.split("/");
  const name = ["overview", "pending", "message"].includes(page) ? page : "overview";
  for (const id of ["overview", "pending", "message"]) {
    $(`#${id}`).hidden = id !== name;
    $(`#nav-${id}`).classList.toggle("active", id === name);
  }
  notice("");
  clearInterval(overviewTimer);
  overviewTimer = null;
  if (name === "overview") {
    loadOverview();
    overviewTimer = setInterval(loadOverview, REFRESH_MS);
  } else if (name === "pending") {
    loadPending(true);
  } else if (rest.length && rest.join("/")) {
    loadMessage(decodeURIComponent(rest.join("/")));
  } else {
    clearMessage();
  }
}

function start() {
  $("#pending-filter").addEventListener("submit", (e) => { e.preventDefault(); loadPending(true); });
  $("#f-prefix").addEventListener("input", () => { $("#bulk-cancel").disabled = !$("#f-prefix").value.trim(); });
  $("#page-next").addEventListener("click", () => {
    pages.push(cursor);
    cursor = $("#page-next").dataset.cursor || null;
    loadPage(filters());
  });
  $("#page-prev").addEventListener("click", () => {
    cursor = pages.pop() || null;
    loadPage(filters());
  });
  $("#bulk-cancel").addEventListener("click", bulkCancel);
  $("#lookup").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("#m-id").value.trim();
    if (!id) return;
    const target = `#/message/${encodeURIComponent(id)}`;
    if (location.hash === target) loadMessage(id); else location.hash = target;
  });
  $("#m-cancel").addEventListener("click", cancelShown);
  $("#replace").addEventListener("submit", replaceShown);
  $("#confirm-input").addEventListener("input", () => {
    $("#confirm-ok").disabled = $("#confirm-input").value !== $("#confirm-word").textContent;
  });
  const tick = () => { $("#clock").textContent = iso(Math.floor(Date.now() / 1000) * 1000); };
  tick();
  setInterval(tick, 1000);
  window.addEventListener("hashchange", route);
  route();
}

document.addEventListener("DOMContentLoaded", start);
