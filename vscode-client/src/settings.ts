// Pure helpers (no `vscode` import) so they are unit-testable with node's test runner.

import { SERVER_DEFAULTS, SERVER_KEYS, ServerSettings } from "./serverSettings";

/** The extension's own settings: how to start the server. The server's come from the generated module. */
export interface ClientSettings {
  serverCommand: string[];
  pythonInterpreter: string;
}

export type SpecdecConfig = ClientSettings & ServerSettings;

/** Reads one `specdec.*` setting with a fallback, as vscode's WorkspaceConfiguration.get does. */
export type ConfigGetter = <T>(key: string, fallback: T) => T;

/** The configuration: every server setting (what the user set, else its default) and the client's own. */
export function configFrom(get: ConfigGetter): SpecdecConfig {
  const server = Object.fromEntries(SERVER_KEYS.map((key) => [key, get(key, SERVER_DEFAULTS[key])]));
  return {
    serverCommand: get("serverCommand", ["specdec", "serve"]),
    pythonInterpreter: get("pythonInterpreter", ""),
    ...(server as unknown as ServerSettings),
  };
}

/** The command line that starts `specdec serve` over stdio. */
export function serverCommand(config: SpecdecConfig): { command: string; args: string[] } {
  if (config.pythonInterpreter) {
    return { command: config.pythonInterpreter, args: ["-m", "specdec.cli", "serve"] };
  }
  const [command, ...args] = config.serverCommand.length ? config.serverCommand : ["specdec", "serve"];
  return { command, args };
}

/**
 * What the server reads from initializationOptions (camelCase keys): every server setting, defaults included.
 * The defaults are the server's own (generated from its schema), and didChangeConfiguration sends the whole
 * `specdec` section with them too, so the server sees the same settings at start and after a change.
 */
export function initializationOptions(config: SpecdecConfig): Record<string, unknown> {
  return Object.fromEntries(SERVER_KEYS.map((key) => [key, config[key]]));
}

export interface LanguageStats {
  acceptance_rate: number | null;
  tokens_per_second: number | null;
  tokens_per_pass: number | null;
  model_requests: number;
}

export interface ServerStats {
  model: { state: string; error: string; target: string; strategy: string; adapter: string; progress?: string };
  languages: Record<string, LanguageStats>;
  timeline: Record<string, { time: number; acceptance_rate: number | null; tokens_per_pass: number | null;
    latency_p50_ms: number | null; user_accept_rate: number | null }[]>;
  finetune?: { registered?: string; message?: string };
  sources?: SourceStats;  // absent from a server older than the per-drafter-source stats
  engine?: { kind: string; state: string; reason?: string; url?: string };  // where completions are computed
}

/** A remote engine's outage as the status bar says it (server: specdec/backends/remote/health.py). */
const ENGINE_STATES: Record<string, string> = {
  unreachable: "engine unreachable", auth: "engine refused the key", http: "engine error",
  stalled: "engine stalled", ended: "engine stream ended early", shape: "engine reply not understood",
  timeout: "engine too slow",
};

/** One drafter source's (prompt lookup, draft model, repository index...) counts over a scope. */
export interface SourceRow {
  source: string; drafted: number; accepted: number; acceptance_rate: number | null; passes: number;
  tokens_per_pass: number | null; share_of_passes: number | null;
}

/** `specdec/stats`'s per drafter source part: lists, not objects keyed by source name. */
export interface SourceStats {
  total: SourceRow[];
  languages: (SourceRow & { language: string })[];
  workspaces: (SourceRow & { workspace: string })[];
  timeline: { source: string; points: { time: number; acceptance_rate: number | null; tokens_per_pass: number | null }[] }[];
}

/**
 * Whether to ask the editor for a suggestion now: the server has just become ready (started, restarted or
 * reloaded its models). Requests made while it was loading were answered empty, and an editor asks again only
 * on the next keystroke, so a user who typed during the load would otherwise wait for nothing.
 */
export function becameReady(previous: ServerStats | undefined, now: ServerStats | undefined, enabled: boolean): boolean {
  return enabled && now?.model.state === "ready" && previous?.model.state !== "ready";
}

/** Status bar text: loading / failed / off, else live acceptance and speed for the active language. */
export function statusText(stats: ServerStats | undefined, language: string | undefined, enabled: boolean): string {
  if (!enabled) {
    return "$(circle-slash) specdec off";
  }
  if (!stats) {
    return "$(sync~spin) specdec starting";
  }
  if (stats.model.state === "loading" || stats.model.state === "idle") {
    // first run: the server pulls the models (hundreds of MB) and says how far it is
    return stats.model.progress ? `$(sync~spin) specdec: ${stats.model.progress}` : "$(sync~spin) specdec loading models";
  }
  if (stats.model.state === "failed") {
    return "$(error) specdec: model failed";
  }
  if (stats.engine && stats.engine.state !== "ok") {
    return `$(warning) specdec: ${ENGINE_STATES[stats.engine.state] ?? "engine " + stats.engine.state}`;
  }
  const lang = language ? stats.languages[language] : undefined;
  if (!lang || !lang.model_requests) {
    return "$(zap) specdec ready";
  }
  const accept = lang.acceptance_rate === null ? "–" : `${Math.round(lang.acceptance_rate * 100)}%`;
  const speed = lang.tokens_per_second === null ? "–" : lang.tokens_per_second.toFixed(1);
  return `$(zap) ${accept} accepted · ${speed} tok/s`;
}
