"""conftest's guarantee that a test's processes end (tests/processes.py): found by the mark in their environment,
a grandchild in a session of its own included (as Neovim starts its language server)."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from processes import MARK, end_marked, marked

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds processes through /proc")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_detached_grandchild_is_found_by_its_mark_and_ended():
    mark = uuid.uuid4().hex
    child = subprocess.Popen([sys.executable, "-c", (
        "import subprocess\n"
        "grandchild = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "print(grandchild.pid, flush=True)\n")], env={**os.environ, MARK: mark}, stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    child.wait()  # its parent is gone: no process group or parent link leads to it any more
    try:
        assert marked(mark) == [grandchild] and _alive(grandchild)
        assert marked(uuid.uuid4().hex) == []  # another test's mark finds nothing of it
        assert end_marked(mark, grace_s=30) == [grandchild]
        assert not _alive(grandchild) and marked(mark) == []
    finally:
        if _alive(grandchild):
            os.kill(grandchild, 9)


def test_every_test_runs_under_a_mark_of_its_own():
    assert len(os.environ[MARK]) == 32  # set by conftest.ends_its_processes, a new one per test
