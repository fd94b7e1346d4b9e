"""The editor replay against llama-server /infill: each keystroke cancels the request in flight (its connection
closed), the client cache answers type-ahead, and the requests have llama.vim's layout (stand-in server)."""

import asyncio
import json
import time
from pathlib import Path

import pytest
import tiny
from fake_llama_server import answers_for, start

from specdec_bench import editor_llama
from specdec_bench.llama_anchor import InfillRules
from lsp_server.settings import Settings


@pytest.fixture
def fake(tmp_path):
    tok = tiny.tokenizer()
    config = {**answers_for(tok, {"": ""}), "default": tok.encode("bc = 1\nmore()\n", add_special_tokens=False),
              "log": str(tmp_path / "requests.jsonl")}
    config["pieces"].update({str(t): tok.decode([t]) for t in config["default"]})
    server = start(config)
    yield config, server.server_address[1], Path(config["log"])
    server.shutdown()


def logged(path: Path) -> list[dict]:
    time.sleep(0.2)  # the stand-in logs a closed connection when it next looks
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def replay(port, typed, delays, before="import os\n", after="\n", **settings):
    rules = InfillRules.load(Settings().update(settings), tiny.tokenizer())
    run = editor_llama.LlamaReplay(port, rules, "python")
    asyncio.run(run.run(before, typed, after, delays))
    return run.records


def test_each_keystroke_cancels_the_request_in_flight(fake):
    config, port, log = fake
    config["delay_s"] = 0.5  # the model is slower than the typing
    records = replay(port, "abc", [0.01, 0.05, 0.05], maxNewTokens=12)
    assert [r.status for r in records] == ["cancelled", "cancelled", "served"]
    requests = logged(log)
    assert [r["ended"] for r in requests] == ["closed", "closed", "done"]  # llama-server saw the closes
    body = requests[-1]["body"]
    assert (body["input_prefix"], body["prompt"], body["input_suffix"]) == ("import os\n", "abc", "\n")
    assert body["input_extra"] == [] and body["n_predict"] == 12 and body["n_indent"] == 0
    assert body["samplers"] == ["top_k"] and body["top_k"] == 1 and body["cache_prompt"] is True
    assert (body["t_max_prompt_ms"], body["t_max_predict_ms"]) == (500, 250) and body["stream"] is True
    assert records[-1].ms >= 500 and records[-1].text == "bc = 1"  # through our single-line stop and trim


def test_typing_what_was_suggested_is_answered_from_the_client_cache(fake):
    config, port, log = fake
    config["delay_s"] = 0.2
    records = replay(port, "abc", [0.01, 0.6, 0.05])
    assert [(r.source, r.status) for r in records] == [("model", "served"), ("typeahead", "served"),
                                                       ("typeahead", "served")]
    assert len(logged(log)) == 1  # the typed characters continue the suggestion: no new request
    summary = editor_llama.summarize_llama(records)
    assert summary["keystrokes"] == 3 and summary["answered"] == 3 and summary["typeahead_hits"] == 2
    assert summary["model_answers"] == 1 and summary["model_p50_ms"] >= 200 and summary["hit_p50_ms"] < 50


def test_the_client_cache_looks_back_as_llama_vim_does():
    cache = editor_llama.ClientCache(size=2)
    cache.put("x = ", "\n", "foo(1)")
    assert cache.get("x = ", "\n") == ("cache", "foo(1)")
    assert cache.get("x = fo", "\n") == ("typeahead", "o(1)")
    assert cache.get("x = fa", "\n") is None and cache.get("x = fo", "\n\n") is None  # other text, other suffix
    assert cache.get("x = foo(1)", "\n") is None  # nothing left to suggest
    cache.put("a", "", "b")
    cache.put("c", "", "d")
    assert cache.get("x = ", "\n") is None  # the oldest went


def test_the_comparison_row_of_our_server_reads_its_metrics():
    from types import SimpleNamespace

    client = [SimpleNamespace(status=s, sent=0.0, done=d) for s, d in
              (("served", 0.2), ("cancelled", 0.1), ("served", 0.01), ("empty", 0.3))]
    server = [{"kind": "request", "source": "model", "latency_ms": 200.0, "shown": True, "prefill_reused": 90,
               "prefill_computed": 10},
              {"kind": "request", "source": "typeahead", "latency_ms": 1.0, "shown": True, "prefill_reused": 0,
               "prefill_computed": 0},
              {"kind": "request", "source": "model", "latency_ms": 300.0, "shown": False, "prefill_reused": 0,
               "prefill_computed": 10}]
    row = editor_llama.summarize_ours(client, server)
    assert (row["keystrokes"], row["answered"], row["cancelled"], row["typeahead_hits"], row["model_answers"]) == \
        (4, 2, 1, 1, 2)
    assert row["hit_p50_ms"] == 1.0 and row["prefill_reuse_rate"] == pytest.approx(90 / 110)
    # the same percentile as the llama row's: the nearest rank, never an average of two answers
    assert row["suggestion_p50_ms"] in (pytest.approx(200.0), pytest.approx(10.0))
    assert row["model_p50_ms"] in (200.0, 300.0)


def test_both_rows_come_from_the_same_arithmetic():
    """The same latencies give the same figures whichever server they came from."""
    from types import SimpleNamespace

    ms = [10.0, 20.0, 40.0, 80.0]
    llama = [editor_llama.LlamaRecord("python", 0.0) for _ in ms]
    for record, m in zip(llama, ms):
        record.source, record.status, record.sent, record.done = "model", "served", 0.0, m / 1000
        record.prompt_n, record.cache_n = 10, 90
    ours_client = [SimpleNamespace(status="served", sent=0.0, done=m / 1000) for m in ms]
    ours_server = [{"kind": "request", "source": "model", "latency_ms": m, "shown": True, "prefill_reused": 90,
                    "prefill_computed": 10} for m in ms]
    a, b = editor_llama.summarize_llama(llama), editor_llama.summarize_ours(ours_client, ours_server)
    for key in ("answered", "model_answers", "model_p50_ms", "model_p95_ms", "suggestion_p50_ms",
                "suggestion_p95_ms", "prefill_reuse_rate"):
        assert a[key] == pytest.approx(b[key]), key


def test_pauses_count_the_keystrokes_typing_stopped_after_and_whether_a_suggestion_came_in_time():
    """Issue #50 item 4: a pause is >= 300 ms without typing after a keystroke; it counts as answered when that
    keystroke's suggestion was on screen within 300 ms."""
    from types import SimpleNamespace

    typed = [  # (sent, done, status)
        (0.00, 0.10, "served"),  # the next keystroke 0.1 s later: no pause
        (0.10, 0.30, "served"),  # a 1 s pause, answered in 200 ms
        (1.10, 1.80, "served"),  # a 2 s pause, answered in 700 ms: too late
        (3.10, 3.20, "empty"),  # a pause with nothing to show
        (3.50, 3.60, "served"),  # the last keystroke: a pause, answered in 100 ms
    ]
    records = [SimpleNamespace(sent=s, done=d, status=st) for s, d, st in typed]
    assert editor_llama.pauses(records) == (4, 2)
    server = [{"kind": "request", "source": "model", "latency_ms": 200.0, "shown": True, "prefill_reused": 0,
               "prefill_computed": 10, "queue_ms": 120.0, "prefill_seconds": 0.05, "decode_seconds": 0.03}]
    row = editor_llama.summarize_ours(records, server)
    assert (row["pauses"], row["pause_hits"], row["pause_share"]) == (4, 2, 0.5)
    assert (row["queue_p50_ms"], row["prefill_p50_ms"], row["decode_p50_ms"]) == \
        (120.0, pytest.approx(50.0), pytest.approx(30.0))
