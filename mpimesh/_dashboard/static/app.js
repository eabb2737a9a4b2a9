// The mpimesh dashboard page: draws each snapshot the controller pushes on /events (server-sent events).
"use strict";

const token = new URLSearchParams(location.search).get("token");
const withToken = (url) => token ? url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : url;
const $ = (id) => document.getElementById(id);

const PLOT_CONFIG = { responsive: true, displaylogo: false, displayModeBar: false };
// metric name -> {div, traces: source -> trace index}
const charts = new Map();
const events = [];
let lastProcs = "";
let lastLabels = "";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}

function percent(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(0) + " %"; }

function drawTree(snap) {
  const tree = $("tree");
  const byAddr = new Map(snap.procs.map((p) => [p.addr, p]));
  tree.replaceChildren();
  for (const [host, addrs] of Object.entries(snap.hosts)) {
    const procs = el("ul");
    for (const addr of addrs) {
      const p = byAddr.get(addr);
      const actors = el("ul");
      for (const actor of p.actors) actors.append(el("li", { class: "actor", text: actor }));
      const item = el("li", { class: "proc", "data-addr": addr, "data-state": p.state },
        el("span", { class: "badge " + p.state, text: p.state }), " process " + addr + " (pid " + p.pid + ")");
      if (p.cause) item.append(el("div", { class: "cause", text: p.cause }));
      item.append(actors);
      procs.append(item);
    }
    tree.append(el("li", { class: "host", "data-host": host }, el("b", { text: "host " + host }), procs));
  }
  const pm = $("proc-meshes");
  pm.replaceChildren();
  for (const mesh of snap.proc_meshes) {
    pm.append(el("li", { class: "proc-mesh" }, el("b", { text: mesh.name }), " processes " + mesh.procs.join(", ")));
  }
  if (!snap.proc_meshes.length) pm.append(el("li", { class: "empty", text: "none" }));
}

function drawMeshes(snap) {
  const box = $("meshes");
  box.replaceChildren();
  for (const mesh of snap.meshes) {
    const last = mesh.sizes.length ? mesh.sizes[mesh.sizes.length - 1] : 1;
    const grid = el("div", { class: "grid" });
    grid.style.gridTemplateColumns = `repeat(${Math.min(Math.max(last, 1), 32)}, min-content)`;
    const whys = el("div");
    for (const r of mesh.ranks) {
      let title = `rank ${r.rank} ${JSON.stringify(r.coords)} on process ${r.addr}: ${r.state}`;
      if (r.state === "busy") title += ` in ${r.busy}() for ${r.busy_for.toFixed(1)} s`;
      if (r.why) title += `: ${r.why}`;
      grid.append(el("span", { class: "cell " + r.state, "data-rank": r.rank, "data-state": r.state, title,
                               text: r.state === "busy" ? r.busy_for.toFixed(0) + "s" : String(r.rank) }));
      if (r.state === "failed") whys.append(el("div", { class: "why", "data-rank": r.rank, text: `rank ${r.rank}: ${r.why}` }));
      if (r.state === "busy") whys.append(el("div", { class: "rates", text: `rank ${r.rank}: in ${r.busy}() for ${r.busy_for.toFixed(1)} s` }));
    }
    const shape = mesh.labels.map((l, i) => `${l}=${mesh.sizes[i]}`).join(", ");
    box.append(el("div", { class: "mesh", "data-name": mesh.name },
      el("b", { text: mesh.name }), ` ${mesh.class} (${shape})`, grid, whys,
      el("div", { class: "rates", text: `${mesh.calls_per_s.toFixed(1)} calls/s, ${bytes(mesh.bytes_per_s)}/s of arguments` })));
  }
  if (!snap.meshes.length) box.append(el("p", { class: "empty", text: "no actor mesh spawned by the controller" }));
}

function drawProcs(snap) {
  const body = $("procs").tBodies[0];
  body.replaceChildren();
  for (const p of snap.procs) {
    body.append(el("tr", { "data-addr": p.addr },
      el("td", { text: p.addr }), el("td", { text: p.host }), el("td", { text: String(p.pid) }),
      el("td", {}, el("span", { class: "badge " + p.state, text: p.state })),
      el("td", { class: "num", text: percent(p.cpu) }), el("td", { class: "num", text: bytes(p.rss) }),
      el("td", { class: "num", text: bytes((p.buffers || 0) + (p.pool || 0)) }),
      el("td", { class: "num", text: p.gpu === null || p.gpu === undefined ? "–" : bytes(p.gpu) }),
      el("td", { text: p.actors.join(" ") })));
  }
  const addrs = snap.procs.filter((p) => p.state !== "failed" && p.state !== "stopped").map((p) => p.addr).join(",");
  if (addrs !== lastProcs) {
    lastProcs = addrs;
    const select = $("stack-proc");
    const chosen = select.value;
    select.replaceChildren(...addrs.split(",").map((a) => el("option", { value: a, text: "process " + a })));
    if (addrs.split(",").includes(chosen)) select.value = chosen;
  }
}

function drawMetrics(snap) {
  const box = $("metrics");
  for (const series of snap.metrics) {
    let chart = charts.get(series.name);
    if (!chart) {
      if (!charts.size) box.replaceChildren();
      const div = el("div", { id: "metric-" + series.name, class: "chart", "data-metric": series.name });
      box.append(div);
      chart = { div, traces: new Map() };
      charts.set(series.name, chart);
      Plotly.newPlot(div, [], { title: { text: series.name }, margin: { t: 36, r: 10, b: 36, l: 50 },
                                xaxis: { title: { text: "step" } }, showlegend: true }, PLOT_CONFIG);
    }
    if (!chart.traces.has(series.source)) {
      chart.traces.set(series.source, chart.div.data.length);
      Plotly.addTraces(chart.div, { x: [], y: [], name: series.source, mode: "lines+markers" });
    }
    Plotly.extendTraces(chart.div, { x: [series.x], y: [series.y] }, [chart.traces.get(series.source)]);
  }
}

function drawEvents(snap) {
  if (!snap.events.length) return;
  const list = $("events");
  for (const e of snap.events) {
    events.push(e);
    const when = new Date(e.time * 1000).toLocaleTimeString();
    list.prepend(el("li", { class: "event " + e.kind, "data-kind": e.kind }, `${when} ${e.kind}: ${e.text}`));
  }
  const kinds = [...new Set(events.map((e) => e.kind))];
  Plotly.react($("timeline"), kinds.map((kind) => {
    const mine = events.filter((e) => e.kind === kind);
    return { x: mine.map((e) => new Date(e.time * 1000)), y: mine.map(() => kind), text: mine.map((e) => e.text),
             mode: "markers", type: "scatter", name: kind, marker: { size: 10 } };
  }), { margin: { t: 10, r: 10, b: 30, l: 60 }, showlegend: false }, PLOT_CONFIG);
}

function drawLogLabels(snap) {
  const labels = snap.log_labels.join("\n");
  if (labels === lastLabels) return;
  lastLabels = labels;
  const select = $("log-label");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "", text: "(choose a rank)" }),
    ...snap.log_labels.map((l) => el("option", { value: l, text: l })));
  select.value = snap.log_labels.includes(chosen) ? chosen : "";
}

async function showLogs() {
  const label = $("log-label").value;
  if (!label) { $("log-text").textContent = ""; return; }
  const answer = await fetch(withToken("api/logs?label=" + encodeURIComponent(label)));
  const body = await answer.json();
  const out = $("log-text");
  out.textContent = body.error || body.lines.map((l) => l[2]).join("\n");
  out.scrollTop = out.scrollHeight;
}

async function showStack() {
  const proc = $("stack-proc").value;
  const out = $("stack-text");
  out.textContent = "asking process " + proc + "…";
  const answer = await fetch(withToken("api/stack?proc=" + encodeURIComponent(proc)));
  const body = await answer.json();
  if (body.error) { out.textContent = body.error; return; }
  out.textContent = body.threads.map((t) =>
    `--- thread ${t.thread} (innermost call first)${t.actor ? " (actor " + t.actor + ")" : ""}${t.busy ? " in " + t.busy + "()" : ""}\n` +
    // innermost first: a stuck endpoint's own frame is the first line under its thread
    t.frames.slice().reverse().map(([file, line, fn, src]) => `  ${fn}() ${file}:${line}\n    ${src}`).join("\n"))
    .join("\n");
  out.dataset.proc = proc;
  out.scrollTop = 0;
}

function draw(snap) {
  if (snap.error) { $("summary").textContent = snap.error; return; }
  if (snap.first) {  // a new stream (the page reconnected): it sends every point and event again
    charts.clear();
    events.length = 0;
    $("metrics").replaceChildren();
    $("events").replaceChildren();
  }
  const failed = snap.procs.filter((p) => p.state === "failed").length;
  $("summary").textContent = `${snap.procs.length} processes on ${Object.keys(snap.hosts).length} host(s), ` +
    `${snap.meshes.length} actor mesh(es)${failed ? ", " + failed + " failed" : ""} — ` +
    new Date(snap.time * 1000).toLocaleTimeString();
  drawTree(snap);
  drawMeshes(snap);
  drawProcs(snap);
  drawMetrics(snap);
  drawEvents(snap);
  drawLogLabels(snap);
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
}

function connect() {
  const source = new EventSource(withToken("events"));
  source.onopen = () => { $("status").textContent = "live"; $("status").className = "status live"; };
  source.onerror = () => { $("status").textContent = "disconnected (the job may have ended)"; $("status").className = "status down"; };
  source.onmessage = (message) => draw(JSON.parse(message.data));
}

$("stack-button").addEventListener("click", showStack);
$("log-label").addEventListener("change", showLogs);
setInterval(() => { if ($("log-label").value) showLogs(); }, 2000);
connect();
