// The speculation webview: the last completion of the active document pass by pass, from the server's
// `specdec/trace` (the JSON `specdec complete --trace-json` writes). Tokens are coloured by what produced them,
// as `specdec complete --trace` colours them in a terminal (specdec/engine/trace_render.py): accepted from the
// draft model (green), prompt lookup (cyan) or the repository index (magenta), the target's bonus (yellow) and
// correction (red) tokens, rejected drafts dimmed and struck through where they were tried. Hovering a token
// shows the target's p and the draft's q (recorded from the first time this view asks). A pass whose draft
// branched is drawn as its tree. Self-contained: nothing is loaded from the network.

import { webviewPage } from "./webview";

export interface TracePass {
  prefill: boolean; tokens: number[]; parents: number[]; sources: string[]; path: number[]; next_token: number;
  next: string; depth: number; plan: { parents: number[]; ranks: number[] } | null; p: number[] | null;
  q: number[] | null; draft_ms: number; verify_ms: number; node_text?: string[]; next_text?: string;
}

export interface SourceRow {
  source?: string; passes: number; drafted: number; accepted: number; alpha: number; k: number;
  expected_tokens_per_pass: number; measured_tokens_per_pass: number;
}

export interface Trace {
  strategy: string; adapter: string; prompt_tokens: number; new_tokens: number; stop_reason: string; text: string;
  tokens: number[]; pieces?: string[]; passes: TracePass[]; shown?: string;
  summary: { sources: SourceRow[]; all: SourceRow; target_passes: number; tokens_per_pass: number };
}

export interface Run { style: string; text: string; pass: number; title: string }

/** The completion as coloured runs, in order (the terminal's segments): style is the accepted token's source
 * kind ("draft", "lookup", "index"), "bonus", "correction", "plain" or "rejected" (text the completion does not
 * contain). Without the rejected runs the texts join to the completion. Self-contained: the webview runs its
 * source as is. */
export function speculationRuns(trace: Trace): Run[] {
  const kinds: Record<string, string> = { "draft": "draft", "draft-tree": "draft", "lookup": "lookup",
    "lookup-tree": "lookup", "repo": "index" };
  const kind = (source: string) => kinds[source] ?? source;
  const pct = (v: number | undefined) => v === undefined ? "–" : v.toFixed(3);
  const pieces = trace.pieces ?? [];
  let budget = trace.text.length;
  let position = 0;
  const out: Run[] = [];
  const emit = (style: string, text: string, pass: number, title: string) => {
    if (style !== "rejected") {
      text = text.slice(0, Math.max(0, budget));
      budget -= text.length;
    }
    if (text) {
      out.push({ style, text, pass, title });
    }
  };
  const children = (r: TracePass, node: number) => r.parents.flatMap((parent, i) => parent === node ? [i] : []);
  const probs = (r: TracePass, node: number) => r.p ? ` · p ${pct(r.p[node])} · q ${pct(r.q?.[node])}` : "";
  for (let i = 0; i < trace.passes.length; i++) {
    const r = trace.passes[i];
    let last = -1;
    for (const node of r.path) {
      if (position >= pieces.length) {
        break;
      }
      emit(kind(r.sources[node]), pieces[position], i, `pass ${i} · accepted from ${r.sources[node]}${probs(r, node)}`);
      last = node;
      position++;
    }
    if (position >= pieces.length || budget <= 0) {
      break;
    }
    if (r.next === "correction") {
      const texts = r.node_text ?? r.tokens.map(String);
      for (const child of children(r, last)) {
        let text = texts[child];
        for (let next = children(r, child); next.length; next = children(r, next[0])) {
          text += texts[next[0]];
        }
        emit("rejected", text, i, `pass ${i} · rejected draft from ${r.sources[child]}${probs(r, child)}`);
      }
    }
    const how = r.next === "plain" ? (r.prefill ? "the prefill pass" : "a pass with nothing drafted") :
      r.next === "bonus" ? "bonus: every drafted token accepted, drawn from p" :
        "correction: drawn from norm(max(0, p − q)), or the argmax under greedy";
    emit(r.next, pieces[position], i, `pass ${i} · ${how}`);
    position++;
  }
  return out;
}

const SPECULATION_STYLE = `  pre { font-family: var(--vscode-editor-font-family); font-size: var(--vscode-editor-font-size);
        white-space: pre-wrap; background: var(--vscode-editor-background); padding: 0.6em; border-radius: 4px; }
  .draft { color: #3fb950; } .lookup { color: #39c5cf; } .index { color: #d2a8ff; }
  .bonus { color: #e3b341; font-weight: bold; } .correction { color: #f85149; font-weight: bold; }
  .rejected { opacity: 0.45; text-decoration: line-through; }
  .passes span[title], pre span[title] { cursor: help; }
  table { border-collapse: collapse; margin: 0.6em 0; }
  td, th { padding: 2px 9px; text-align: right; border-bottom: 1px solid var(--vscode-panel-border); }
  th:first-child, td:first-child { text-align: left; }
  tr.branched td { text-align: left; }  /* a tree reads from the left: right-aligned, its indentation is lost */
  ul.tree { list-style: none; margin: 0.2em 0 0.2em 1.2em; padding: 0; font-family: var(--vscode-editor-font-family); }
  ul.tree li::before { content: "└ "; opacity: 0.5; }
  .legend span { margin-right: 1.2em; } .muted { opacity: 0.7; }`;

const SPECULATION_BODY = `<h2>Speculation of the last completion</h2>
<div id="header" class="muted">no completion of this document yet: ask for one, then run this command again</div>
<div class="legend"><span class="draft">draft model</span><span class="lookup">prompt lookup</span>
<span class="index">repository index</span><span class="bonus">bonus</span><span class="correction">correction</span>
<span class="rejected">rejected drafts</span><span>plain: the target alone</span></div>
<pre id="completion"></pre>
<h3>Per drafter source: measured beside (1 − α^(k+1)) / (1 − α)</h3><table id="summary"></table>
<h3>Passes</h3><div id="passes" class="passes"></div>`;

const SPECULATION_SCRIPT = `${speculationRuns.toString()}
const esc = s => String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]);
const KINDS = { "draft": "draft", "draft-tree": "draft", "lookup": "lookup", "lookup-tree": "lookup", "repo": "index" };
const num = (v, d) => v === null || v === undefined ? "–" : v.toFixed(d);
function span(style, text, title) {
  return '<span class="' + style + '"' + (title ? ' title="' + esc(title) + '"' : "") + ">" + esc(text) + "</span>";
}
function tree(r, i) {
  // the drafted tree, each node coloured by its source; the accepted path bold, the rest dimmed
  const texts = r.node_text || r.tokens.map(String);
  const accepted = new Set(r.path);
  const level = parent => {
    const kids = r.parents.flatMap((p, n) => p === parent ? [n] : []);
    return kids.length ? '<ul class="tree">' + kids.map(n => "<li>" + span(
      (KINDS[r.sources[n]] || r.sources[n]) + (accepted.has(n) ? "" : " rejected"), JSON.stringify(texts[n]),
      "pass " + i + " · " + r.sources[n] + (r.p ? " · p " + num(r.p[n], 3) + " · q " + num(r.q[n], 3) : "")) +
      level(n) + "</li>").join("") + "</ul>" : "";
  };
  return level(-1);
}
function show(message) {
  const trace = message.traces && message.traces[message.traces.length - 1];
  if (!trace) {
    document.getElementById("header").textContent = "no completion of this document yet: ask for one, then run " +
      "this command again";
    document.getElementById("completion").innerHTML = "";
    document.getElementById("summary").innerHTML = "";
    document.getElementById("passes").innerHTML = "";
    return;
  }
  document.getElementById("header").textContent = trace.strategy + " · draft adapter " + (trace.adapter || "none") +
    " · " + trace.prompt_tokens + " prompt tokens · " + trace.new_tokens + " new (" + trace.stop_reason + ") · " +
    trace.passes.length + " target passes · " + num(trace.summary.tokens_per_pass, 2) + " tokens per pass" +
    (trace.probabilities ? "" : " · p and q from the next completion on");
  document.getElementById("completion").innerHTML = speculationRuns(trace).map(r => span(r.style, r.text, r.title))
    .join("");
  const rows = trace.summary.sources.concat([Object.assign({ source: "all" }, trace.summary.all)]);
  document.getElementById("summary").innerHTML = "<tr><th>source</th><th>passes</th><th>drafted</th>" +
    "<th>accepted</th><th>α</th><th>k</th><th>expected</th><th>measured</th></tr>" + rows.map(s => "<tr><td>" +
    esc(s.source) + "</td><td>" + s.passes + "</td><td>" + s.drafted + "</td><td>" + s.accepted + "</td><td>" +
    num(s.alpha, 2) + "</td><td>" + num(s.k, 2) + "</td><td>" + num(s.expected_tokens_per_pass, 2) + "</td><td>" +
    num(s.measured_tokens_per_pass, 2) + "</td></tr>").join("");
  document.getElementById("passes").innerHTML = "<table><tr><th>pass</th><th>drafted</th><th>by</th><th>accepted</th>" +
    "<th>next</th><th>plan</th><th>draft ms</th><th>verify ms</th></tr>" + trace.passes.map((r, i) => {
      const by = r.prefill ? "prefill" : Array.from(new Set(r.sources.map(s => KINDS[s] || s))).join(", ") || "–";
      const branched = r.tokens.length > r.depth;
      return '<tr class="pass"><td>' + i + "</td><td>" + r.tokens.length + "</td><td>" + esc(by) + "</td><td>" +
        r.path.length + "</td><td>" + span(r.next, r.next + " " + JSON.stringify(r.next_text ?? r.next_token), "") +
        "</td><td>" + (r.plan ? r.plan.parents.length + " nodes" : "–") + "</td><td>" + num(r.draft_ms, 1) +
        "</td><td>" + num(r.verify_ms, 1) + "</td></tr>" +
        (branched ? '<tr class="branched"><td></td><td colspan="7">' + tree(r, i) + "</td></tr>" : "");
    }).join("") + "</table>";
}
window.addEventListener("message", event => show(event.data));
acquireVsCodeApi().postMessage("ready");  // a trace posted before the script ran was lost: ask again`;

export function speculationHtml(cspSource: string): string {
  return webviewPage(cspSource, SPECULATION_STYLE, SPECULATION_BODY, SPECULATION_SCRIPT);
}
