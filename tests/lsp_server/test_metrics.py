"""Persisted metrics: aggregation per language/workspace/adapter, `specdec stats`, the chart, Prometheus."""

import json
import socket
import time
import urllib.request

from lsp_server.metrics import MetricsStore, RequestRecord, load_records
from specdec.cli import main


def record(language, source="model", latency=500.0, drafted=10, accepted=6, workspace="/w", adapter=""):
    return RequestRecord(time.time(), language, workspace, source, latency, new_tokens=8, produced=8, drafted=drafted,
                         accepted=accepted, target_passes=4, decode_seconds=1.0, prefill_reused=90,
                         prefill_computed=10, shown=True, adapter=adapter)


def fill(store):
    for i in range(10):
        store.add(record("python", latency=400 + i * 10))
    store.add(record("python", source="cache", latency=2.0, drafted=0, accepted=0))
    store.add(record("go", drafted=10, accepted=2, adapter="ws@v1"))
    store.accepted("python", "/w")


def test_aggregates(tmp_path):
    store = MetricsStore(tmp_path / "metrics.jsonl")
    fill(store)
    s = store.summary()
    py = s["languages"]["python"]
    assert py["requests"] == 11 and py["model_requests"] == 10 and py["cache_hits"] == 1
    assert py["acceptance_rate"] == 0.6 and py["tokens_per_pass"] == 2.0 and py["tokens_per_second"] == 8.0
    assert py["hit_latency_p50_ms"] == 2.0 and 440 <= py["model_latency_p50_ms"] <= 460
    assert py["prefill_reuse_rate"] == 0.9 and py["accepted"] == 1 and py["shown"] == 11
    assert s["languages"]["go"]["acceptance_rate"] == 0.2
    assert {(a["workspace"], a["adapter"]) for a in s["adapters"]} == {("/w", "base"), ("/w", "ws@v1")}
    assert s["workspaces"][0]["workspace"] == "/w" and s["workspaces"][0]["requests"] == 12
    assert len(load_records(tmp_path / "metrics.jsonl")) == 13


def test_torn_last_line_loses_one_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    store = MetricsStore(path)
    store.add(record("python"))
    with open(path, "a") as fh:
        fh.write('{"kind": "requ')
    assert len(load_records(path)) == 1


def test_stats_command_table_json_and_plot(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path))
    assert main(["stats"]) == 0
    assert "no metrics yet" in capsys.readouterr().out
    fill(MetricsStore(tmp_path / "metrics.jsonl"))
    assert main(["stats"]) == 0
    out = capsys.readouterr().out
    assert "python" in out and "go" in out and "0.60" in out
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["languages"]["go"]["acceptance_rate"] == 0.2
    png = tmp_path / "acceptance.png"
    assert main(["stats", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_prometheus_endpoint_on_loopback(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = MetricsStore(tmp_path / "metrics.jsonl")
    store.serve_prometheus(port)
    fill(store)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'specdec_requests_total{language="python",source="model"} 10.0' in body
    assert 'specdec_accepted_tokens_total{language="go"} 2.0' in body
    assert 'specdec_suggestions_accepted_total{language="python"} 1.0' in body


def test_timeline_has_acceptance_and_the_users_accept_rate_over_time(tmp_path):
    store = MetricsStore(tmp_path / "metrics.jsonl")
    for i in range(4):  # four suggestions shown, the first two taken
        store.add(RequestRecord(100.0 + i, "python", "/w", "model", 300.0, new_tokens=4, produced=5, drafted=8,
                                accepted=4, target_passes=2, decode_seconds=0.5, shown=True))
        if i < 2:
            store.add({"kind": "accepted", "time": 100.5 + i, "language": "python", "workspace": "/w", "adapter": ""})
    from lsp_server.metrics import timeline

    points = timeline(load_records(tmp_path / "metrics.jsonl"), window=2)["python"]
    assert [p["time"] for p in points] == [100.0, 101.0, 102.0, 103.0]
    assert all(p["acceptance_rate"] == 0.5 and p["tokens_per_pass"] == 2.5 for p in points)
    assert [p["user_accept_rate"] for p in points] == [1.0, 1.0, 0.5, 0.0]


def test_a_new_store_continues_the_history_on_disk(tmp_path):
    first = MetricsStore(tmp_path / "metrics.jsonl")
    fill(first)
    again = MetricsStore(tmp_path / "metrics.jsonl")  # e.g. the server restarted
    assert again.summary()["languages"]["python"]["requests"] == 11 and again.summary()["total"]["accepted"] == 1
    again.add(record("rust"))
    assert len(load_records(tmp_path / "metrics.jsonl")) == 14 and "rust" in again.summary()["languages"]


def test_memory_keeps_the_newest_records_and_summary_is_recomputed_only_after_new_ones(tmp_path, monkeypatch):
    from lsp_server import metrics

    monkeypatch.setattr(metrics, "HISTORY", 5)
    store = MetricsStore(tmp_path / "metrics.jsonl")
    for i in range(8):
        store.add(record("python", latency=100.0 + i))
    assert len(store.records) == 5 and store.records[0]["latency_ms"] == 103.0
    assert len(load_records(tmp_path / "metrics.jsonl")) == 8  # the file keeps everything
    first = store.summary()
    assert store.summary() is first and first["languages"]["python"]["requests"] == 5
    store.accepted("python", "/w")
    assert store.summary() is not first and store.summary()["languages"]["python"]["accepted"] == 1


def test_malformed_lines_are_skipped_with_a_count_by_the_store_and_the_command(tmp_path, monkeypatch, capsys):
    """Issue #30.15: a line that is not an object, or lacks `language`, broke specdec/stats and `specdec stats`."""
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path))
    path = tmp_path / "metrics.jsonl"
    fill(MetricsStore(path))
    no_language = {k: v for k, v in vars(record("python")).items() if k != "language"}
    with open(path, "a") as fh:
        for bad in ([], 42, None, "text", no_language, {"kind": "accepted", "time": 1.0}, {"kind": "request",
                    "language": "go", "time": 1.0, "source": "model", "shown": True}):
            fh.write(json.dumps(bad) + "\n")
    summary = MetricsStore(path).summary()  # what the server's specdec/stats returns
    assert summary["skipped_records"] == 7 and summary["languages"]["python"]["requests"] == 11
    assert main(["stats"]) == 0
    captured = capsys.readouterr()
    assert "python" in captured.out and "skipped 7 malformed lines" in captured.err
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped_records"] == 7
