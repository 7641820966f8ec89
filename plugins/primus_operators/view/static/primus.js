// The Primus view: reads /primus/api/jobs[/<dag_id>] (same origin: the UI's session cookie goes
// with it) and draws tables and hand-made SVG charts. No library, nothing from the network.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const dagId = document.body.dataset.dagId;
const content = document.getElementById("content");

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

const fmt = (value, digits = 4) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
const pct = (value) => (value === null || value === undefined ? "–" : `${(100 * value).toFixed(1)} %`);
const when = (epoch) => (epoch ? new Date(epoch * 1000).toISOString().replace(".000", "") : "–");
const badge = (text) => el("span", { class: `badge ${text}` }, text);

async function getJson(path) {
  const reply = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!reply.ok) {
    let detail = reply.statusText;
    try { detail = (await reply.json()).detail || detail; } catch (_) { /* not JSON */ }
    throw new Error(`${path}: HTTP ${reply.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return reply.json();
}

// -- charts --------------------------------------------------------------------------------------
function lineChart(figure, title, series, options = {}) {
  // series: [{name, color, points: [{x, y, label}]}]; x numeric (epoch seconds), y numeric
  const width = options.width || 560, height = options.height || 220, pad = { l: 56, r: 16, t: 10, b: 40 };
  figure.replaceChildren(el("figcaption", {}, title));
  const all = series.flatMap((s) => s.points).filter((p) => p.y !== null && p.y !== undefined);
  if (!all.length) { figure.append(el("p", { class: "muted" }, options.empty || "no data yet")); return; }
  let [x0, x1] = [Math.min(...all.map((p) => p.x)), Math.max(...all.map((p) => p.x))];
  let [y0, y1] = [Math.min(...all.map((p) => p.y)), Math.max(...all.map((p) => p.y))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (options.step) { y0 = Math.max(0, y0 - 1); y1 += 1; } // counts: whole numbers around the values
  else {
    if (y0 === y1) { y0 -= 0.01; y1 += 0.01; }
    const margin = (y1 - y0) * 0.08; y0 -= margin; y1 += margin;
  }
  const sx = (x) => pad.l + ((x - x0) / (x1 - x0)) * (width - pad.l - pad.r);
  const sy = (y) => height - pad.b - ((y - y0) / (y1 - y0)) * (height - pad.t - pad.b);
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title });
  const divisions = options.step && y1 - y0 <= 8 ? y1 - y0 : 4;
  for (let i = 0; i <= divisions; i++) {
    const y = y0 + ((y1 - y0) * i) / divisions;
    svg.append(el("svg:line", { class: "grid", x1: pad.l, x2: width - pad.r, y1: sy(y), y2: sy(y) }));
    svg.append(el("svg:text", { x: pad.l - 6, y: sy(y) + 4, "text-anchor": "end" }, options.step ? Math.round(y) : y.toFixed(3)));
  }
  svg.append(el("svg:line", { class: "axis", x1: pad.l, x2: width - pad.r, y1: height - pad.b, y2: height - pad.b }));
  const ticks = [...new Map(all.map((p) => [p.x, p])).values()];
  const every = Math.max(1, Math.ceil(ticks.length / 6));
  ticks.forEach((p, i) => {
    if (i % every === 0) svg.append(el("svg:text", { x: sx(p.x), y: height - pad.b + 16, "text-anchor": "middle" }, p.label));
  });
  for (const s of series) {
    const points = s.points.filter((p) => p.y !== null && p.y !== undefined);
    let d = "";
    points.forEach((p, i) => {
      if (options.step && i > 0) d += ` H${sx(p.x)}`;
      d += `${i ? " L" : "M"}${sx(p.x)},${sy(p.y)}`;
    });
    if (options.step && points.length) d += ` H${width - pad.r}`;
    svg.append(el("svg:path", { class: "line", d, stroke: s.color }));
    for (const p of points) {
      const dot = el("svg:circle", { class: "point", cx: sx(p.x), cy: sy(p.y), r: 4, fill: s.color,
                                     "data-series": s.name, "data-x": p.key || p.label, "data-y": p.y });
      dot.append(el("svg:title", {}, `${s.name} ${p.key || p.label}: ${p.y}`));
      svg.append(dot);
    }
  }
  if (series.length > 1) {
    series.forEach((s, i) => svg.append(el("svg:text", { x: pad.l + 8 + i * 120, y: height - 6, fill: s.color }, `● ${s.name}`)));
  }
  figure.append(svg);
}

const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00"];

function metricCharts(metrics) {
  const streams = [...new Set(metrics.map((m) => m.stream))];
  for (const [metric, id] of [["auc", "auc-chart"], ["logloss", "logloss-chart"]]) {
    const series = streams.map((stream, i) => ({
      name: stream, color: COLORS[i % COLORS.length],
      points: metrics.filter((m) => m.stream === stream).map((m) => ({
        x: Date.parse(m.start) / 1000, y: m[metric], key: m.window, label: (m.start || m.window).slice(5, 16).replace("T", " "),
      })),
    }));
    lineChart(document.getElementById(id), metric === "auc" ? "AUC (progressive)" : "logloss (progressive)", series,
              { empty: "no trained window yet" });
  }
}

// -- sections ------------------------------------------------------------------------------------
function windowsTable(windows, metrics) {
  const byWindow = new Map(metrics.map((m) => [m.window, m]));
  const body = document.querySelector("#windows tbody");
  body.replaceChildren();
  for (const w of windows) {
    // planned in the task ledger; the states are the mapped Airflow tasks' (units of data tasks)
    // when a run has them
    const planned = Object.values(w.streams).map((s) => Object.values(s.tasks || {}).reduce((a, b) => a + b, 0));
    const mapped = w.run && Object.keys(w.run.data_tasks || {}).length;
    const states = mapped ? w.run.data_tasks : Object.assign({}, ...Object.values(w.streams).map((s) => s.tasks || {}));
    const total = planned.reduce((a, b) => a + b, 0);
    const listed = Object.entries(states).map(([state, n]) => `${n} ${state}`).join(", ");
    const tasks = total ? `${total} planned${mapped ? ", units" : ""}: ${listed}` : "";
    const rows = Object.values(w.streams).map((s) => s.committed_rows).filter((r) => r !== null && r !== undefined);
    const m = byWindow.get(w.window) || {};
    body.append(el("tr", { "data-window": w.window, "data-state": w.state },
      el("td", {}, (w.start || w.window).replace("+00:00", "")),
      el("td", {}, badge(w.state)),
      el("td", { title: w.run ? w.run.run_id : "" }, w.run ? badge(w.run.state) : "–", w.run ? ` ${w.run.run_type}` : ""),
      el("td", {}, tasks || "–"),
      el("td", { class: "num" }, rows.length ? rows.reduce((a, b) => a + b, 0) : "–"),
      el("td", { class: "num" }, w.samples ?? "–"),
      el("td", { class: "num" }, fmt(m.auc)),
      el("td", { class: "num" }, fmt(m.logloss))));
  }
  if (!windows.length) body.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "no window yet")));
}

function trainerFacts(trainer) {
  const facts = [
    ["input wait (share of loop time waiting for data)", pct(trainer.input_wait)],
    ["back-pressure (read-ahead queues full)", pct(trainer.backpressure)],
    ["lag: windows committed, not trained", trainer.lag_windows],
    ["lag: newest committed − newest trained", trainer.lag_seconds === null ? "–" : `${trainer.lag_seconds} s`],
    ["newest trained / committed window", `${trainer.newest_trained || "–"} / ${trainer.newest_committed || "–"}`],
    ["step", trainer.step ?? "–"],
    ["progress written", when(trainer.written_at)],
    ["input metrics written", when(trainer.metrics_at)],
  ];
  const dl = document.getElementById("trainer");
  dl.replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, String(v))]));
}

function executorSections(executors, generatedAt) {
  const root = document.getElementById("executors");
  root.replaceChildren();
  for (const [role, e] of Object.entries(executors)) {
    const mem = `${(e.memory / 2 ** 30).toFixed(2)} GiB`;
    root.append(el("h3", {}, `${role}: ${e.replicas} now (spec ${e.spec_replicas}, ${e.min}..${e.max}), ${e.cpu} CPU, ${mem} each`));
    const first = e.series.find((p) => p.at) || { at: generatedAt };
    const points = e.series.map((p) => ({ x: p.at || first.at - 1, y: p.replicas, key: p.action, label: p.at ? when(p.at).slice(11, 19) : "spec" }));
    points.push({ x: generatedAt, y: e.replicas, key: "now", label: "now" });
    const figure = el("figure", { class: "executors-chart", "data-role": role });
    root.append(figure);
    lineChart(figure, `${role} count over time`, [{ name: role, color: COLORS[2], points }], { step: true });
    const table = el("table", { class: "decisions" }, el("thead", {}, el("tr", {},
      ...["at", "policy", "action", "replicas", "cpu", "memory", "reason", "inputs"].map((h) => el("th", {}, h)))));
    const body = el("tbody");
    for (const d of e.decisions) {
      const inputs = Object.entries(d.inputs || {}).map(([k, v]) => `${k}=${typeof v === "number" ? +v.toFixed(4) : JSON.stringify(v)}`).join(" ");
      body.append(el("tr", {}, el("td", {}, when(d.at)), el("td", {}, d.policy), el("td", {}, d.action),
        el("td", { class: "num" }, d.replicas ?? "–"), el("td", { class: "num" }, d.cpu ?? "–"),
        el("td", { class: "num" }, d.memory ?? "–"), el("td", {}, d.reason || ""), el("td", {}, el("code", {}, inputs))));
    }
    if (!e.decisions.length) body.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "no scaling decision yet (the scaler held)")));
    table.append(body);
    root.append(el("div", { class: "scroll" }, table));
  }
}

function dtgg(graph, mermaid) {
  const colW = 190, rowH = 46, boxW = 170, boxH = 32;
  const columns = new Map();
  for (const node of graph.nodes) columns.set(node.column, [...(columns.get(node.column) || []), node]);
  const rows = Math.max(...[...columns.values()].map((c) => c.length));
  const width = (Math.max(...columns.keys()) + 1) * colW + 10, height = rows * rowH + 10;
  const where = new Map();
  for (const [column, nodes] of columns) {
    const offset = ((rows - nodes.length) * rowH) / 2;
    nodes.forEach((node, i) => where.set(node.id, { x: 5 + column * colW, y: 5 + offset + i * rowH }));
  }
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "dtgg-svg", role: "img", "aria-label": "DTGG" });
  svg.append(el("svg:defs", {}, el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" },
    el("svg:path", { d: "M0,0 L10,5 L0,10 z", fill: "#8c959f" }))));
  for (const edge of graph.edges) {
    const a = where.get(edge.from), b = where.get(edge.to);
    if (!a || !b) continue;
    svg.append(el("svg:path", { class: "edge", d: `M${a.x + boxW},${a.y + boxH / 2} C${a.x + boxW + 12},${a.y + boxH / 2} ${b.x - 12},${b.y + boxH / 2} ${b.x},${b.y + boxH / 2}` }));
  }
  for (const node of graph.nodes) {
    const p = where.get(node.id);
    const label = node.label.length > 30 ? `${node.label.slice(0, 29)}…` : node.label;
    const g = el("svg:g", { class: "node", "data-node": node.id }, el("svg:title", {}, node.label),
      el("svg:rect", { x: p.x, y: p.y, width: boxW, height: boxH }),
      el("svg:text", { x: p.x + 8, y: p.y + boxH / 2 + 4 }, label));
    svg.append(g);
  }
  document.getElementById("dtgg").replaceChildren(svg);
  document.getElementById("mermaid").textContent = mermaid || "(the DAG has no mermaid docs)";
}

// -- pages ---------------------------------------------------------------------------------------
async function showJob() {
  const job = await getJson(`../api/jobs/${encodeURIComponent(dagId)}`);
  document.getElementById("title").textContent = `Primus job ${job.job}`;
  document.getElementById("summary").textContent =
    `${job.window} windows · ${job.training_mode} training · ${job.backend} backend · read ${when(job.generated_at)}`;
  content.replaceChildren(document.getElementById("job-sections").content.cloneNode(true));
  windowsTable(job.windows, job.metrics);
  metricCharts(job.metrics);
  trainerFacts(job.trainer);
  executorSections(job.executors, job.generated_at);
  dtgg(job.dtgg.graph, job.dtgg.mermaid);
  document.body.dataset.loaded = "true";
}

async function showJobs() {
  const jobs = await getJson("../api/jobs");
  document.getElementById("title").textContent = "Primus jobs";
  const list = el("ul", { id: "jobs" }, ...jobs.map((id) => el("li", {}, el("a", { href: encodeURIComponent(id) }, id))));
  content.replaceChildren(jobs.length ? list : el("p", { class: "muted" }, "no Primus job (no DAG tagged 'primus')"));
  document.body.dataset.loaded = "true";
}

function show() {
  (dagId ? showJob() : showJobs()).catch((error) => {
    content.replaceChildren(el("p", { class: "error", id: "error" }, String(error.message || error)));
    document.body.dataset.loaded = "error";
  });
}

show();
setInterval(show, 30000); // a live job moves on: read it again every 30 s
