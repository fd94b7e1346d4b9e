"""The tests' own cache for what real models and real data sets make (pulls, bf16 conversions, packed weights, the
HumanEval file), never the user's: conftest.py's `real_cache` fixture runs `real_cache` here. The slow and smoke
tests that pull, convert or fetch take it (tests/test_real_models.py, tests/models/test_int4.py,
tests/bench/test_humaneval.py); every other test has a cache in its own tmp folder (conftest's isolated_dirs)."""

import os
import sys
from pathlib import Path

from platformdirs import user_cache_dir

# The user's specdec cache as specdec finds it (read before conftest points SPECDEC_CACHE_DIR at a tmp folder).
USER_CACHE = Path(os.environ.get("SPECDEC_CACHE_DIR") or user_cache_dir("specdec"))


def own_cache() -> Path:
    """The tests' own cache, reused between runs: SPECDEC_TEST_CACHE_DIR, else ~/.cache/specdec-tests
    (vscode-client/e2e/install-tools.sh keeps the editor test's tools in its vscode-e2e/)."""
    root = os.environ.get("SPECDEC_TEST_CACHE_DIR")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec-tests"


_WRITES = {"os.mkdir": (0,), "os.rename": (1,), "os.remove": (0,), "os.rmdir": (0,), "os.symlink": (1,),
           "os.link": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.utime": (0,), "shutil.rmtree": (0,),
           "shutil.copyfile": (1,), "shutil.move": (0, 1)}  # audit event -> which arguments it writes
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_watches: list = []


class UserCacheWrites:
    """While open, every write this process makes under `folder` (and through a link into it), seen by a Python audit
    hook: open() for writing, mkdir, rename and replace, remove, links, rmtree... (what specdec's pulls, conversions
    and caches do). Another process's writes are not this test's, so a user's server or pull running meanwhile
    cannot fail it, as a before/after listing would."""

    def __init__(self, folder: Path):
        self.folder = os.path.realpath(folder)
        self.seen: list[str] = []

    def __enter__(self):
        if not _watches and not getattr(sys, "_specdec_cache_audit", False):
            sys.addaudithook(_audit)  # once per process (a hook cannot be removed): idle while nothing watches
            sys._specdec_cache_audit = True
        _watches.append(self)
        return self

    def __exit__(self, *exc):
        _watches.remove(self)

    def check(self, event: str, path) -> None:
        if isinstance(path, int) or path is None:
            return
        target = os.path.realpath(os.fsdecode(path))
        if target == self.folder or target.startswith(self.folder + os.sep):
            self.seen.append(f"{event} {target}")


def _audit(event: str, args: tuple) -> None:
    if not _watches:
        return
    if event == "open":
        path, mode, flags = args
        if not ((isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & _WRITE_FLAGS)):
            return
        writes = (path,)
    elif event in _WRITES:
        writes = tuple(args[i] for i in _WRITES[event])
    else:
        return
    for watch in _watches:
        for path in writes:
            watch.check(event, path)


def link_user_downloads(cache: Path) -> None:
    """The checked GGUFs (and any wheels, and the pinned HumanEval file) the user's cache already holds, linked into the tests' cache and read
    through the links, never written: a pull finds them instead of downloading them again. What the tests make
    (tokenizer files, bf16 conversions, packed weights, a download the user's cache lacks) lands in theirs."""
    from specdec.models.catalog import KNOWN_MODELS

    for folder, names in (("models/gguf", [m.wheels.gguf_name for m in KNOWN_MODELS.values()]),
                          ("wheels", [w.name for w in (USER_CACHE / "wheels").glob("*.whl")]),
                          ("bench-sources", [f.name for f in (USER_CACHE / "bench-sources").glob("HumanEval-*.gz")])):
        for name in names:
            ours, theirs = cache / folder / name, USER_CACHE / folder / name
            if ours.is_symlink() and not ours.exists():  # its target is gone: a pull downloads a file of ours
                ours.unlink()
            if theirs.is_file() and not theirs.is_symlink() and not ours.exists():
                ours.parent.mkdir(parents=True, exist_ok=True)
                ours.symlink_to(theirs)


def real_cache(monkeypatch):
    """The `real_cache` fixture (conftest.py): real models in the tests' own cache (own_cache(), reused between runs), the user's left as it
    was found: SPECDEC_CACHE_DIR points there, the user's GGUFs and wheels are read through links
    (link_user_downloads), and the test fails if it wrote anything under the user's cache (UserCacheWrites). Under
    SPECDEC_TEST_REAL_CACHE (CI), SPECDEC_CACHE_DIR's as it is."""
    if "SPECDEC_TEST_REAL_CACHE" in os.environ:
        yield Path(os.environ.get("SPECDEC_CACHE_DIR") or USER_CACHE)
        return
    cache = own_cache() / "specdec-cache"
    assert not cache.resolve().is_relative_to(USER_CACHE.resolve()), (cache, USER_CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    link_user_downloads(cache)
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(cache))
    with UserCacheWrites(USER_CACHE) as writes:
        yield cache
    assert not writes.seen, f"the test wrote in the user's cache {USER_CACHE}: {writes.seen[:5]}"
