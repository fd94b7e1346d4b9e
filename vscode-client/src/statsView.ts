// The stats webview: per-language and per-drafter-source tables and canvas charts over time, fed by `specdec/stats`
// via postMessage.
// Self-contained (no CDN, no bundled chart library): everything stays local.

import { webviewPage } from "./webview";

const STATS_STYLE = `  table { border-collapse: collapse; margin: 1em 0; }
  td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid var(--vscode-panel-border); }
  th:first-child, td:first-child { text-align: left; }
  canvas { width: 100%; max-width: 760px; height: 220px; display: block; margin-bottom: 1.2em; }
  .muted { opacity: 0.7; }`;

const STATS_BODY = `<h2>specdec</h2>
<div id="model" class="muted">waiting for the server…</div>
<table id="table"></table>
<h3>Acceptance rate over time</h3><canvas id="acceptance"></canvas>
<h3>Tokens per target pass</h3><canvas id="tpp"></canvas>
<h3>Time to suggestion, p50 (ms)</h3><canvas id="latency"></canvas>
<h3>Suggestions you accepted</h3><canvas id="user"></canvas>
<h3>Per drafter source</h3><table id="sources"></table>
<h3>Acceptance rate per drafter source</h3><canvas id="sourceAcceptance"></canvas>`;

const STATS_SCRIPT = `const COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"];
const fmt = (v, d, pct) => v === null || v === undefined ? "–" : pct ? Math.round(v * 100) + "%" : v.toFixed(d);
function table(stats) {
  const rows = Object.entries(stats.languages);
  const head = "<tr><th>language</th><th>requests</th><th>acceptance</th><th>tokens/pass</th><th>tok/s</th>" +
    "<th>p50 ms</th><th>p95 ms</th><th>KV reused</th><th>shown</th><th>accepted</th></tr>";
  document.getElementById("table").innerHTML = head + rows.map(([lang, a]) =>
    "<tr><td>" + lang + "</td><td>" + a.requests + "</td><td>" + fmt(a.acceptance_rate, 2, true) + "</td><td>" +
    fmt(a.tokens_per_pass, 2) + "</td><td>" + fmt(a.tokens_per_second, 1) + "</td><td>" + fmt(a.latency_p50_ms, 0) +
    "</td><td>" + fmt(a.latency_p95_ms, 0) + "</td><td>" + fmt(a.prefill_reuse_rate, 0, true) + "</td><td>" +
    a.shown + "</td><td>" + fmt(a.user_accept_rate, 0, true) + "</td></tr>").join("");
}
const esc = s => String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]);
const NO_SOURCES = { total: [], languages: [], workspaces: [], timeline: [] };  // a server from before the field
function sourceTable(sources) {
  // which drafter (prompt lookup, draft model, repository index...) earns its keep, per language and per repository
  const rows = sources.languages.map(r => [r.source, r.language, "", r])
    .concat(sources.workspaces.map(r => [r.source, r.workspace.split(/[\\\\/]/).filter(Boolean).pop() || r.workspace,
                                         r.workspace, r]))
    .concat(sources.total.map(r => [r.source, "(all)", "", r]));
  const head = "<tr><th>source</th><th>language / repository</th><th>acceptance</th><th>tokens/pass</th>" +
    "<th>share of passes</th></tr>";
  document.getElementById("sources").innerHTML = rows.length ? head + rows.map(([source, scope, title, a]) =>
    "<tr><td>" + esc(source) + "</td><td" + (title ? ' title="' + esc(title) + '"' : "") + ">" + esc(scope) +
    "</td><td>" + fmt(a.acceptance_rate, 2, true) + "</td><td>" + fmt(a.tokens_per_pass, 2) + "</td><td>" +
    fmt(a.share_of_passes, 0, true) + "</td></tr>").join("") : '<tr><td class="muted">no drafted passes yet</td></tr>';
}
function chart(id, timeline, key, maxY) {
  const canvas = document.getElementById(id);
  const ratio = window.devicePixelRatio || 1;
  canvas.width = canvas.clientWidth * ratio; canvas.height = canvas.clientHeight * ratio;
  const ctx = canvas.getContext("2d"); ctx.scale(ratio, ratio);
  const w = canvas.clientWidth, h = canvas.clientHeight, pad = 34;
  const series = Object.entries(timeline).map(([lang, pts]) => [lang, pts.filter(p => p[key] !== null)]);
  const all = series.flatMap(([, pts]) => pts);
  ctx.clearRect(0, 0, w, h);
  ctx.fillStyle = getComputedStyle(document.body).color; ctx.font = "11px sans-serif";
  if (!all.length) { ctx.fillText("no model requests yet", pad, h / 2); return; }
  const t0 = Math.min(...all.map(p => p.time)), t1 = Math.max(...all.map(p => p.time)) || t0 + 1;
  const top = maxY ?? (Math.max(...all.map(p => p[key])) * 1.1 || 1);
  const x = t => pad + (w - 2 * pad) * (t1 === t0 ? 0.5 : (t - t0) / (t1 - t0));
  const y = v => h - pad + (pad - h + pad) * (v / top);
  ctx.strokeStyle = "#888"; ctx.beginPath(); ctx.moveTo(pad, pad / 2); ctx.lineTo(pad, h - pad);
  ctx.lineTo(w - pad, h - pad); ctx.stroke();
  ctx.fillText(top.toFixed(top < 10 ? 1 : 0), 2, pad / 2 + 4); ctx.fillText("0", 2, h - pad);
  series.forEach(([lang, pts], i) => {
    ctx.strokeStyle = ctx.fillStyle = COLORS[i % COLORS.length]; ctx.lineWidth = 2; ctx.beginPath();
    pts.forEach((p, j) => j ? ctx.lineTo(x(p.time), y(p[key])) : ctx.moveTo(x(p.time), y(p[key])));
    ctx.stroke();
    pts.forEach(p => { ctx.beginPath(); ctx.arc(x(p.time), y(p[key]), 3, 0, 2 * Math.PI); ctx.fill(); }); ctx.fillText(lang, w - pad - 90, pad / 2 + 14 * (i + 1));
  });
}
window.addEventListener("message", (event) => {
  const stats = event.data;
  document.getElementById("model").textContent = stats.model.target + " · " + stats.model.strategy +
    " · " + stats.model.state + (stats.model.adapter ? " · adapter " + stats.model.adapter : "");
  table(stats);
  chart("acceptance", stats.timeline, "acceptance_rate", 1);
  chart("tpp", stats.timeline, "tokens_per_pass");
  chart("latency", stats.timeline, "latency_p50_ms");
  chart("user", stats.timeline, "user_accept_rate", 1);
  const sources = stats.sources || NO_SOURCES;
  sourceTable(sources);
  chart("sourceAcceptance", Object.fromEntries(sources.timeline.map(s => [s.source, s.points])), "acceptance_rate", 1);
});`;

export function statsHtml(cspSource: string): string {
  return webviewPage(cspSource, STATS_STYLE, STATS_BODY, STATS_SCRIPT);
}
