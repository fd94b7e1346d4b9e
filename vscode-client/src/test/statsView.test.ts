import assert from "node:assert/strict";
import { test } from "node:test";
import * as vm from "node:vm";

import { statsHtml } from "../statsView";

test("the stats webview's script parses and its CSP allows only it", () => {
  const html = statsHtml("vscode-resource:");
  const nonce = /script-src 'nonce-([a-z0-9]+)'/.exec(html)?.[1];
  assert.ok(nonce, "CSP names a script nonce");
  const scripts = [...html.matchAll(/<script nonce="([a-z0-9]+)">([\s\S]*?)<\/script>/g)];
  assert.equal(scripts.length, 1);
  assert.equal(scripts[0][1], nonce);
  assert.doesNotThrow(() => new vm.Script(scripts[0][2]), "the webview script is valid JavaScript");
  assert.match(html, /<canvas id="acceptance">/);
  assert.doesNotMatch(html, /https?:\/\//, "nothing is loaded from the network");
});

interface Element { innerHTML: string; textContent: string; clientWidth: number; clientHeight: number;
  width: number; height: number; labels: string[]; getContext(kind: string): unknown }

/** Run the webview's script against a minimal DOM, post it one `specdec/stats` answer, return its elements. */
function render(stats: unknown): Map<string, Element> {
  const script = /<script nonce="[a-z0-9]+">([\s\S]*?)<\/script>/.exec(statsHtml("vscode-resource:"))![1];
  const elements = new Map<string, Element>();
  const element = (id: string): Element => {
    if (!elements.has(id)) {
      const el: Element = { innerHTML: "", textContent: "", clientWidth: 760, clientHeight: 220, width: 0, height: 0,
        labels: [], getContext: () => context };
      // a canvas context that accepts every call and keeps the text drawn (the series' names)
      const context = new Proxy({} as Record<string | symbol, unknown>, {
        get: (t, k) => k === "fillText" ? (text: string) => el.labels.push(text) : (k in t ? t[k] : () => undefined),
        set: (t, k, v) => { t[k] = v; return true; },
      });
      elements.set(id, el);
    }
    return elements.get(id)!;
  };
  let onMessage: ((event: { data: unknown }) => void) | undefined;
  vm.runInNewContext(script, {
    document: { getElementById: element, body: {} },
    window: { devicePixelRatio: 1, addEventListener: (_: string, fn: typeof onMessage) => { onMessage = fn; } },
    getComputedStyle: () => ({ color: "#000" }),
  });
  assert.ok(onMessage, "the script listens for the stats");
  onMessage({ data: stats });
  return elements;
}

const row = (source: string, acceptance: number, tpp: number, share: number) => ({ source, drafted: 10,
  accepted: 5, acceptance_rate: acceptance, passes: 2, tokens_per_pass: tpp, share_of_passes: share });
const STATS = {
  model: { target: "t", strategy: "auto", state: "ready", adapter: "" },
  languages: { python: { requests: 2, model_requests: 2, acceptance_rate: 0.5, tokens_per_pass: 2, tokens_per_second: 9,
    latency_p50_ms: 100, latency_p95_ms: 120, prefill_reuse_rate: 0.8, shown: 2, user_accept_rate: 0.5 } },
  timeline: { python: [{ time: 1, acceptance_rate: 0.5, tokens_per_pass: 2, latency_p50_ms: 100, user_accept_rate: 1 }] },
};

test("the stats view renders a row per drafter source and language, repository and in all, and a chart per source", () => {
  const sources = {
    total: [row("draft-tree", 0.25, 1.5, 0.2), row("lookup", 0.75, 4, 0.5)],
    languages: [{ language: "python", ...row("lookup", 0.75, 4, 0.5) }, { language: "go", ...row("draft-tree", 0.25, 1.5, 0.2) }],
    workspaces: [{ workspace: "/home/me/src/a<b>", ...row("lookup", 0.75, 4, 0.5) }],
    timeline: [{ source: "draft-tree", points: [{ time: 1, acceptance_rate: 0.25, tokens_per_pass: 1.5 }] },
      { source: "lookup", points: [{ time: 1, acceptance_rate: 0.75, tokens_per_pass: 4 }, { time: 2, acceptance_rate: null, tokens_per_pass: null }] }],
  };
  const elements = render({ ...STATS, sources });
  const cells = [...elements.get("sources")!.innerHTML.matchAll(/<tr>(.*?)<\/tr>/g)].map(([, tr]) =>
    [...tr.matchAll(/<t[dh][^>]*>(.*?)<\/t[dh]>/g)].map(([, cell]) => cell));
  assert.deepEqual(cells, [
    ["source", "language / repository", "acceptance", "tokens/pass", "share of passes"],
    ["lookup", "python", "75%", "4.00", "50%"],
    ["draft-tree", "go", "25%", "1.50", "20%"],
    ["lookup", "a&lt;b&gt;", "75%", "4.00", "50%"],  // the repository's name, escaped; its path in the title
    ["draft-tree", "(all)", "25%", "1.50", "20%"],
    ["lookup", "(all)", "75%", "4.00", "50%"],
  ]);
  assert.match(elements.get("sources")!.innerHTML, /title="\/home\/me\/src\/a&lt;b&gt;"/);
  assert.deepEqual(elements.get("sourceAcceptance")!.labels.filter(l => /[a-z]/.test(l)), ["draft-tree", "lookup"]);
  assert.match(elements.get("table")!.innerHTML, /<td>python<\/td>/, "the per-language table is still drawn");
});

test("the stats view of a server without per-source stats says so and draws the rest", () => {
  const elements = render(STATS);
  assert.match(elements.get("sources")!.innerHTML, /no drafted passes yet/);
  assert.deepEqual(elements.get("sourceAcceptance")!.labels, ["no model requests yet"]);
  assert.match(elements.get("table")!.innerHTML, /<td>python<\/td>/);
});
