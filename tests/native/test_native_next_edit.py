"""On the native target (Qwen2 and Llama tiny GGUFs), next-edit output with the edit drafter (alone in front of the
draft model, and in auto) is plain greedy output, token for token: the window prompts, the stop rule and the
drafter run unchanged on the native CachedLM, with a native draft or a transformers one."""

import importlib.util
from pathlib import Path

import pytest
from native_models import ARCHS, VOCAB, kernels_or_skip, native_model, plain_greedy

import tiny

_spec = importlib.util.spec_from_file_location("edit_window_tests", Path(__file__).parent.parent / "engine" /
                                               "test_edit_window.py")
edit_window_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(edit_window_tests)


@pytest.fixture(scope="module", params=ARCHS)
def target(request):
    kernels_or_skip()
    return native_model(seed=0, capacity=1024, arch=request.param)


@pytest.fixture(scope="module", params=["native-draft", "transformers-draft"])
def draft(request):
    if request.param == "native-draft":
        return native_model(seed=1, layers=1, capacity=1024)
    return tiny.model(seed=2, layers=1, hidden=32, vocab_size=VOCAB)


@pytest.mark.parametrize("strategy", ["edit", "auto", "plain"])
def test_next_edit_output_on_the_native_target_is_plain_greedy(target, draft, tok, strategy):
    edit_window_tests.check_plain_greedy(target, draft, tok, strategy,
                                         lambda ids, n, stops: plain_greedy(target, ids, n, stops))
