"""specdec.native.build: a build killed mid-compile never wedges the next one, a build past its bound falls back
with one warning, and two processes building at once take turns (issue #40.8).

The extension here is a plain CPython module in C++ (no torch headers), so each build takes seconds."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.native import build

TINY = r"""
#include <Python.h>
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "specdec_tiny", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_specdec_tiny(void) { return PyModule_Create(&module); }
"""
GENEROUS_S = 600  # a ceiling for a loaded machine, not an expectation


@pytest.fixture
def source(tmp_path, monkeypatch):
    """tiny.cpp, built under this test's own extension cache."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    reason = build.why_not_buildable()
    if reason:
        pytest.skip(f"no C++ extension builds here: {reason}")
    path = tmp_path / "tiny.cpp"
    path.write_text(TINY)
    return path


def load(source, **kwargs) -> build.Loaded:
    return build.load_extension("specdec_tiny", [source], **{"timeout_s": GENEROUS_S, **kwargs})


def live_members(group: int) -> list[int]:
    """Processes of a process group that still run (a zombie waiting for its reaper does not count)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[2]) == group and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def members_after_kill(group: int, ceiling_s: float = 60.0) -> list[int]:
    """The group's live members once SIGKILL has taken effect: the signal reaches each process at once, but a
    process killed on a loaded machine still runs its exit for a while before it shows as a zombie, so /proc is
    read until the group is empty. A survivor (the hung compile's `sleep 600`) outlives the ceiling and is returned."""
    deadline = time.monotonic() + ceiling_s
    while (found := live_members(group)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_a_lock_left_by_a_killed_build_is_cleared_and_the_build_proceeds(source):
    """A builder killed mid-compile: it held the lock and left torch's baton and half-written files behind."""
    folder = build.build_dir("specdec_tiny", [source])
    folder.mkdir(parents=True)
    killed = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        "lock = open(sys.argv[1] + '/specdec.lock', 'a+b'); fcntl.flock(lock, fcntl.LOCK_EX)\n"
        "open(sys.argv[1] + '/lock', 'w').close()  # torch's baton\n"
        "open(sys.argv[1] + '/specdec_tiny.so', 'wb').write(b'\\x7fELF half')\n"
        "open(sys.argv[1] + '/tiny.o', 'wb').write(b'half')\n"
        "print('compiling', flush=True); time.sleep(600)\n"), str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout.readline().strip() == "compiling"
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    assert (folder / "lock").exists() and (folder / "specdec.lock").exists()
    loaded = load(source)
    assert loaded.reason == "" and loaded.module.answer() == 42
    assert not (folder / "lock").exists() and (folder / "specdec_tiny.built").is_file()
    again = load(source, timeout_s=0)  # built: a later load imports it, no build, no wait
    assert again.reason == "" and again.module.answer() == 42


def test_a_build_past_its_bound_is_killed_and_falls_back_with_one_warning(source, monkeypatch, caplog, tmp_path):
    started = []
    real_popen = subprocess.Popen

    def recording(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(build.subprocess, "Popen", recording)
    monkeypatch.setattr(build, "_build_command", lambda spec: ["sh", "-c", "sleep 600 & wait"])  # a compile that hangs
    loaded = load(source, timeout_s=0.5)
    assert loaded.module is None and "did not finish within" in loaded.reason
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "did not finish" in warnings[0] and "\n" not in warnings[0]
    (child,) = started
    assert child.returncode is not None and members_after_kill(child.pid) == []  # the hung compile was killed, all of it
    folder = build.build_dir("specdec_tiny", [source])
    assert not (folder / "specdec_tiny.built").exists()
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    loaded = load(source)  # the next start is not wedged by the killed one
    assert loaded.reason == "" and loaded.module.answer() == 42


def test_a_failed_build_is_a_reason_not_an_exception(source, monkeypatch):
    monkeypatch.setattr(build, "_build_command", lambda spec: [
        sys.executable, "-c", f"print({build.ERROR_PREFIX + 'Error building extension'!r}); raise SystemExit(1)"])
    loaded = load(source)
    assert loaded.module is None and loaded.reason.startswith("its build failed (Error building extension")


def test_two_processes_building_at_once_take_turns(source):
    program = ("import sys; from pathlib import Path; from specdec.native.build import load_extension\n"
               f"loaded = load_extension('specdec_tiny', [Path(sys.argv[1])], timeout_s={GENEROUS_S})\n"
               "print(loaded.module.answer() if loaded.module else loaded.reason)\n")
    builders = [subprocess.Popen([sys.executable, "-c", program, str(source)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=os.environ.copy()) for _ in range(2)]
    try:
        results = [b.communicate(timeout=2 * GENEROUS_S) for b in builders]
    finally:
        for b in builders:
            b.kill()
            b.wait()
    assert [out.strip() for out, _ in results] == ["42", "42"], results
    assert sum(err.count("specdec: building") for _, err in results) == 1  # one built, the other waited for it
