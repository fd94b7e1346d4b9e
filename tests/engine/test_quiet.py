"""A generation says nothing through transformers: no deprecation warning, no transformers log line (issue #40,
item 4: every completion printed transformers' `past_key_values` deprecations).

transformers logs a deprecation once per process (`warning_once`, an lru_cache): the fixture clears that cache, so
a line an earlier test already drew still counts here.
"""

import logging
import warnings

import pytest

from specdec.engine.cost_curve import CostCurve
from specdec.engine.session import GenerationConfig, greedy_reference
from specdec.engine.strategies import make_session


@pytest.fixture
def transformers_log():
    """The records transformers' loggers emit (they do not propagate to the root logger, so caplog misses them)."""
    from transformers.utils import logging as hf_logging

    logging.Logger.warning_once.cache_clear()
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    library = hf_logging.get_logger("transformers")
    library.addHandler(handler)
    try:
        yield records
    finally:
        library.removeHandler(handler)


@pytest.mark.parametrize("strategy", ["plain", "draft", "tree"])
def test_a_generation_warns_nothing(target, unrelated_draft, tok, transformers_log, strategy):
    """plain: the target's KV cache; draft: the draft model's own cache too; tree: the tree-masked passes."""
    session = make_session(target, tok, strategy, draft_model=unrelated_draft if strategy != "plain" else None,
                           stop_token_ids={tok.eos_token_id}, cost_curve=CostCurve((1, 8), (0.010, 0.013)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for text in ("def add(a, b):\n    return", "class Point:\n    def"):
            out = session.generate(tok.encode(text), GenerationConfig(max_new_tokens=12, max_draft=4))
            assert out.tokens
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []
    assert [r.getMessage() for r in transformers_log if r.levelno >= logging.WARNING] == []


def test_the_hf_baselines_warn_nothing(target, unrelated_draft, tok, transformers_log):
    """greedy_reference and the bench's hf-* rows run transformers' own generate."""
    from specdec_bench.runner import hf_generate

    prompt = tok.encode("def add(a, b):\n    return")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reference = greedy_reference(target, prompt, 8, {tok.eos_token_id})
        for strategy in ("hf-plain", "hf-assisted", "hf-lookup"):
            out, _ = hf_generate(strategy, target, unrelated_draft, prompt, 8, {tok.eos_token_id})
            assert out == reference, strategy
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []
    assert [r.getMessage() for r in transformers_log if r.levelno >= logging.WARNING] == []
