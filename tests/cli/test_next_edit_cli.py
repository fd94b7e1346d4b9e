"""`specdec next-edit` on tiny local models: the --json object's shape (complete's stats keys), the same output for
every strategy, and one-line errors (exit 2) for a bad cursor or an unreadable diff, said before models load."""

import json

import pytest

import tiny
from specdec.cli import main

SOURCE = "def total(items):\n    count = 0\n    for item in items:\n        count += item\n    return count\n"
HISTORY = ("--- a/demo.py\n+++ b/demo.py\n@@ -1,2 +1,2 @@\n def total(items):\n-    count = 0\n+    n = 0\n")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tiny.saved_pair(root)


@pytest.fixture
def files(tmp_path):
    source, history = tmp_path / "demo.py", tmp_path / "recent.diff"
    source.write_text(SOURCE)
    history.write_text(HISTORY)
    return source, history


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_json_object_and_every_strategy_writes_the_same_window(capsys, models, files):
    from specdec.engine.strategies import NEXT_EDIT_STRATEGIES
    from types import SimpleNamespace

    from specdec.engine.session import GenerationStats
    from specdec.cli.complete import stats_json

    complete_keys = set(stats_json(SimpleNamespace(stats=GenerationStats(), stop_reason="eos")))
    target, draft = models
    source, history = files
    answers = {}
    for strategy in NEXT_EDIT_STRATEGIES:
        code, out, err = run(capsys, "next-edit", source, "--line", 2, "--col", 5, "--history", history, "--target",
                             target, "--draft", draft, "--strategy", strategy, "--max-new-tokens", 40, "--dtype",
                             "fp32", "--draft-quant", "none", "--json")
        assert code == 0, err
        assert out.count("\n") == 1
        result = json.loads(out)
        assert set(result) == {"edit", "window", "stats"} and isinstance(result["window"], str)
        stats = result["stats"]
        assert set(stats) == complete_keys  # the keys `specdec complete --json` prints
        assert {"target_passes", "new_tokens", "tokens_per_pass", "strategy", "stop_reason"} <= set(stats)
        assert stats["strategy"] == strategy and 0 < stats["new_tokens"] <= 40
        edit = result["edit"]
        if edit is not None:
            assert set(edit) == {"range", "text"} and set(edit["range"]) == {"start", "end"}
            assert set(edit["range"]["start"]) == {"line", "character"}
        else:
            assert stats["stop_reason"] != "eos" or result["window"] == SOURCE
        answers[strategy] = (result["window"], edit, stats["stop_reason"], stats["new_tokens"])
    assert len(set(json.dumps(a) for a in answers.values())) == 1, answers


def test_the_text_output_says_the_edit_or_why_there_is_none(capsys, models, files):
    source, _ = files
    code, out, err = run(capsys, "next-edit", source, "--line", 1, "--col", 1, "--target", models[0], "--strategy",
                         "plain", "--max-new-tokens", 8, "--dtype", "fp32")
    assert code == 0, err
    assert out.startswith(("no edit", "insert at", "delete", "replace")) and out.count("\n") == 1


@pytest.mark.parametrize("line, col, message", [(0, 1, "line 0 is outside the file (1..6)"),
                                                (9, 1, "line 9 is outside the file"),
                                                (2, 40, "column 40 is outside line 2 (1..14)")])
def test_a_cursor_outside_the_file_is_one_line(capsys, files, line, col, message):
    code, out, err = run(capsys, "next-edit", files[0], "--line", line, "--col", col, "--target", "nobody/nothing")
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_an_unreadable_diff_is_one_line_before_models_load(capsys, files, tmp_path):
    source, _ = files
    bad = tmp_path / "bad.diff"
    bad.write_text("this is not a diff\n")
    for history, message in ((tmp_path / "none.diff", "no such file"), (bad, "not a unified diff"),
                             (tmp_path, "is a folder")):
        code, out, err = run(capsys, "next-edit", source, "--line", 1, "--col", 1, "--history", history, "--target",
                             "nobody/nothing")  # never loaded: the diff is refused first
        assert code == 2 and out == "" and message in err and err.count("\n") == 1, err
    code, _, err = run(capsys, "next-edit", tmp_path / "gone.py", "--line", 1, "--col", 1)
    assert code == 2 and "no such file" in err
    code, _, err = run(capsys, "next-edit", source, "--line", 1, "--col", 1, "--max-new-tokens", 0)
    assert code == 2 and "--max-new-tokens 0 is out of range" in err
