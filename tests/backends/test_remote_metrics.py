"""A remote engine's speculation in the request records: per engine and language in specdec/stats and
`specdec stats`, in Prometheus, and "not reported" never counted as zero acceptance."""

import socket
import time
import urllib.request

from lsp_server.metrics import MetricsStore, RequestRecord
from specdec.cli import main


def record(language, engine="local", speculation="reported", drafted=8, accepted=6, passes=2, tokens=8):
    return RequestRecord(time.time(), language, "/w", "model", 120.0, new_tokens=tokens, produced=tokens,
                         drafted=drafted, accepted=accepted, target_passes=passes, decode_seconds=0.1, shown=True,
                         engine=engine, speculation=speculation)


def fill(store):
    store.add(record("python"))  # local: 6/8 accepted, 4 tokens a pass
    store.add(record("python", "vllm", drafted=10, accepted=5, passes=5, tokens=10))
    store.add(record("python", "vllm", "not reported", 0, 0, 0, tokens=12))  # says nothing of acceptance
    store.add(record("go", "llama-server", "prometheus", drafted=4, accepted=1, passes=3, tokens=4))


def test_engines_in_summary(tmp_path):
    store = MetricsStore(tmp_path / "metrics.jsonl")
    fill(store)
    s = store.summary()
    rows = {(r["engine"], r["language"]): r for r in s["engines"]}
    vllm = rows[("vllm", "python")]
    assert vllm["model_requests"] == 2 and vllm["speculation_not_reported"] == 1
    assert vllm["acceptance_rate"] == 0.5 and vllm["tokens_per_pass"] == 2.0  # the unreported one left out
    assert rows[("local", "python")]["acceptance_rate"] == 0.75
    assert rows[("llama-server", "(all)")]["acceptance_rate"] == 0.25
    python = s["languages"]["python"]
    assert python["acceptance_rate"] == 11 / 18 and python["speculation_not_reported"] == 1
    only_unreported = MetricsStore(tmp_path / "other.jsonl")
    only_unreported.add(record("rust", "sglang", "not reported", 0, 0, 0))
    rust = only_unreported.summary()["languages"]["rust"]
    assert rust["acceptance_rate"] is None and rust["tokens_per_pass"] is None  # not reported, not zero


def test_stats_command_prints_engines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path))
    from specdec.paths import state_dir

    fill(MetricsStore(state_dir() / "metrics.jsonl"))
    assert main(["stats"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("vllm") and "python" in l)
    assert line.split()[2:5] == ["2", "0.50", "2.00"]
    assert line.split()[-1] == "1"  # one request whose speculation was not reported


def test_prometheus_per_engine(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = MetricsStore(tmp_path / "metrics.jsonl")
    store.serve_prometheus(port)
    fill(store)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'specdec_engine_accepted_tokens_total{engine="vllm",language="python"} 5.0' in text
    assert 'specdec_engine_drafted_tokens_total{engine="vllm",language="python"} 10.0' in text
    assert 'specdec_engine_target_passes_total{engine="vllm",language="python"} 5.0' in text
    assert 'specdec_engine_speculation_not_reported_total{engine="vllm",language="python"} 1.0' in text
    assert 'specdec_engine_accepted_tokens_total{engine="llama-server",language="go"} 1.0' in text
