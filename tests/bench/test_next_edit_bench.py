"""`specdec bench --next-edit`: cases cut from a small git repository made here, the summary's arithmetic, the shipped
cases file, and the bench end to end on the tiny pair (every strategy's window equal to plain's)."""

import json
import subprocess
from types import SimpleNamespace

import pytest
import tiny

from specdec_bench import next_edit_bench, next_edit_cases
from specdec_bench.next_edit_cases import Case

BEFORE = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12))  # 48 lines


def git(folder, *args):
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A repository of two commits: the first adds mod.py and notes.txt, the second renames `x` in f1 (lines 5-6),
    f4 (two lines), f9 (one line) and touches notes.txt."""
    folder = tmp_path / "work"
    folder.mkdir()
    git(folder, "init", "-q", "-b", "main")
    git(folder, "config", "user.email", "t@example.com")
    git(folder, "config", "user.name", "t")
    (folder / "mod.py").write_text(BEFORE)
    (folder / "notes.txt").write_text("one\ntwo\n")
    git(folder, "add", ".")
    git(folder, "commit", "-qm", "first")
    after = BEFORE.replace("def f1(x):\n    return x + 1", "def f1(y):\n    return y + 1")
    after = after.replace("def f4(x):\n    return x + 4", "def f4(y):\n    return y + 4")
    after = after.replace("    return x + 9", "    return x + 9  # nine")
    (folder / "mod.py").write_text(after)
    (folder / "notes.txt").write_text("one\n2\n")
    git(folder, "commit", "-qam", "second")
    return folder, after


def test_a_commits_hunks_become_cases(repo):
    folder, after = repo
    git_dir = str(folder / ".git")
    cases = next_edit_cases.extract(git_dir, "me/work", "HEAD", limit=10)
    head = git(folder, "rev-parse", "HEAD").strip()
    # the first commit has no parent; the second's hunks: mod.py's three, then notes.txt's (not Python). The first
    # has no earlier hunk (no history); PER_COMMIT keeps the next two
    assert [c.id for c in cases] == [f"me/work@{head[:12]}:mod.py#1", f"me/work@{head[:12]}:mod.py#2"]
    second, third = cases
    lines = BEFORE.split("\n")
    # the file before f4's hunk: f1's change already made (the commit's earlier hunk), f4's not
    assert second.first_line == 0 and "def f1(y):" in second.text and "def f4(x):" in second.text
    assert second.text.split("\n")[second.line] == "def f4(x):" == lines[16]
    around = "    return x + 0\n\n\ndef f1({0}):\n    return {0} + 1\n\n\ndef f2(x):\n"
    assert second.history == [{"path": "mod.py", "original": around.format("x"), "updated": around.format("y")}]
    assert second.replace == [18, "def f4(y):\n    return y + 4\n"]
    # the expected file: the hunk applied; the cases after it see both earlier hunks, the most recent last
    assert "def f4(y):\n    return y + 4\n" in second.expected and "x + 9  # nine" not in second.expected
    assert third.text.split("\n")[third.line] == "    return x + 9" and len(third.history) == 2
    assert third.expected == after
    # an excerpt: the window (21 lines around the cursor) and EXCERPT_LINES on each side, no more
    assert third.first_line == 0 and third.text == BEFORE.replace("def f1(x):\n    return x + 1",
                                                                  "def f1(y):\n    return y + 1").replace(
        "def f4(x):\n    return x + 4", "def f4(y):\n    return y + 4")
    # deterministic, and round-trips through the JSON file
    again = next_edit_cases.extract(git_dir, "me/work", head, limit=10)
    assert [c.as_json() for c in again] == [c.as_json() for c in cases]
    data = folder.parent / "cases.jsonl"
    data.write_text("".join(c.as_json() + "\n" for c in cases))
    assert [c.as_json() for c in next_edit_cases.load(data)] == [c.as_json() for c in cases]


def test_the_shipped_cases_are_small_varied_and_consistent():
    assert next_edit_cases.DATA.stat().st_size < 512 * 1024
    cases = next_edit_cases.load()
    assert {c.repo for c in cases} == {name for name, _ in next_edit_cases.SOURCES}
    assert {c.repo for c in cases[:3]} == {name for name, _ in next_edit_cases.SOURCES}  # round-robin
    for case in cases:
        assert case.expected != case.text and case.history
        assert 0 <= case.line < len(case.text.split("\n"))


def test_interleave_and_percentile():
    assert next_edit_cases.interleave([[1, 2, 3], ["a"], [10, 20]]) == [1, "a", 10, 2, 20, 3]
    assert next_edit_bench.percentile([], 50) is None
    assert next_edit_bench.percentile([3.0], 95) == 3.0
    assert next_edit_bench.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert next_edit_bench.percentile([float(i) for i in range(1, 21)], 95) == pytest.approx(19.05)


def row(case, strategy, window, exact, nothing=False, tokens=10, passes=10, seconds=2.0, latency=2.5, cut=False):
    return {"case": case, "strategy": strategy, "window": window, "exact": exact, "changed_nothing": nothing,
            "cut": cut, "same_place": exact, "new_tokens": tokens, "target_passes": passes, "seconds": seconds,
            "latency": latency}


def test_the_summary_arithmetic():
    cases = [Case("r@c:a.py#0", "r", "c", "a.py", 0, "a\nb\n", 0, [], [1, "A\n"]),
             Case("r@c:a.py#1", "r", "c", "a.py", 0, "a\nb\n", 1, [], [2, ""])]
    assert cases[0].expected == "A\nb\n" and cases[1].expected == "a\n"
    rows = [row("r@c:a.py#0", "plain", "W0", True, tokens=20, passes=20, seconds=4.0, latency=5.0),
            row("r@c:a.py#1", "plain", "W1", False, nothing=True, tokens=10, passes=10, seconds=2.0, latency=3.0,
                cut=True),
            row("r@c:a.py#0", "edit", "W0", True, tokens=20, passes=4, seconds=1.0, latency=2.0),
            row("r@c:a.py#1", "edit", "other", False, tokens=12, passes=2, seconds=0.5, latency=1.0)]
    summary = next_edit_bench.summarize(rows, ["plain", "edit"], cases)
    plain, edit = summary["plain"], summary["edit"]
    assert plain["cases"] == 2 and plain["exact_match"] == 0.5 and plain["changed_nothing"] == 0.5
    assert plain["cut"] == 0.5 and plain["tokens_per_pass"] == 1.0 and plain["tokens_per_second"] == 5.0
    assert plain["latency_p50"] == 4.0 and plain["latency_p95"] == pytest.approx(4.9) and plain["equal_plain"] == 1.0
    assert edit["tokens_per_pass"] == 32 / 6 and edit["tokens_per_second"] == 32 / 1.5
    assert edit["equal_plain"] == 0.5 and edit["changed_nothing"] == 0.0 and edit["latency_mean"] == 1.5
    assert summary["no-edit baseline"] == {"cases": 2, "exact_match": 0.0, "changed_nothing": 1.0}
    table = next_edit_bench.table(summary)
    assert table.splitlines()[2] == "| plain | 2 | 50.0% | 50.0% | 50.0% | 50.0% | 1.00 | 5.00 | 4.0 | 4.9 | 100% |"
    assert "| no-edit baseline | 2 | 0.0% | 100.0% | - |" in table
    # without plain, =plain is not known
    assert next_edit_bench.summarize(rows[2:], ["edit"], cases)["edit"]["equal_plain"] is None


def test_apply_edit():
    from specdec.prompts.next_edit import Edit

    assert next_edit_bench.apply_edit("a\nbc\nd", None) == "a\nbc\nd"
    assert next_edit_bench.apply_edit("a\nbc\nd", Edit(1, 1, 2, 0, "X\n")) == "a\nbX\nd"
    assert next_edit_bench.apply_edit("a\nbc\nd", Edit(2, 1, 2, 1, "!")) == "a\nbc\nd!"


def test_strategies_default_to_plain_and_edit_and_others_are_refused():
    from specdec.errors import SpecdecError

    args = SimpleNamespace(strategies="hf-plain,plain")
    assert next_edit_bench.strategies_of(args, "hf-plain,plain") == ["plain", "edit"]
    args.strategies = "plain,lookup,edit"
    assert next_edit_bench.strategies_of(args, "hf-plain,plain") == ["plain", "lookup", "edit"]
    args.strategies = "plain,repo"
    with pytest.raises(SpecdecError, match="repo"):
        next_edit_bench.strategies_of(args, "x")


def test_the_bench_on_the_tiny_pair(tmp_path, capsys):
    from specdec.cli import build_parser

    target, draft = tiny.saved_pair(tmp_path)
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(c.as_json() + "\n" for c in next_edit_cases.load()[:2]))
    out = tmp_path / "next-edit.json"
    args = build_parser().parse_args(["bench", "--next-edit", "--next-edit-data", str(data), "--target", str(target),
                                      "--draft", str(draft), "--strategies", "plain,edit,lookup,draft",
                                      "--max-new-tokens", "24", "--output", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"data", "cases", "cases_total", "strategies", "models", "max_new_tokens", "max_draft",
                           "load_seconds", "wall_seconds", "summary", "rows"}
    assert report["strategies"] == ["plain", "edit", "lookup", "draft"] and len(report["cases"]) == 2
    assert report["max_new_tokens"] == 24 and report["max_draft"] == 16 and len(report["rows"]) == 8
    summary = report["summary"]
    assert set(summary) == {"plain", "edit", "lookup", "draft", "no-edit baseline"}
    for strategy in report["strategies"]:
        s = summary[strategy]
        assert set(s) == {"cases", "exact_match", "changed_nothing", "cut", "same_place", "new_tokens",
                          "target_passes", "tokens_per_pass", "tokens_per_second", "latency_p50", "latency_p95",
                          "latency_mean", "equal_plain"}
        assert s["cases"] == 2 and s["equal_plain"] == 1.0, strategy  # lossless: every window is plain's
    assert summary["plain"]["tokens_per_pass"] == 1.0
    assert (tmp_path / "next-edit.json.rows.jsonl").read_text().count("\n") == 8
    assert "| no-edit baseline | 2 | 0.0% |" in capsys.readouterr().out
