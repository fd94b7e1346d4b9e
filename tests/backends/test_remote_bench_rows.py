"""`specdec bench --engine KIND --engine-url URL[,URL]`: each engine a row per hole, warmed by the previous
keystroke, with the engine's speculation counts; a bad flag pair or an engine that does not answer is one line."""

from types import SimpleNamespace

import pytest

from specdec_bench.engine_rows import label, run_engine, start_engines
from specdec.errors import SpecdecError
from tests.fake_engines import FakeEngine


class Tokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def bench_args(engine, url, cold=False):
    return SimpleNamespace(engine=engine, engine_url=url, target="Qwen/Qwen2.5-Coder-7B", max_prefix_tokens=512,
                           max_suffix_tokens=128, max_new_tokens=48, cold=cold)


def test_engine_rows_per_url(monkeypatch):
    monkeypatch.delenv("SPECDEC_ENGINE_API_KEY", raising=False)
    hole = SimpleNamespace(prefix="def add(a, b):\n    ", suffix="\n", language="python", name="h")
    with FakeEngine("llama-server", ["return", " a", " +", " b"]) as plain, \
            FakeEngine("llama-server", ["return", " a", " +", " b"], speculation=False) as other:
        args = bench_args("llama-server", f"{plain.url},{other.url}")
        engines = start_engines(args)
        assert list(engines) == ["engine-1", "engine-2"]
        assert label(engines["engine-1"]) == f"llama-server@127.0.0.1:{plain.port}"
        row = {}
        tokens = run_engine(engines["engine-1"], hole, args, row, Tokenizer())
        posts = plain.posts
        unreported = {}
        run_engine(engines["engine-2"], hole, args, unreported, Tokenizer())
    assert tokens == [ord(c) for c in "return a + b"]
    assert [p["body"]["n_predict"] for p in posts] == [1, 48]  # the previous keystroke warms the cache first
    assert "t_max_predict_ms" not in posts[1]["body"]  # no time cap: every row runs to its token budget
    assert posts[0]["body"]["prompt"] == "   " and posts[1]["body"]["prompt"] == "    "
    assert (row["new_tokens"], row["drafted"], row["accepted"], row["target_passes"]) == (4, 8, 2, 2)
    assert row["mode"] == "warm" and row["seconds"] > 0
    assert unreported["speculation"] == "not reported" and "drafted" not in unreported


def test_engine_flags_and_failures():
    assert start_engines(bench_args(None, None)) == {}
    with pytest.raises(SpecdecError, match="needs --engine-url"):
        start_engines(bench_args("vllm", ""))
    with pytest.raises(SpecdecError, match="cannot connect"):
        start_engines(bench_args("vllm", "http://127.0.0.1:9"))
