import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import * as vm from "node:vm";

import { Trace, speculationHtml, speculationRuns } from "../speculationView";

// the recorded trace of tests/engine/test_trace_render.py, as `specdec/trace` returns it (that test keeps it in step)
const TRACE: Trace = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "..", "src", "test", "fixtures",
  "trace.json"), "utf8"));

test("the runs are the terminal's: each token by what produced it, rejected drafts where they were tried", () => {
  const runs = speculationRuns(TRACE);  // one run a token, so each has its own hover
  const merged: string[][] = [];
  for (const r of runs) {  // the terminal merges a source's consecutive tokens into one marker
    const last = merged[merged.length - 1];
    if (last && last[0] === r.style && ["draft", "lookup", "index", "plain"].includes(r.style)) {
      last[1] += r.text;
    } else {
      merged.push([r.style, r.text]);
    }
  }
  assert.deepEqual(merged, [
    ["plain", "def"], ["draft", " add(a, b"], ["bonus", "):"], ["lookup", "\n"], ["rejected", " x"],
    ["correction", "    return"], ["draft", " a"], ["rejected", " x b"], ["correction", " +"], ["plain", " b"],
    ["index", "\n"]]);  // as trace_render.segments gives them
  assert.equal(runs.filter((r) => r.style !== "rejected").map((r) => r.text).join(""), TRACE.text);
  const titled = (text: string) => runs.find((r) => r.text === text)!.title;
  assert.equal(titled(" a"), "pass 3 · accepted from draft-tree · p 0.900 · q 1.000");  // hover: p and q
  assert.equal(titled(" x b"), "pass 3 · rejected draft from repo · p 0.200 · q 1.000");
  assert.equal(titled(" add"), "pass 1 · accepted from draft");  // no p and q recorded for that pass
  assert.match(titled("):"), /bonus/);
});

test("a stop rule's cut inside a token is drawn as cut", () => {
  const runs = speculationRuns({ ...TRACE, text: "def add(a, b):\n    ret", new_tokens: 7 });
  assert.deepEqual(runs[runs.length - 1], { style: "correction", text: "    ret", pass: 2,
    title: "pass 2 · correction: drawn from norm(max(0, p − q)), or the argmax under greedy" });
});

interface Element { innerHTML: string; textContent: string }

function render(message: unknown): { elements: Map<string, Element>; posted: unknown[] } {
  const html = speculationHtml("vscode-resource:");
  const nonce = /script-src 'nonce-([a-z0-9]+)'/.exec(html)![1];
  const scripts = [...html.matchAll(/<script nonce="([a-z0-9]+)">([\s\S]*?)<\/script>/g)];
  assert.equal(scripts.length, 1);
  assert.equal(scripts[0][1], nonce);
  assert.doesNotMatch(html, /https?:\/\//, "nothing is loaded from the network");
  const elements = new Map<string, Element>();
  const element = (id: string) => elements.get(id) ?? elements.set(id, { innerHTML: "", textContent: "" }).get(id)!;
  const posted: unknown[] = [];
  let onMessage: ((event: { data: unknown }) => void) | undefined;
  vm.runInNewContext(scripts[0][2], {
    document: { getElementById: element },
    window: { addEventListener: (_: string, fn: typeof onMessage) => { onMessage = fn; } },
    acquireVsCodeApi: () => ({ postMessage: (m: unknown) => posted.push(m) }),
  });
  assert.ok(onMessage, "the script listens for traces");
  onMessage({ data: message });
  return { elements, posted };
}

test("the webview draws the completion coloured, the summary, the passes and a branched pass's tree", () => {
  const { elements, posted } = render({ uri: "file:///a.py", traces: [TRACE] });
  assert.deepEqual(posted, ["ready"]);
  const completion = elements.get("completion")!.innerHTML;
  assert.match(completion, /^<span class="plain" title="pass 0 · the prefill pass">def<\/span><span class="draft"/);
  assert.match(completion, /<span class="rejected" title="pass 3 · rejected draft from repo · p 0.200 · q 1.000"> x b/);
  assert.match(elements.get("header")!.textContent, /auto · draft adapter py-repo@3 · 20 prompt tokens · 11 new/);
  assert.match(elements.get("summary")!.innerHTML, /<td>repo<\/td><td>2<\/td><td>3<\/td><td>1<\/td><td>0.50<\/td>/);
  assert.match(elements.get("summary")!.innerHTML, /<td>all<\/td><td>4<\/td><td>10<\/td><td>6<\/td><td>0.75<\/td>/);
  const passes = elements.get("passes")!.innerHTML;
  assert.equal([...passes.matchAll(/<tr class="pass">/g)].length, 6);
  assert.equal([...passes.matchAll(/<tr class="branched">/g)].length, 1, "only pass 3 branched");
  // its tree: " a" (accepted, draft) with " x" → " b" (rejected, index) under it, and " -" (lookup) beside it
  assert.match(passes, /<ul class="tree"><li><span class="draft" title="pass 3 · draft-tree · p 0.900 · q 1.000">&quot; a&quot;/);
  assert.match(passes, /<span class="lookup rejected" title="pass 3 · lookup-tree · p 0.050 · q 1.000">&quot; -&quot;/);
});

test("a document without a completion yet says so", () => {
  const { elements } = render({ uri: "file:///a.py", traces: [] });
  assert.match(elements.get("header")!.textContent, /no completion of this document yet/);
  assert.equal(elements.get("completion")!.innerHTML, "");
});
