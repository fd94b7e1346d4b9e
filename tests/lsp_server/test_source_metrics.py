"""Per drafter source stats (issue #34 item 4): aggregation, old and malformed records, `specdec stats`, the chart,
Prometheus."""

import json
import socket
import struct
import urllib.request
from dataclasses import asdict

import pytest

from lsp_server import source_metrics
from lsp_server.metrics import MetricsStore, RequestRecord
from lsp_server.stats_cli import figure
from specdec.cli import main
from specdec.engine.session import GenerationStats


def model(time, language, workspace, passes, by_source=None, drafted=0, accepted=0):
    row = asdict(RequestRecord(time, language, workspace, "model", 100.0, new_tokens=8, produced=8, drafted=drafted,
                               accepted=accepted, target_passes=passes, decode_seconds=1.0, shown=True))
    if by_source is None:
        del row["by_source"]  # a line written before the field existed
    else:
        row["by_source"] = by_source
    return row


def counters(drafted, accepted, passes):
    return {"drafted": drafted, "accepted": accepted, "passes": passes}


def synthetic() -> list[dict]:
    return [
        model(1.0, "python", "/a", 6, {"lookup": counters(10, 6, 2), "draft": counters(8, 4, 2)}, 18, 10),
        model(2.0, "python", "/b", 3, {"lookup": counters(5, 5, 1)}, 5, 5),
        model(3.0, "go", "/a", 5, {"draft": counters(12, 3, 4)}, 12, 3),
        model(4.0, "python", "/a", 4, None, 10, 10),  # old: counts per language, not per source
        {**model(5.0, "python", "/a", 0, {}), "source": "cache"},  # a hit: no passes at all
    ]


def by(rows, **keys):
    (row,) = [r for r in rows if all(r[k] == v for k, v in keys.items())]
    return row


def test_per_source_totals_per_language_and_per_repository_exact(tmp_path):
    store = MetricsStore(tmp_path / "metrics.jsonl")
    for row in synthetic():
        store.add(row)
    s = store.summary()["sources"]
    assert [r["source"] for r in s["total"]] == ["draft", "lookup"]
    lookup, draft = by(s["total"], source="lookup"), by(s["total"], source="draft")
    # 14 target passes in the three requests that recorded sources; the old record's 4 are not in the denominator
    assert (lookup["drafted"], lookup["accepted"], lookup["passes"]) == (15, 11, 3)
    assert lookup["acceptance_rate"] == pytest.approx(11 / 15) and lookup["tokens_per_pass"] == pytest.approx(14 / 3)
    assert lookup["share_of_passes"] == pytest.approx(3 / 14)
    assert (draft["drafted"], draft["accepted"], draft["passes"]) == (20, 7, 6)
    assert draft["acceptance_rate"] == 0.35 and draft["tokens_per_pass"] == pytest.approx(13 / 6)
    assert draft["share_of_passes"] == pytest.approx(6 / 14)

    python = by(s["languages"], source="lookup", language="python")
    assert (python["drafted"], python["accepted"], python["passes"]) == (15, 11, 3)
    assert python["share_of_passes"] == pytest.approx(3 / 9)
    assert by(s["languages"], source="draft", language="python")["tokens_per_pass"] == 3.0
    go = by(s["languages"], source="draft", language="go")
    assert (go["acceptance_rate"], go["tokens_per_pass"], go["share_of_passes"]) == (0.25, 1.75, 0.8)
    assert not [r for r in s["languages"] if r["source"] == "lookup" and r["language"] == "go"]

    a = by(s["workspaces"], source="lookup", workspace="/a")
    assert (a["acceptance_rate"], a["tokens_per_pass"], a["share_of_passes"]) == (0.6, 4.0, pytest.approx(2 / 11))
    assert by(s["workspaces"], source="draft", workspace="/a")["passes"] == 6
    b = by(s["workspaces"], source="lookup", workspace="/b")
    assert (b["tokens_per_pass"], b["share_of_passes"]) == (6.0, pytest.approx(1 / 3))
    assert len(s["workspaces"]) == 3
    # the per-language totals still count the old record
    assert store.summary()["languages"]["python"]["model_requests"] == 3


def test_source_names_are_open_ended_and_every_structure_is_a_list():
    rows = [model(1.0, "python", "/w", 3, {"repo": counters(6, 6, 1), "draft-tree": counters(4, 1, 1)})]
    s, skipped = source_metrics.summarize(rows)
    assert skipped == 0 and [r["source"] for r in s["total"]] == ["draft-tree", "repo"]
    assert by(s["total"], source="repo")["tokens_per_pass"] == 7.0
    assert all(isinstance(s[k], list) for k in ("total", "languages", "workspaces", "timeline"))
    assert [t["source"] for t in s["timeline"]] == ["draft-tree", "repo"]


def test_old_records_without_sources_stay_usable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path))
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps(model(1.0, "python", "/w", 4, None, 10, 6)) + "\n" for _ in range(3))
    summary = MetricsStore(tmp_path / "metrics.jsonl").summary()
    assert summary["skipped_records"] == 0 and summary["skipped_source_entries"] == 0
    assert summary["languages"]["python"]["model_requests"] == 3 and summary["languages"]["python"]["acceptance_rate"] == 0.6
    assert summary["sources"] == {"total": [], "languages": [], "workspaces": [], "timeline": []}
    assert main(["stats"]) == 0
    out = capsys.readouterr().out
    assert "python" in out and "source" not in out  # no empty per-source table


BAD_ENTRIES = [
    counters(3, 5, 1),  # accepted more than drafted
    counters(3, 1, 0),  # drafted without a pass
    counters(2, 1, 3),  # more passes than drafted tokens
    counters(3, -1, 1),
    {"drafted": True, "accepted": 0, "passes": 1},
    {"drafted": 3, "accepted": 1},
    {"drafted": "3", "accepted": 1, "passes": 1},
    [3, 1, 1],
    float("nan"),
]


def test_malformed_per_source_entries_are_skipped_and_counted(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path))
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as fh:
        by_source = {f"bad{i}": entry for i, entry in enumerate(BAD_ENTRIES)}
        fh.write(json.dumps(model(1.0, "python", "/w", 5, {**by_source, "lookup": counters(4, 2, 2)}, 4, 2)) + "\n")
        fh.write(json.dumps(model(2.0, "python", "/w", 5, {"": counters(1, 1, 1)}, 1, 1)) + "\n")
        fh.write(json.dumps(model(3.0, "python", "/w", 5, "lookup", 1, 1)) + "\n")  # not an object: one entry
        fh.write(json.dumps(model(4.0, "python", "/w", 3, {"lookup": {"drafted": float("inf"), "accepted": 1,
                                                                      "passes": 1}})) + "\n")
        fh.write('{"language": "go", "kind": "request", "by_source": {"lookup": []}}\n')  # a bad line: counted once
    summary = MetricsStore(path).summary()
    assert summary["skipped_source_entries"] == len(BAD_ENTRIES) + 3 and summary["skipped_records"] == 1
    assert summary["languages"]["python"]["model_requests"] == 4  # the records' own totals still count
    (lookup,) = summary["sources"]["total"]
    # the good entry counts; the denominator is the passes of every request whose by_source is an object
    assert (lookup["source"], lookup["drafted"], lookup["passes"], lookup["share_of_passes"]) == ("lookup", 4, 2, 2 / 13)
    assert main(["stats"]) == 0
    err = capsys.readouterr().err
    assert f"skipped {len(BAD_ENTRIES) + 3} malformed per-source entries" in err and "skipped 1 malformed line" in err
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped_source_entries"] == len(BAD_ENTRIES) + 3


def test_source_timeline_is_a_running_window_over_the_requests_each_source_drafted_in():
    rows = [model(float(t), "python", "/w", 4, {"lookup": counters(4, a, 2)}) for t, a in ((1, 4), (2, 0), (3, 2))]
    rows.insert(1, model(1.5, "python", "/w", 3, {"draft": counters(3, 3, 1)}))
    rows.insert(2, model(1.7, "python", "/w", 3, {}))  # no drafter proposed: in no series
    series = {t["source"]: t["points"] for t in source_metrics.timeline(rows, window=2)}
    assert [p["time"] for p in series["lookup"]] == [1.0, 2.0, 3.0]
    assert [p["acceptance_rate"] for p in series["lookup"]] == [1.0, 0.5, 0.25]
    assert [p["tokens_per_pass"] for p in series["lookup"]] == [3.0, 2.0, 1.5]
    assert series["draft"] == [{"time": 1.5, "acceptance_rate": 1.0, "tokens_per_pass": 4.0}]


def test_from_stats_keeps_every_source_the_engine_counted():
    stats = GenerationStats(drafted_by={"lookup": 7, "draft": 5}, accepted_by={"lookup": 3, "draft": 0},
                            passes_by={"lookup": 2, "draft": 1})
    assert source_metrics.from_stats(stats.as_dict()) == {"draft": counters(5, 0, 1), "lookup": counters(7, 3, 2)}
    assert source_metrics.from_stats(GenerationStats().as_dict()) == {}
    assert source_metrics.from_stats({}) == {}  # a backend that does not count per source


def lines_of(out: str, *cells: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.split()[: len(cells)] == list(cells)]


def test_stats_command_prints_the_per_source_tables(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path))
    store = MetricsStore(tmp_path / "metrics.jsonl")
    for row in synthetic():
        store.add(row)
    assert main(["stats"]) == 0
    out = capsys.readouterr().out
    assert "source       language" in out and "source       repository" in out
    assert lines_of(out, "lookup", "python") == [["lookup", "python", "15", "0.73", "3", "4.67", "33%"]]
    assert lines_of(out, "draft", "go") == [["draft", "go", "12", "0.25", "4", "1.75", "80%"]]
    assert lines_of(out, "lookup", "/b") == [["lookup", "/b", "5", "1.00", "1", "6.00", "33%"]]
    assert lines_of(out, "draft", "(all)") == [["draft", "(all)", "20", "0.35", "6", "2.17", "43%"]] * 2  # both tables
    assert len([line for line in out.splitlines() if line.startswith("lookup")]) == 2 + 3  # per language, per repo
    assert main(["stats", "--json"]) == 0
    assert by(json.loads(capsys.readouterr().out)["sources"]["languages"], source="draft", language="go")["passes"] == 4


def test_plot_has_a_panel_of_acceptance_over_time_per_source(tmp_path, monkeypatch, capsys):
    fig = figure(synthetic())
    by_language, by_source = fig.axes
    assert "per language" in by_language.get_title() and "per drafter source" in by_source.get_title()
    assert sorted(line.get_label() for line in by_source.get_lines()) == ["draft", "lookup"]
    lookup = next(line for line in by_source.get_lines() if line.get_label() == "lookup")
    assert list(lookup.get_ydata()) == pytest.approx([6 / 10, 11 / 15])
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path))
    store = MetricsStore(tmp_path / "metrics.jsonl")
    for row in synthetic():
        store.add(row)
    png = tmp_path / "acceptance.png"
    assert main(["stats", "--plot", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (990, 880)  # two panels


def test_prometheus_counts_per_source_on_new_counters(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = MetricsStore(tmp_path / "metrics.jsonl")
    store.serve_prometheus(port)
    for row in synthetic():
        store.add(row)
    store.add(model(6.0, "python", "/a", 2, {"lookup": counters(3, 1, 1), "bad": counters(1, 2, 1)}, 3, 1))
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'specdec_drafted_tokens_by_source_total{language="python",source="lookup"} 18.0' in body
    assert 'specdec_accepted_tokens_by_source_total{language="go",source="draft"} 3.0' in body
    assert 'specdec_target_passes_by_source_total{language="python",source="draft"} 2.0' in body
    assert 'source="bad"' not in body
    assert 'specdec_drafted_tokens_total{language="python"} 36.0' in body  # the existing counter keeps its shape
