"""`specdec bench --editor` end to end on tiny models and a short typed snippet."""

import json
from types import SimpleNamespace

import tiny
from fake_llama_server import executable

from specdec_bench import editor as editor_bench
from specdec.models import store
from specdec_bench.workload import SourceFile


def test_editor_bench_replays_typing_and_reports(tmp_path, monkeypatch, capsys):
    target = tiny.save(tmp_path, seed=1, name="target")
    draft = tiny.save(tmp_path, seed=2, name="draft", layers=1, hidden=32)
    source = SourceFile("python", "pypi", "demo==1", "demo/app.py", "MIT", "demo/demo")
    text = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n" * 3
    monkeypatch.setattr(editor_bench, "SOURCES", (source,))
    monkeypatch.setattr(editor_bench, "fetch", lambda s: text)
    monkeypatch.setattr(editor_bench, "keystroke_delays", lambda typed, seed: [0.05] * len(typed))
    # llama-server: a stand-in (tests/fake_llama_server.py) on the target's "GGUF", answering every keystroke
    model = tmp_path / "model.gguf"
    ids = tiny.tokenizer().encode("value + 1\n", add_special_tokens=False)
    model.write_text(json.dumps({"default": ids, "pieces": {str(t): tiny.tokenizer().decode([t]) for t in ids},
                                 "log": str(tmp_path / "llama.jsonl")}))
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(executable(tmp_path)))
    monkeypatch.setattr(store, "target_gguf", lambda spec: model if spec == str(target) else None)
    out = tmp_path / "editor.json"
    args = SimpleNamespace(languages="", sessions=1, target=str(target), draft=str(draft), dtype="fp32",
                           draft_quant="int8", max_new_tokens=8, max_draft=4, output=str(out), target_quant="none",
                           editor_servers="specdec,llama")
    assert editor_bench.run(args) == 0
    report = json.loads(out.read_text())
    summary = report["summary"]["python"]
    typed = report["sessions"][0]["typed"]
    assert summary["sent"] == len(typed)
    assert summary["served"] + summary["empty"] + summary["cancelled"] == summary["sent"]
    assert report["requests"], "the server recorded per-request metrics"
    printed = capsys.readouterr().out
    assert "hit p50" in printed and "llama-server /infill" in printed and "sugg p95" in printed
    ours, theirs = report["comparison"]["specdec serve"], report["comparison"]["llama-server /infill"]
    assert ours["keystrokes"] == theirs["keystrokes"] == len(typed)  # the same keystrokes against both
    assert theirs["answered"] > 0 and theirs["model_answers"] > 0 and theirs["errors"] == 0
    asked = [json.loads(line)["body"] for line in (tmp_path / "llama.jsonl").read_text().splitlines()]
    assert len(asked) == len(report["llama"]["requests"]) - theirs["typeahead_hits"] - \
        sum(r["source"] == "cache" for r in report["llama"]["requests"])
    assert all(body["n_predict"] == 8 for body in asked)  # the same token budget as ours


def test_editor_bench_without_llama_cpp_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(tmp_path / "none"))
    monkeypatch.setattr(editor_bench, "SOURCES", ())
    args = SimpleNamespace(languages="", sessions=0, target="t", draft="d", dtype="fp32", draft_quant="int8",
                           max_new_tokens=8, max_draft=4, output=str(tmp_path / "e.json"), editor_servers="llama")
    assert editor_bench.run(args) == 0
    assert "llama.cpp is not installed: skipping the llama-server replay" in capsys.readouterr().out


def test_editor_bench_in_a_repository_replays_without_and_with_its_index(tmp_path, monkeypatch, capsys):
    from repos import make_repo
    from specdec.repository.files import select, split_heldout

    target = tiny.save(tmp_path, seed=1, name="target")
    draft = tiny.save(tmp_path, seed=2, name="draft", layers=1, hidden=32)
    repo = make_repo(tmp_path / "repo", files=10, git=False)
    train, heldout = split_heldout(select(repo).files)
    monkeypatch.setattr(editor_bench, "keystroke_delays", lambda typed, seed: [0.05] * len(typed))
    out = tmp_path / "editor.json"
    args = SimpleNamespace(languages="", sessions=1, target=str(target), draft=str(draft), dtype="fp32",
                           draft_quant="int8", max_new_tokens=8, max_draft=4, output=str(out), repo=[str(repo)])
    assert editor_bench.run(args) == 0
    report = json.loads(out.read_text())
    assert list(report["runs"]) == ["no index", "index"]
    typed = report["sessions"][0]["typed"]
    assert report["sessions"][0]["file"].endswith(heldout[0].as_posix())
    for label, summary in report["runs"].items():
        assert summary["(all)"]["sent"] == len(typed), label
        assert summary["(all)"]["served"] + summary["(all)"]["empty"] + summary["(all)"]["cancelled"] == len(typed)
    assert report["repo_index"]["no index"] == {"state": "off"}
    index = report["repo_index"]["index"]
    assert index["state"] == "ready" and index["files"] == len(train)  # the other files; the typed one is new
    assert report["repo"]["heldout_files"] == [rel.as_posix() for rel in heldout]
    printed = capsys.readouterr().out
    assert "no index:" in printed and "\nindex:" in printed


def test_the_replayed_server_gets_the_command_lines_forward_and_quantization():
    from types import SimpleNamespace

    args = SimpleNamespace(target="t", draft="d", dtype="auto", draft_quant="int8", max_new_tokens=48, max_draft=4,
                           target_quant="int4", forward="transformers")
    options = editor_bench.server_options(args)
    assert (options["forward"], options["targetQuant"]) == ("transformers", "int4")
