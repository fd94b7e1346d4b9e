"""Every C++ extension of specdec is built here: once per machine, never wedged by a build that was killed,
never longer than a bound, and a failure is a reason string, not an exception: the caller keeps PyTorch's kernels.

Why not torch.utils.cpp_extension.load alone: its builders take turns through a baton file (`lock` in the
build folder) that only the builder that made it removes. A build killed mid-compile (the editor closed
during the first start) leaves it behind, and every later process waits on it forever. Here:
- builders take turns through an fcntl lock on `specdec.lock` beside the build, which dies with its
  process: a lock nobody holds is free, whatever files a killed builder left;
- the builder that holds it finds either a finished build (`<name>.built`, written last) or clears the
  folder of a killed build's leftovers (torch's baton, half-written objects) and builds from scratch;
- the compile runs in a child process in a session of its own (torch's builder, ninja, the compiler),
  killed as a group when it passes the bound (BUILD_TIMEOUT_S, SPECDEC_BUILD_TIMEOUT_S or timeout_s);
- the finished library is imported in this process; a later process imports it without the lock.

Each build gets a folder of its own, named by a hash of what the library depends on (sources, the headers
in its include folders, flags, torch's version and Python's), under torch's extension cache
(TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions) in `specdec/`.

SPECDEC_NATIVE_ISA (this is the one place that says what it means; `native_isa` applies it): the highest
instruction set specdec's native code may use, one of `avx2` < `avx512` < `amx`, for both extensions (the ops,
csrc/ops.cpp, whose paths are avx2 and avx512; the W4A8/W8A8 matmuls, csrc/w4a8.cpp: avx2, avx512 and amx). Each
runs on its best path at or below the named one that the CPU runs: `avx2` forces both onto AVX2 (what an AVX2-only
CPU runs), `avx512` keeps the matmuls' AMX tiles off, `amx` is the default on a CPU with AMX. Unset: each
extension's best path. A name that is not one of these, or one the CPU cannot run (`avx512` on an AVX2-only CPU,
`amx` without AMX): one warning line, and the CPU's best path; never an instruction the CPU lacks. Read once, when an
extension loads (the C++ does not read it); `isa_switched` (ops.use_isa, w4a8.use_isa) switches within a process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Sequence

BUILD_TIMEOUT_S = 600.0  # one build, compile and link, including the wait for another process building it
ISA_ENV = "SPECDEC_NATIVE_ISA"
ISAS = ("avx2", "avx512", "amx")  # lowest first: what SPECDEC_NATIVE_ISA may name (the module's docstring)
LOCK_FILE = "specdec.lock"
ERROR_PREFIX = "specdec-build-error: "
log = logging.getLogger("specdec.native")

# The child's whole program: torch's builder into the given folder; its first error line, marked, on failure.
_CHILD = r"""
import json, sys
spec = json.load(open(sys.argv[1]))
try:
    from torch.utils import cpp_extension
    common = dict(name=spec["name"], extra_cflags=spec["cflags"], extra_ldflags=spec["ldflags"],
                  extra_include_paths=spec["includes"], build_directory=spec["directory"],
                  is_python_module=spec["python_module"], verbose=False)
    if spec["text"] is not None:
        cpp_extension.load_inline(cpp_sources=spec["text"], functions=spec["functions"], **common)
    else:
        cpp_extension.load(sources=spec["sources"], **common)
except BaseException as exc:
    text = str(exc).strip()
    print("%s%s" % (spec["error_prefix"], text.splitlines()[0] if text else type(exc).__name__), flush=True)
    sys.exit(1)
"""


class Loaded(NamedTuple):
    """The extension (a Python module; for a torch.ops library, the path it was loaded from), or None and why."""

    module: object | None
    reason: str = ""


def build_timeout_s() -> float:
    """The bound on one build: SPECDEC_BUILD_TIMEOUT_S, else BUILD_TIMEOUT_S."""
    try:
        return float(os.environ.get("SPECDEC_BUILD_TIMEOUT_S") or BUILD_TIMEOUT_S)
    except ValueError:
        return BUILD_TIMEOUT_S


def build_root() -> Path:
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / "specdec"


def find_ninja() -> bool:
    """torch's builder runs `ninja` from PATH; the `ninja` package's binary counts when the venv is not activated
    (its folder then joins PATH, which the build's child process inherits)."""
    if shutil.which("ninja"):
        return True
    dirs = [str(Path(sys.executable).parent)]
    try:
        import ninja

        dirs.append(ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for directory in dirs:
        if shutil.which("ninja", path=directory):
            os.environ["PATH"] = directory + os.pathsep + os.environ.get("PATH", "")
            return True
    return False


def why_not_buildable() -> str:
    """Why no extension can be built here (no compiler, no ninja), or ''."""
    compiler = os.environ.get("CXX") or "c++"  # what torch's builder runs
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler})"
    if not find_ninja():
        return "no ninja (pip install ninja)"
    return ""


def _spec(name: str, sources, functions, extra_cflags, extra_ldflags, extra_include_paths,
          python_module: bool) -> dict:
    """What the child builds, and the hash of everything the library depends on (which names its folder)."""
    import torch

    text = [sources] if isinstance(sources, str) else None
    if text is None and sources and all(isinstance(s, str) and "\n" in s for s in sources):
        text = list(sources)  # several pieces of source text (a file's path has no newline)
    paths = [] if text is not None else [str(Path(s).resolve()) for s in sources]
    includes = [str(Path(p).resolve()) for p in extra_include_paths]
    digest = hashlib.sha256()
    for piece in text or []:
        digest.update(b"text\0" + piece.encode() + b"\0")
    for path in paths:
        digest.update(f"file {Path(path).name}\0".encode() + Path(path).read_bytes())
    for folder in includes:  # the headers the sources include: a change there must rebuild
        for header in sorted(p for p in Path(folder).iterdir() if p.is_file()):
            digest.update(f"include {header.name}\0".encode() + header.read_bytes())
    digest.update(json.dumps([name, functions, list(extra_cflags), list(extra_ldflags), python_module,
                              torch.__version__, sys.version.split()[0]]).encode())
    directory = build_root() / f"{name}-{digest.hexdigest()[:16]}"
    return {"name": name, "text": text, "sources": paths, "functions": functions, "cflags": list(extra_cflags),
            "ldflags": list(extra_ldflags), "includes": includes, "python_module": python_module,
            "directory": str(directory), "error_prefix": ERROR_PREFIX}


def build_dir(name: str, sources: Sequence[Path] | str | Sequence[str], *, functions: Sequence[str] | None = None,
              extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
              extra_include_paths: Sequence[Path | str] = (), python_module: bool = True) -> Path:
    """The folder load_extension builds this extension in (the same arguments)."""
    return Path(_spec(name, sources, list(functions) if functions else None, extra_cflags, extra_ldflags,
                      extra_include_paths, python_module)["directory"])


def load_extension(name: str, sources: Sequence[Path] | str | Sequence[str], *, functions: Sequence[str] | None = None,
                   extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
                   extra_include_paths: Sequence[Path | str] = (), python_module: bool = True,
                   timeout_s: float | None = None, label: str | None = None) -> Loaded:
    """Build (once per machine and source version) and load a C++ extension; Loaded(None, reason) where it cannot.

    sources: C++ files (torch.utils.cpp_extension.load), or source text, one string or several with
    newlines (load_inline, which binds `functions` to Python). python_module=False: a torch.ops library (registered
    with TORCH_LIBRARY), loaded with torch.ops.load_library. timeout_s bounds the build (default
    build_timeout_s()); past it the build is killed and a one-line warning says so. label: what the
    messages call it ("the W4A8 int4 kernel"), else its name.
    """
    label = label or name
    timeout = build_timeout_s() if timeout_s is None else float(timeout_s)
    reason = why_not_buildable()
    if reason:
        return Loaded(None, reason)
    try:
        spec = _spec(name, sources, list(functions) if functions else None, extra_cflags, extra_ldflags,
                     extra_include_paths, python_module)
        directory = Path(spec["directory"])
        if not _finished(directory, name):
            reason = _build_once(spec, directory, time.monotonic() + timeout, timeout, label)
            if reason:
                return Loaded(None, reason)
        return Loaded(_import(directory, name, python_module))
    except Exception as exc:  # noqa: BLE001 - whatever went wrong, the caller keeps PyTorch's kernels
        return Loaded(None, f"its build failed ({_first_line(exc)})")


def _library(directory: Path, name: str) -> Path:
    from torch.utils import cpp_extension

    return directory / f"{name}{getattr(cpp_extension, 'LIB_EXT', '.so')}"


def _finished(directory: Path, name: str) -> bool:
    return (directory / f"{name}.built").is_file() and _library(directory, name).is_file()


def _build_once(spec: dict, directory: Path, deadline: float, timeout: float, label: str) -> str:
    """Under the folder's lock: build unless another process finished it meanwhile. '' or why not."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_FILE, "a+b") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    log.warning("specdec: another process has been building %s in %s for over %.0f s; "
                                "using PyTorch's kernels", label, directory, timeout)
                    return f"another process is still building it (waited {timeout:.0f} s)"
                time.sleep(0.1)
        try:
            if _finished(directory, spec["name"]):
                return ""
            _clear(directory)
            print(f"specdec: building {label} once for this machine into {directory} (about a minute)",
                  file=sys.stderr, flush=True)
            reason = _compile(spec, directory, deadline, timeout, label)
            if not reason:
                done = directory / f".{spec['name']}.built.partial"
                done.write_text(json.dumps({"built": time.time()}))
                os.replace(done, directory / f"{spec['name']}.built")
            return reason
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _clear(directory: Path) -> None:
    """A build that did not finish (killed, timed out, failed) leaves its files: torch's baton `lock`, which
    would make torch's builder wait forever, and objects that may be half-written. Start from nothing."""
    for entry in directory.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _build_command(spec_file: Path) -> list[str]:
    """The child process that compiles (a function, so tests can put a slow or failing one in its place)."""
    return [sys.executable, "-c", _CHILD, str(spec_file)]


def _compile(spec: dict, directory: Path, deadline: float, timeout: float, label: str) -> str:
    spec_file = directory / "build.json"
    spec_file.write_text(json.dumps(spec))
    with open(directory / "build.log", "wb") as output:
        child = subprocess.Popen(_build_command(spec_file), stdout=output, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(child)
            _clear(directory)
            log.warning("specdec: the build of %s did not finish within %.0f s (SPECDEC_BUILD_TIMEOUT_S); "
                        "using PyTorch's kernels", label, timeout)
            return f"its build did not finish within {timeout:.0f} s"
        except BaseException:  # KeyboardInterrupt: no compiler left running behind us
            _kill(child)
            raise
    if code != 0:
        text = (directory / "build.log").read_text(errors="replace").splitlines()
        errors = [line[len(ERROR_PREFIX):] for line in text if line.startswith(ERROR_PREFIX)]
        first = errors[-1] if errors else (text[-1] if text else f"exit status {code}")
        return f"its build failed ({first}; see {directory / 'build.log'})"
    return ""


def _kill(child: subprocess.Popen) -> None:
    """The child and everything it started (ninja, the compiler): one session, one process group."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()
    child.wait()


def _import(directory: Path, name: str, python_module: bool):
    import importlib.util

    import torch

    library = _library(directory, name)
    if not python_module:
        torch.ops.load_library(str(library))
        return library
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_isa_warnings: set[str] = set()


def native_isa(paths: Sequence[str], best: str) -> str:
    """The path an extension runs on, given SPECDEC_NATIVE_ISA (the module's docstring): paths are the extension's
    own (a subset of ISAS, lowest first), best the best of them this CPU runs. A name that is not in ISAS, or one the
    CPU cannot run, is one warning line per process (the same line from both extensions is said once) and `best`."""
    raw = os.environ.get(ISA_ENV, "")
    wanted = raw.strip().lower()
    if not wanted:
        return best
    if wanted not in ISAS:
        _isa_warning(f"{ISA_ENV}={raw} ignored: not one of {', '.join(ISAS)}; the native code runs on the CPU's best "
                     "path")
        return best
    rank = ISAS.index
    # past this extension's own paths (amx for the ops) only a CPU short of its best path is known to lack it
    if rank(wanted) > rank(best) and (wanted in paths or best != paths[-1]):
        _isa_warning(f"{ISA_ENV}={wanted} ignored: this CPU cannot run it (its best: {best}); the native code runs "
                     f"on {best}")
        return best
    return max((p for p in paths if rank(p) <= min(rank(wanted), rank(best))), key=rank)


def _isa_warning(message: str) -> None:
    if message not in _isa_warnings:
        _isa_warnings.add(message)
        log.warning("%s", message)


@contextlib.contextmanager
def isa_switched(extension, name: str):
    """Run a built extension on instruction set `name` inside the block, then on the one it ran before
    (process-wide; for tests and benchmarks). The extension has isa() and set_isa(name), which refuses a path the
    CPU lacks."""
    before = extension.isa()
    extension.set_isa(name)
    try:
        yield
    finally:
        extension.set_isa(before)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
