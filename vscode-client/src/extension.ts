// The specdec VS Code extension: starts `specdec serve`, shows its inline completions (registered by
// vscode-languageclient), a live status bar item, a stats view, and fine-tune / toggle commands.
import * as vscode from "vscode";
import {
  CloseAction,
  ErrorAction,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from "vscode-languageclient/node";

import {
  SpecdecConfig, ServerStats, becameReady, configFrom, initializationOptions, serverCommand, statusText,
} from "./settings";
import { speculationHtml } from "./speculationView";
import { statsHtml } from "./statsView";

const POLL_MS = 3000;
const MAX_RESTARTS = 5;

let client: LanguageClient | undefined;
let status: vscode.StatusBarItem;
let lastStats: ServerStats | undefined;
let statsPanel: vscode.WebviewPanel | undefined;
let speculationPanel: vscode.WebviewPanel | undefined;
let speculationUri: string | undefined;  // the document whose completions the speculation view draws
let restarts: number[] = [];
let lastLanguage: string | undefined;
let typedWhileNotReady = false;  // the active document was edited while the server could not complete

function readConfig(): SpecdecConfig {
  const c = vscode.workspace.getConfiguration("specdec");
  return configFrom((key, fallback) => c.get(key, fallback));
}

function createClient(output: vscode.LogOutputChannel): LanguageClient {
  const config = readConfig();
  const { command, args } = serverCommand(config);
  const serverOptions: ServerOptions = { command, args };  // stdio; no transport, so no `--stdio` is appended
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    initializationOptions: initializationOptions(config),
    outputChannel: output,
    // the server re-reads these on workspace/didChangeConfiguration (section "specdec")
    synchronize: { configurationSection: "specdec" },
    middleware: {
      // a completion shown while the speculation view is open: draw its passes
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        const result = await next(document, position, context, token);
        const items = Array.isArray(result) ? result : result?.items;
        if (speculationPanel && items?.length) {
          void refreshSpeculation(client?.code2ProtocolConverter.asUri(document.uri));
        }
        return result;
      },
    },
    errorHandler: {
      error: () => ({ action: ErrorAction.Continue }),
      closed: () => {
        const now = Date.now();
        restarts = restarts.filter((t) => now - t < 180_000);
        restarts.push(now);
        if (restarts.length > MAX_RESTARTS) {
          void vscode.window.showErrorMessage(
            "specdec: the completion server keeps stopping; not restarting it. See the 'specdec' output.");
          return { action: CloseAction.DoNotRestart };
        }
        void vscode.window.showWarningMessage("specdec: the completion server stopped; restarting it.");
        return { action: CloseAction.Restart };
      },
    },
  };
  return new LanguageClient("specdec", "specdec", serverOptions, clientOptions);
}

async function pollStats(): Promise<void> {
  const previous = lastStats;
  if (client && client.state === State.Running) {
    try {
      lastStats = await client.sendRequest<ServerStats>("specdec/stats", {});
    } catch {
      lastStats = undefined;
    }
  } else {
    lastStats = undefined;  // stopped or restarting: never show the old server's numbers as live
  }
  const enabled = readConfig().enabled;
  if (becameReady(previous, lastStats, enabled) && typedWhileNotReady && vscode.window.activeTextEditor) {
    // what was typed while the models loaded got an empty answer: ask again at the cursor
    void vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
  }
  if (lastStats?.model.state === "ready") {
    typedWhileNotReady = false;
  }
  // the last text editor's language: focusing the stats view or a panel keeps what the status bar shows
  lastLanguage = vscode.window.activeTextEditor?.document.languageId ?? lastLanguage;
  const language = lastLanguage;
  status.text = statusText(lastStats, language, enabled);
  status.tooltip = lastStats
    ? `specdec: ${lastStats.model.target} (${lastStats.model.strategy})` +
      (lastStats.model.adapter ? `, adapter ${lastStats.model.adapter}` : "") + " — click for stats"
    : "specdec";
  if (statsPanel && lastStats) {
    void statsPanel.webview.postMessage(lastStats);
  }
}

function showStats(context: vscode.ExtensionContext): void {
  if (statsPanel) {
    statsPanel.reveal();
    return;
  }
  statsPanel = vscode.window.createWebviewPanel("specdecStats", "specdec stats", vscode.ViewColumn.Beside,
    { enableScripts: true, localResourceRoots: [] });
  statsPanel.webview.html = statsHtml(statsPanel.webview.cspSource);
  statsPanel.onDidDispose(() => (statsPanel = undefined), null, context.subscriptions);
  void pollStats();
}

/** Asks the server for the last completion's trace of the document (`specdec/trace`) and draws it. */
async function refreshSpeculation(uri?: string): Promise<void> {
  speculationUri = uri ?? speculationUri;
  if (!speculationPanel || !speculationUri || !client || client.state !== State.Running) {
    return;
  }
  try {
    const reply = await client.sendRequest("specdec/trace", { uri: speculationUri, limit: 1 });
    void speculationPanel?.webview.postMessage(reply);
  } catch {
    // a server from before specdec/trace, or one restarting: the view keeps what it shows
  }
}

function showSpeculation(context: vscode.ExtensionContext): void {
  const editor = vscode.window.activeTextEditor ?? vscode.window.visibleTextEditors[0];
  const uri = editor && client ? client.code2ProtocolConverter.asUri(editor.document.uri) : undefined;
  if (speculationPanel) {
    speculationPanel.reveal(vscode.ViewColumn.Beside, true);
  } else {
    speculationPanel = vscode.window.createWebviewPanel("specdecSpeculation", "specdec speculation",
      { viewColumn: vscode.ViewColumn.Beside, preserveFocus: true }, { enableScripts: true, localResourceRoots: [] });
    speculationPanel.webview.html = speculationHtml(speculationPanel.webview.cspSource);
    speculationPanel.onDidDispose(() => (speculationPanel = undefined), null, context.subscriptions);
    speculationPanel.webview.onDidReceiveMessage(() => void refreshSpeculation(), null, context.subscriptions);
  }
  void refreshSpeculation(uri);
}

async function finetuneWorkspace(): Promise<void> {
  const folders = vscode.workspace.workspaceFolders ?? [];
  const folder = folders.length === 1 ? folders[0] :
    await vscode.window.showWorkspaceFolderPick({ placeHolder: "Repository to fine-tune the draft on" });
  if (!folder || !client) {
    return;
  }
  await vscode.window.withProgress(
    { location: vscode.ProgressLocation.Notification, title: `specdec: fine-tuning the draft on ${folder.name}` },
    async () => {  // step-by-step progress comes from the server (work-done progress)
      const started = await client!.sendRequest<{ started: boolean; error?: string }>("workspace/executeCommand",
        { command: "specdec.finetune", arguments: [folder.uri.toString()] });
      if (!started.started) {
        void vscode.window.showErrorMessage(`specdec: ${started.error ?? "fine-tuning did not start"}`);
        return;
      }
      const before = JSON.stringify(lastStats?.finetune ?? {});
      for (;;) {  // the server reports step progress itself; wait for its result
        await new Promise((r) => setTimeout(r, POLL_MS));
        if (!client || client.state !== State.Running) {
          void vscode.window.showErrorMessage("specdec: the server stopped while fine-tuning; see the 'specdec' output.");
          return;
        }
        await pollStats();
        const now = lastStats?.finetune;
        if (now && JSON.stringify(now) !== before) {
          return;  // the server's own window/showMessage carries the result and the acceptance gain
        }
      }
    });
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel("specdec", { log: true });
  status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  status.command = "specdec.showStats";
  status.text = "$(sync~spin) specdec starting";
  status.show();
  client = createClient(output);
  context.subscriptions.push(
    // a stopped or restarting server shows at once, not at the next poll
    client.onDidChangeState(() => void pollStats()),
    output, status,
    vscode.commands.registerCommand("specdec.showStats", () => showStats(context)),
    vscode.commands.registerCommand("specdec.showSpeculation", () => showSpeculation(context)),
    vscode.commands.registerCommand("specdec.finetuneWorkspace", finetuneWorkspace),
    vscode.commands.registerCommand("specdec.toggle", async () => {
      const c = vscode.workspace.getConfiguration("specdec");
      await c.update("enabled", !c.get<boolean>("enabled", true), vscode.ConfigurationTarget.Global);
      void pollStats();
    }),
    vscode.commands.registerCommand("specdec.restartServer", async () => {
      restarts = [];
      await client?.restart();
    }),
    vscode.window.onDidChangeActiveTextEditor(() => void pollStats()),
    vscode.workspace.onDidChangeTextDocument((e) => {
      if (e.contentChanges.length && e.document === vscode.window.activeTextEditor?.document &&
          lastStats?.model.state !== "ready") {
        typedWhileNotReady = true;
      }
    }),
  );
  // a suggestion shown with its first lines is whole now: ask again at the cursor, the server's cache answers
  context.subscriptions.push(client.onNotification("specdec/suggestionReady", (params: { uri: string }) => {
    if (vscode.window.activeTextEditor?.document.uri.toString() === params.uri) {
      void vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
    }
  }));
  const timer = setInterval(() => void pollStats(), POLL_MS);
  context.subscriptions.push({ dispose: () => clearInterval(timer) });
  try {
    await client.start();
  } catch (err) {
    void vscode.window.showErrorMessage(
      `specdec: could not start the server (${String(err)}). Set specdec.serverCommand or specdec.pythonInterpreter.`);
  }
}

export async function deactivate(): Promise<void> {
  await client?.stop();
}
