"""Repository context for remote engines (issue #43 item 4): the repository index's best chunks for the cursor,
fitted to maxSnippetTokens counted in the target's tokens (its tokenizer built here from `target`), sent as
llama-server's `input_extra` and in Qwen's repository-level prompt for vLLM and SGLang; the exact request bodies."""

from __future__ import annotations

import logging

import pytest

from lsp_server.settings import Settings
from specdec.backends import make_backend
from specdec.backends.remote.prompt import chunk_tokens, chunks_within
from specdec.backends.remote.tokens import CHARS_PER_TOKEN, TokenCounter, target_tokenizer
from specdec.engine.drafters.repo_index import RepoIndex, vocabulary_of
from specdec.repository.context import best_chunks
from tests.backends.test_remote_engines import PIECES, Request
from tests.fake_engines import FakeEngine

GEOMETRY = ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n\n"
            "def scale(point, factor):\n    return Point(point.x * factor, point.y * factor)\n")
OTHER = "import os\n\n\ndef origin():\n    return Point(0, 0)\n"  # a shorter match: `):\n    return Point(`
BEFORE = "from geometry import Point\n\n\ndef scale(point, factor):\n    return Point("


def indexed(tokenizer, documents: dict[str, str]) -> RepoIndex:
    index = RepoIndex()
    index.restamp(vocabulary_of(tokenizer))
    index.add_many([(key, tokenizer.encode(text, add_special_tokens=False)) for key, text in documents.items()],
                   vocabulary=vocabulary_of(tokenizer))
    return index


def test_best_chunks_are_where_the_text_before_the_cursor_occurs(target):
    tokenizer, why = target_tokenizer(str(target))
    assert tokenizer is not None, why
    index = indexed(tokenizer, {"/w/proj/pkg/geometry.py": GEOMETRY, "/w/proj/other.py": OTHER,
                                "/w/proj/main.py": BEFORE + "point.x)\n",  # the document being completed
                                "accepted:1": BEFORE + "point.x * factor)\n",  # a fragment: no file to name
                                "/w/proj/unrelated.py": "for i in range(10):\n    print(i)\n"})
    chunks = best_chunks(index, tokenizer, BEFORE, exclude="/w/proj/main.py", workspace="/w/proj")
    # the longest match first (the whole `def scale(point, factor): return Point(`), then the shorter one; short
    # documents whole; nothing from the document itself, an accepted fragment or a file without the text
    assert chunks == [{"filename": "pkg/geometry.py", "text": GEOMETRY}, {"filename": "other.py", "text": OTHER}]
    assert best_chunks(index, tokenizer, "while True:\n    ", workspace="/w/proj") == []


def test_a_chunk_of_a_long_file_is_whole_lines_around_the_match(target):
    tokenizer, _ = target_tokenizer(str(target))
    lines = [f"value_{i} = {i}\n" for i in range(300)]
    long = "".join(lines[:150]) + GEOMETRY + "".join(lines[150:])
    index = indexed(tokenizer, {"/w/proj/long.py": long})
    [chunk] = best_chunks(index, tokenizer, BEFORE, workspace="/w/other")
    assert chunk["filename"] == "long.py"  # outside the workspace folder: its base name
    text = chunk["text"]
    assert text in long and text.endswith("\n") and long[long.index(text) - 1] == "\n"  # whole lines
    assert "def scale(point, factor):\n    return Point(point.x" in text and len(text) < len(long) // 4
    assert text.index("def scale") < len(text) // 2  # more of what follows the match than of what precedes it


CHUNKS = [{"filename": "src/geometry.py", "text": "def add(a, b):\n    return a + b\n" * 3},  # best
          {"filename": "src/points.py", "text": "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"},
          {"filename": "src/util.py", "text": "for i in range(10):\n    print(i)\n"}]


def budget_for(counter: TokenCounter) -> int:
    """Room for the best and the third chunk, not for the second after the best."""
    first, second, third = (chunk_tokens(c, counter) for c in CHUNKS)
    assert second > third
    return first + third


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_request_bodies_carry_the_chunks_within_the_budget_in_the_targets_tokens(target, monkeypatch, kind):
    tokenizer, _ = target_tokenizer(str(target))
    counter = TokenCounter(tokenizer)
    budget = budget_for(counter)
    sent = [CHUNKS[2], CHUNKS[0]]  # the best that fit, best last (nearest the code being completed)
    assert chunks_within(CHUNKS, budget, counter) == sent
    assert chunks_within(CHUNKS, budget, TokenCounter()) != sent  # at CHARS_PER_TOKEN: the tokenizer decides here
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", "k")
    with FakeEngine(kind, PIECES) as engine:
        backend = make_backend(kind, engine.url)
        backend.load(Settings().update({"engine": kind, "engineUrl": engine.url, "target": str(target),
                                        "maxSnippetTokens": budget}))
        backend.complete(Request(workspace="/home/me/calc", chunks=CHUNKS))
        body = engine.wait_post()["body"]
    assert backend.token_counter().exact
    if kind == "llama-server":
        assert body["input_extra"] == sent
        return
    prompt = body["prompt"] if kind == "vllm" else body["text"]
    assert prompt == ("<|repo_name|>calc\n"
                      f"<|file_sep|>src/util.py\n{CHUNKS[2]['text']}\n"
                      f"<|file_sep|>src/geometry.py\n{CHUNKS[0]['text']}\n"
                      "<|file_sep|>src/calc.py\n"
                      "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>")
    repository = prompt[: prompt.index("<|file_sep|>src/calc.py")]
    assert len(tokenizer.encode(repository, add_special_tokens=False)) <= budget + 8  # + <|repo_name|>calc\n


def test_without_a_tokenizer_the_budget_is_estimated_and_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", "k")
    nowhere = str(tmp_path / "no-such-model")
    budget = sum(chunk_tokens(c, TokenCounter()) for c in (CHUNKS[0], CHUNKS[2]))
    with FakeEngine("llama-server", PIECES) as engine, caplog.at_level(logging.WARNING, "specdec.engine"):
        backend = make_backend("llama-server", engine.url)
        backend.load(Settings().update({"engine": "llama-server", "engineUrl": engine.url, "target": nowhere,
                                        "maxSnippetTokens": budget}))
        for _ in range(2):
            backend.complete(Request(chunks=CHUNKS))
            body = engine.wait_post()["body"]
    assert not backend.token_counter().exact
    assert body["input_extra"] == [CHUNKS[2], CHUNKS[0]]  # the same choice, at CHARS_PER_TOKEN
    said = [r.getMessage() for r in caplog.records if "tokenizer" in r.getMessage()]
    assert len(said) == 1 and nowhere in said[0] and f"{CHARS_PER_TOKEN} characters a token" in said[0]
