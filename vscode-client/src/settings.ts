// Pure helpers (no `vscode` import) so they are unit-testable with node's test runner.

export interface SpecdecConfig {
  serverCommand: string[];
  pythonInterpreter: string;
  target: string;
  draft: string;
  strategy: string;
  dtype: string;
  maxNewTokens: number;
  debounceMs: number;
  languages: string[];
  enabled: boolean;
  adapters: boolean;
}

/** The command line that starts `specdec serve` over stdio. */
export function serverCommand(config: SpecdecConfig): { command: string; args: string[] } {
  if (config.pythonInterpreter) {
    return { command: config.pythonInterpreter, args: ["-m", "specdec.cli", "serve"] };
  }
  const [command, ...args] = config.serverCommand.length ? config.serverCommand : ["specdec", "serve"];
  return { command, args };
}

/** What the server reads from initializationOptions / didChangeConfiguration (camelCase keys). */
export function initializationOptions(config: SpecdecConfig): Record<string, unknown> {
  return {
    target: config.target,
    draft: config.draft,
    strategy: config.strategy,
    dtype: config.dtype,
    maxNewTokens: config.maxNewTokens,
    debounceMs: config.debounceMs,
    languages: config.languages,
    enabled: config.enabled,
    adapters: config.adapters,
  };
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
  const lang = language ? stats.languages[language] : undefined;
  if (!lang || !lang.model_requests) {
    return "$(zap) specdec ready";
  }
  const accept = lang.acceptance_rate === null ? "–" : `${Math.round(lang.acceptance_rate * 100)}%`;
  const speed = lang.tokens_per_second === null ? "–" : lang.tokens_per_second.toFixed(1);
  return `$(zap) ${accept} accepted · ${speed} tok/s`;
}
