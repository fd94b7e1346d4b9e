"""Slow tier: a real llama-server (the [bench] extra's binary) on 127.0.0.1 with the 0.5B GGUF as target and as
draft; `specdec serve --engine llama-server` over LSP returns the engine's own greedy completion for the prompt
(cut and placed by the server's rules) and its request record carries nonzero drafted/accepted counts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdec.completion import syntax

pytestmark = pytest.mark.slow

GGUF = Path.home() / ".cache" / "specdec" / "models" / "gguf" / "qwen2.5-coder-0.5b-q4_k_m.gguf"
TEXT = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    \n\n\n"
        "print(mul(2, 3))\n")
LINE, COL = 9, 4  # inside mul's body


@pytest.fixture(scope="module")
def llama():
    from specdec.backends.llama_server import LlamaServer, find_server

    binary = find_server()
    if binary is None or not GGUF.is_file():
        pytest.skip("needs llama-server (the [bench] extra) and the 0.5B GGUF (specdec models pull)")
    # with this llama.cpp, -md drafts only with --spec-type draft-simple (docs/teams.md)
    with LlamaServer(binary, GGUF, extra=["--spec-type", "draft-simple", "-md", str(GGUF), "--spec-draft-n-max",
                                          "8", "--spec-draft-n-min", "0", "-td", "1"], threads=1) as server:
        yield server


def test_serve_returns_the_engines_greedy_completion_with_its_counts(llama, tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "lsp_server"))
    from test_remote_engine_lsp import DOC, Server  # noqa: E402 - the LSP driver of the fast tier (its inline asks DOC)

    from specdec.backends.remote.engines import EngineRequest, LlamaServer

    offset = sum(len(line) + 1 for line in TEXT.split("\n")[:LINE]) + COL
    prefix, suffix = TEXT[:offset], TEXT[offset:]
    # the engine's own greedy output for the same request, whole and unstopped
    body = LlamaServer().body(EngineRequest(prefix, suffix, "", max_tokens=64, max_ms=5000))
    body.update(stream=False)
    own = llama.post("/infill", body)["content"]
    ctx = syntax.analyze("python", prefix, suffix)
    cut = syntax.stop_predicate(ctx)(own)
    expected = syntax.finalize(ctx, own[:cut] if cut is not None else own, "stop" if cut is not None else "eos")
    assert expected.strip(), own

    s = Server(tmp_path)
    try:
        s.initialize({"engine": "llama-server", "engineUrl": f"http://127.0.0.1:{llama.port}", "debounceMs": 0,
                      "target": str(GGUF)}, timeout=120)
        s.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": DOC, "languageId": "python", "version": 1, "text": TEXT}}})
        got = s.inline(1, LINE, COL, timeout=300)
        assert got == [expected], (s.stats()["engine"], s.messages, s.stderr()[-2000:])
        stats = s.stats()
    finally:
        s.close()
    row = next(r for r in stats["engines"] if r["engine"] == "llama-server" and r["language"] == "python")
    assert row["acceptance_rate"] is not None and row["speculation_not_reported"] == 0
    record = [json.loads(line) for line in (tmp_path / "state" / "metrics.jsonl").read_text().splitlines()][-1]
    assert record["engine"] == "llama-server" and record["speculation"] == "reported"
    assert record["drafted"] > 0 and record["accepted"] > 0, record
