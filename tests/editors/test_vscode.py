"""Real VS Code (code-server 4.x in headless Debian chromium) with the packaged .vsix and our server on tiny models.

Tools: `vscode-client/e2e/install-tools.sh` (code-server, node 24, chromium) and `npm ci` in vscode-client;
`./setup.sh --test` runs both. Skipped with the reason when they are missing.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tiny
from lsp_server.metrics import aggregate, load_records

CLIENT = Path(__file__).resolve().parents[2] / "vscode-client"
INSTALL_TOOLS = CLIENT / "e2e" / "install-tools.sh"


def e2e_dir(env=None) -> Path:
    """Where install-tools.sh keeps the tools (its --print-dir: the tests' own cache, not the user's specdec cache)."""
    return Path(subprocess.run(["bash", str(INSTALL_TOOLS), "--print-dir"], capture_output=True, text=True,
                               check=True, env=os.environ if env is None else env, timeout=60).stdout.strip())


E2E_DIR = e2e_dir()


def _missing_tools() -> str:
    if not shutil.which("npm"):
        return "npm not found"
    if not (CLIENT / "node_modules" / "playwright-core").is_dir():
        return "vscode-client has no node_modules: run `npm ci` in vscode-client"
    if not (E2E_DIR / ".installed").is_file() or not Path("/usr/bin/chromium").is_file():
        return "code-server/chromium missing: run vscode-client/e2e/install-tools.sh"
    return ""


needs_tools = pytest.mark.skipif(bool(_missing_tools()), reason=f"real VS Code test: {_missing_tools()}")


def test_the_tools_live_in_the_tests_cache_not_the_users(tmp_path):
    """install-tools.sh's folder (what this test and run.js read, SPECDEC_E2E_DIR below) is under the tests' cache,
    ~/.cache/specdec-tests, never in the user's specdec cache; an install an older script left in the user's cache
    moves there (with chromium present, nothing else to install)."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_E2E_DIR", "SPECDEC_TEST_CACHE_DIR",
                                                             "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    assert e2e_dir(env) == home / ".cache" / "specdec-tests" / "vscode-e2e"
    xdg = tmp_path / "xdg"
    assert e2e_dir({**env, "XDG_CACHE_HOME": str(xdg)}) == xdg / "specdec-tests" / "vscode-e2e"
    assert e2e_dir({**env, "SPECDEC_TEST_CACHE_DIR": str(tmp_path / "t")}) == tmp_path / "t" / "vscode-e2e"
    assert e2e_dir({**env, "SPECDEC_E2E_DIR": str(tmp_path / "e")}) == tmp_path / "e"
    if not shutil.which("chromium"):
        return  # the move below would install chromium first
    old = home / ".cache" / "specdec" / "vscode-e2e"
    old.mkdir(parents=True)
    (old / ".installed").touch()
    (old / "node_modules").mkdir()
    done = subprocess.run(["bash", str(INSTALL_TOOLS)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    new = home / ".cache" / "specdec-tests" / "vscode-e2e"
    assert (new / ".installed").is_file() and (new / "node_modules").is_dir() and not old.exists()
    assert list((home / ".cache" / "specdec").iterdir()) == []


@pytest.fixture(scope="module")
def vsix():
    build = subprocess.run(["npm", "run", "--silent", "package"], cwd=CLIENT, capture_output=True, text=True,
                           timeout=1800)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    return CLIENT / "specdec.vsix"


@needs_tools
def test_vscode_ghost_text_tab_counted_stats_restart_and_toggle(vsix, tmp_path):
    target = tiny.save(tmp_path, seed=1, name="target")
    draft = tiny.save(tmp_path, seed=2, name="draft", layers=1, hidden=32)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "demo.py").write_text("def add(a, b):\n    \n\nprint(add(1, 2))\n")
    for i in range(3):  # more of the repository, so "Fine-tune draft on this repository" has files to train on
        (workspace / f"ops_{i}.py").write_text("".join(f"def op_{i}_{j}(a, b):\n    return a * {j} + b\n\n\n"
                                                       for j in range(12)))
    settings = tmp_path / "settings.json"
    log = tmp_path / "server.log"
    settings.write_text(json.dumps({
        "specdec.serverCommand": [sys.executable, "-m", "specdec.cli", "serve", "--log-file", str(log),
                                  "--log-level", "debug"],
        "specdec.target": str(target), "specdec.draft": str(draft), "specdec.dtype": "fp32",
        "specdec.debounceMs": 0, "specdec.maxNewTokens": 16,
    }))
    screenshots = Path(os.environ.get("SPECDEC_SCREENSHOT_DIR", tmp_path))  # the README's comes from here
    screenshots.mkdir(parents=True, exist_ok=True)
    screenshot = screenshots / "vscode-ghost-text.png"
    run = subprocess.run(
        ["node", "out/test/e2e/run.js", "--vsix", str(vsix), "--workspace", str(workspace), "--file", "demo.py",
         "--line", "2", "--column", "5", "--type", "r", "--settings", str(settings), "--screenshot", str(screenshot),
         # [s]: the pattern must not match the driver's own command line
         "--speculation", "--toggle", "--finetune", "--kill-server", f"[s]pecdec.cli serve --log-file {log}",
         # each of the driver's waits is on a state the editor or the server shows; its ceiling (and this
         # run's) only ends a stuck run: a busy machine may take minutes. code-server, its extension host
         # and our server carry the test's mark and are ended after it whatever happens (conftest)
         "--timeout", "900"],
        cwd=CLIENT, capture_output=True, text=True, timeout=3600, env={**os.environ, "SPECDEC_E2E_DIR": str(E2E_DIR)})
    print(run.stderr[-3000:], log.read_text()[-3000:] if log.exists() else "no server log")
    assert run.returncode == 0, run.stderr.strip().splitlines()[-1:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    first_line = result["ghost"].split("\n")[0]
    assert first_line.strip(), result
    # Tab put what was shown into the buffer, right after what was typed
    assert result["after"] != result["before"] and f"    r{first_line}" in result["after"]
    assert screenshot.stat().st_size > 10_000
    # the stats view got the server's data
    assert "python" in result["stats"]["table"] and result["stats"]["charts"] == 5  # 4 + acceptance per drafter source
    # "Show speculation of the last completion" drew the passes of the last completion of demo.py, tokens coloured
    # by what produced them; a new completion redrew it by itself, with p and q (recorded once a client asked)
    first, redrawn = result["speculation"]["first"], result["speculation"]["redrawn"]
    assert first["passes"] >= 1 and "p and q from the next completion on" in first["header"]
    kinds = {"draft", "lookup", "index", "bonus", "correction", "plain", "rejected"}
    for view in (first, redrawn):
        assert view["runs"] and {run[0].split()[0] for run in view["runs"]} <= kinds, view
        assert view["header"].startswith("auto · draft adapter none · ")
    assert "p and q from the next completion on" not in redrawn["header"]
    assert (screenshots / "vscode-ghost-text-speculation.png").stat().st_size > 10_000
    # the server was killed: the user was told, a new server came up, and the status bar is live again
    assert result["restart"]["warning"] == "specdec: the completion server stopped; restarting it."
    assert re.search("specdec ready|accepted", result["restart"]["status"])
    # "Toggle completions" reached the server as a settings change: typing brings no ghost text any more
    assert result["toggled"]["ghost"] == "" and "specdec off" in result["toggled"]["status"]
    assert result["toggled"]["ghostOn"]  # toggled back on, the same keystrokes bring ghost text again
    # the fine-tune command ran in the background and its result names the measured acceptance change
    assert re.fullmatch(r"specdec: (adapter \S+ registered|no adapter registered): acceptance [+-]\d\.\d{3}",
                        result["finetune"]["message"]), result["finetune"]
    stats = aggregate(load_records())  # the server's own metrics (SPECDEC_STATE_DIR is inherited through VS Code)
    assert stats["shown"] >= 1 and stats["accepted"] == 1
