"""Issue #52 item 10: a prompt longer than the native forward's cache (maxPrefixTokens is accepted up to 32768,
the cache holds lm.CAPACITY committed tokens) made every completion in a long file fail quietly ("generation
failed" in the log, nothing in the editor). The prompt window is now cut to what the cache holds besides the
completion, said once; completions in a long file work, and the cut stays put while the user types."""

import logging

import pytest
from native_models import hf_model, kernels_or_skip

import tiny
from gguf_files import write_qwen2_gguf
from specdec.backends.base import CompletionRequest
from specdec.backends.local import LocalBackend
from specdec.native import lm

CAPACITY = 256  # the cache's committed tokens in this test (4096 in production)
NEW_TOKENS = 16
LINE = "def function_{i}(a, b):\n    return a + b * {i}\n\n"


@pytest.fixture
def backend(tmp_path, monkeypatch):
    """The server's local backend on a tiny Qwen2 GGUF, the native forward with a small cache."""
    kernels_or_skip()
    from lsp_server.settings import Settings

    gguf = tmp_path / "tiny-qwen2.gguf"
    write_qwen2_gguf(hf_model(), gguf, tokenizer=tiny.tokenizer())
    monkeypatch.setattr(lm, "CAPACITY", CAPACITY)
    settings = Settings().update({"target": str(gguf), "draft": "", "strategy": "lookup", "forward": "native",
                                  "maxNewTokens": NEW_TOKENS, "maxPrefixTokens": 32768, "adapters": False})
    backend = LocalBackend()
    backend.load(settings)
    assert backend.ready, backend.error
    yield backend
    backend.executor.shutdown()


def test_a_long_file_completes_with_the_prompt_cut_to_the_cache(backend, caplog):
    prefix = "".join(LINE.format(i=i) for i in range(400))  # thousands of tokens, far past the cache
    tokenizer = backend.completer.session.tokenizer
    assert len(tokenizer.encode(prefix)) > 4 * CAPACITY
    results = []
    with caplog.at_level(logging.WARNING):
        for typed in ("def ", "def f", "def fu"):  # three keystrokes at the end of a long file
            request = CompletionRequest(prefix + typed, "\n", path="long.py", max_new_tokens=NEW_TOKENS)
            results.append(backend.executor.submit(backend.complete, request).result(300))
    for result in results:
        prompt = result.stats["prefill_computed"] + result.stats["prefill_reused"]
        assert prompt + NEW_TOKENS <= CAPACITY and result.stop_reason in ("eos", "max_tokens", "stop")
    assert results[1].stats["prefill_reused"] > 0 and results[2].stats["prefill_reused"] > 0  # the cut stayed put
    said = [r for r in caplog.records if "do not fit the model's cache" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0].getMessage()
