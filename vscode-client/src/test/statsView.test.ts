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
