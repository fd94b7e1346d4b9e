"""`specdec bench --humaneval`: completions through the server's path, applied as an editor applies them,
scored by running the problems' tests; end to end on tiny models and a two-problem file."""

import json
from types import SimpleNamespace

import pytest
import tiny
from humaneval_files import PROBLEMS, write_problems

from specdec_bench import humaneval_bench
from lsp_server.hosts import ModelHost
from lsp_server.settings import Settings
from specdec_bench import humaneval
from specdec.engine.session import Generation, GenerationStats



class DocumentCompleter:
    """A model that writes the rest of the true document after the cursor (or `wrong` there), token by token
    (one character per step here) through the server's stop predicate, as the engine does."""

    def __init__(self, tasks, wrong: str | None = None):
        self.documents = {t.prefix + "\x00" + t.suffix: t for t in tasks}
        self.wrong = wrong
        self.session = SimpleNamespace(reset=lambda: None, drafter=None)

    def complete(self, prefix, suffix, config, path=None, stop=None, cancel=None, context=""):
        task = self.documents[prefix + "\x00" + suffix]
        script = (self.wrong or task.middle) + suffix + "\n\n\nprint('the file goes on')\n"
        for n in range(1, len(script) + 1):
            cut = stop(script[:n]) if stop else None
            if cut is not None:
                return Generation([], script[:cut], "stop", GenerationStats(new_tokens=n, seconds=0.01))
        return Generation([], script, "eos", GenerationStats(new_tokens=len(script), seconds=0.01))


def host_with(completer) -> ModelHost:
    host = ModelHost()
    host.completer, host.state = completer, "ready"
    return host


def test_the_true_line_passes_through_stop_rules_trimming_and_the_editor_insert():
    tasks = humaneval.single_line_tasks(PROBLEMS)
    rows = humaneval_bench.evaluate(host_with(DocumentCompleter(tasks)), tasks, Settings(), "oracle", 30,
                                    log=lambda line: None)
    assert [r["passed"] for r in rows] == [True] * len(tasks), [(r["task_id"], r["text"], r["detail"]) for r in rows]
    assert all(r["exact"] for r in rows)
    by_id = {r["task_id"]: r for r in rows}
    assert by_id["SingleLineInfilling/Toy/1/L0"]["text"] == "    best = xs[0]\n"  # a line above code: with its break
    assert by_id["SingleLineInfilling/Toy/0/L2"]["text"] == "    return total"  # the end: multi-line, trimmed
    summary = humaneval_bench.summarize(rows, ["oracle"])["oracle"]
    assert summary["pass_at_1"] == summary["exact_match"] == 1.0 and summary["tasks"] == 7


def test_a_wrong_line_fails_its_tests():
    tasks = humaneval.single_line_tasks(PROBLEMS)
    rows = humaneval_bench.evaluate(host_with(DocumentCompleter(tasks, wrong="    return None\n")), tasks,
                                    Settings(), "wrong", 30, log=lambda line: None)
    assert not any(r["passed"] for r in rows) and not any(r["exact"] for r in rows)
    assert all(r["status"] == "failed" and "Error" in r["detail"] for r in rows)


def test_the_mode_is_registered_and_only_runs_when_asked():
    from specdec.cli import build_parser

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]  # specdec_bench.commands registers it
    assert "--humaneval" in {flag for action in bench._actions for flag in action.option_strings}
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", default="hf-plain,plain")
    runner = humaneval_bench.register(parser)
    assert runner(parser.parse_args([])) is None
    args = parser.parse_args(["--humaneval", "--limit", "5", "--humaneval-timeout", "2"])
    assert args.limit == 5 and args.humaneval_timeout == 2.0 and args.humaneval_seed == 0


@pytest.fixture
def cli():
    """`specdec`, whose bench command registers the humaneval mode itself (specdec_bench.commands)."""
    from specdec.cli import main

    return main


def test_humaneval_bench_end_to_end_on_tiny_models(tmp_path, cli, capsys):
    target = tiny.save(tmp_path, seed=1, name="target")
    draft = tiny.save(tmp_path, seed=2, name="draft", layers=1, hidden=32)
    data = write_problems(tmp_path / "toy.jsonl.gz")
    out = tmp_path / "he.json"
    common = ["bench", "--humaneval", "--humaneval-data", str(data), "--limit", "2", "--target", str(target),
              "--draft", str(draft), "--dtype", "fp32", "--humaneval-timeout", "20"]
    assert cli(common + ["--strategies", "plain,auto", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "pass@1" in printed and "2 of 7 tasks" in printed
    report = json.loads(out.read_text())
    assert report["configs"] == ["none/plain", "none/auto"]
    assert len(report["rows"]) == 4 and report["reference_pass"] == 1.0
    assert report["dataset"]["sample"] == 2 and len(report["dataset"]["task_ids"]) == 2
    journal = (tmp_path / "he.json.rows.jsonl").read_text().splitlines()  # the rows as they came, and a header
    assert json.loads(journal[0])["settings"]["target"] == str(target) and len(journal) == 1 + 4
    assert report["settings"]["max_new_tokens"] == Settings().max_new_tokens  # the server's budget
    auto = report["summary"]["none/auto"]
    assert auto["agreement_with_first"] == 1.0  # greedy: speculation never changes the text
    for row in report["rows"]:
        assert row["new_tokens"] > 0 and row["status"] in ("passed", "failed", "timed out")
        assert not row["exact"] or row["passed"]

    again = tmp_path / "again.json"
    assert cli(common + ["--output", str(again), "--humaneval-compare", str(out)]) == 0  # plain by default
    compared = json.loads(again.read_text())
    assert compared["configs"] == ["none/plain"] and compared["dataset"]["task_ids"] == report["dataset"]["task_ids"]
    assert compared["compare"]["none/plain"] == {"against": "none/plain", "tasks": 2, "text_agreement": 1.0,
                                                 "pass_agreement": 1.0, "pass_at_1": auto["pass_at_1"],
                                                 "their_pass_at_1": auto["pass_at_1"]}
    assert "same text 100.0%" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--strategies", "hf-plain"], "server's strategies"),
    (["--adapter", "somewhere"], "without --adapter"),
    (["--humaneval-compare", "missing.json"], "cannot read missing.json"),
])
def test_bad_humaneval_arguments_are_one_line(tmp_path, cli, capsys, flags, message):
    data = write_problems(tmp_path / "toy.jsonl")
    assert cli(["bench", "--humaneval", "--humaneval-data", str(data), "--target", "nowhere"] + flags) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_resumed_run_completes_only_what_the_earlier_one_had_not(tmp_path, cli, capsys, monkeypatch):
    target = tiny.save(tmp_path, seed=1, name="target")
    data = write_problems(tmp_path / "toy.jsonl")
    out = tmp_path / "he.json"
    common = ["bench", "--humaneval", "--humaneval-data", str(data), "--target", str(target), "--dtype", "fp32",
              "--humaneval-timeout", "20", "--output", str(out)]
    assert cli(common + ["--limit", "2"]) == 0
    first = json.loads(out.read_text())["rows"]
    calls = []
    real = humaneval_bench.complete
    monkeypatch.setattr(humaneval_bench, "complete", lambda *a: calls.append(a[1].task_id) or real(*a))
    assert cli(common + ["--limit", "4", "--humaneval-resume"]) == 0
    report = json.loads(out.read_text())
    assert len(calls) == 2 and report["resumed_rows"] == 2 and len(report["rows"]) == 4
    assert set(calls).isdisjoint(r["task_id"] for r in first)  # a larger limit keeps the smaller one's tasks
    assert [r for r in report["rows"] if r["task_id"] not in calls] == first
    assert "resuming: 2 of 4 completions" in capsys.readouterr().out
    assert cli(common + ["--limit", "4", "--humaneval-resume", "--max-draft", "3"]) == 0  # other settings
    assert len(calls) == 6 and "not resuming" in capsys.readouterr().out


def test_llama_infill_is_a_row_of_the_same_table_and_resumes(tmp_path, cli, capsys, monkeypatch):
    """`--strategies plain,llama-infill`: llama-server (a stand-in that writes the true line) on the target's
    GGUF, scored beside ours; a resumed run asks it nothing again."""
    from fake_llama_server import answers_for, executable

    from specdec.models import store

    target = tiny.save(tmp_path, seed=1, name="target")
    data = write_problems(tmp_path / "toy.jsonl")
    tasks = humaneval.single_line_tasks(PROBLEMS)
    requests = tmp_path / "requests.jsonl"
    model = tmp_path / "model.gguf"  # the stand-in's "weights": what it answers
    model.write_text(json.dumps({**answers_for(tiny.tokenizer(), {t.prefix: t.middle + t.suffix + "\n\nz = 1\n"
                                                                  for t in tasks}), "log": str(requests)}))
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(executable(tmp_path)))
    monkeypatch.setattr(store, "target_gguf", lambda spec: model if spec == str(target) else None)
    out = tmp_path / "he.json"
    common = ["bench", "--humaneval", "--humaneval-data", str(data), "--limit", "3", "--target", str(target),
              "--dtype", "fp32", "--humaneval-timeout", "20", "--output", str(out), "--strategies", "plain,llama-infill"]
    assert cli(common) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["configs"] == ["none/plain", "llama-infill"]
    assert report["summary"]["llama-infill"]["pass_at_1"] == 1.0 and report["summary"]["llama-infill"]["tasks"] == 3
    assert "llama-infill: llama-server /infill on model.gguf" in printed
    assert any(line.startswith("llama-infill ") and "100.0%" in line for line in printed.splitlines())
    asked = len(requests.read_text().splitlines())
    assert asked == 3
    assert cli(common + ["--humaneval-resume"]) == 0
    assert "resuming: 6 of 6 completions" in capsys.readouterr().out
    assert len(requests.read_text().splitlines()) == asked and json.loads(out.read_text())["rows"] == report["rows"]
    monkeypatch.setattr(ModelHost, "load", lambda *a: pytest.fail("llama-infill alone needs only the tokenizer"))
    alone = tmp_path / "alone.json"
    assert cli(common[:-1] + ["llama-infill", "--output", str(alone)]) == 0
    assert json.loads(alone.read_text())["configs"] == ["llama-infill"]
    assert len(requests.read_text().splitlines()) == asked + 3


def test_without_llama_cpp_the_llama_infill_row_is_skipped_with_the_install_command(tmp_path, cli, capsys,
                                                                                     monkeypatch):
    target = tiny.save(tmp_path, seed=1, name="target")
    data = write_problems(tmp_path / "toy.jsonl")
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(tmp_path / "no-llama-server"))
    out = tmp_path / "he.json"
    assert cli(["bench", "--humaneval", "--humaneval-data", str(data), "--limit", "1", "--target", str(target),
                "--dtype", "fp32", "--output", str(out), "--strategies", "plain,llama-infill"]) == 0
    printed = capsys.readouterr().out
    assert "llama.cpp is not installed: skipping llama-infill" in printed and "pip install" in printed
    assert json.loads(out.read_text())["configs"] == ["none/plain"]


def test_the_server_settings_carry_every_model_flag_of_the_command_line():
    args = SimpleNamespace(target="t", draft="d", dtype="fp32", draft_quant="none", target_quant="int4",
                           int4_kernel="aten", max_draft=4, forward="transformers")
    settings = humaneval_bench.server_settings(args, ["plain"])
    assert (settings.target_quant, settings.int4_kernel, settings.draft_quant, settings.dtype, settings.forward) == \
        ("int4", "aten", "none", "fp32", "transformers")
