"""HumanEval single-line infilling: the tasks derived from the problems, and the sandbox that scores them."""

import json
import time

import pytest
from humaneval_files import ADD, LARGEST, PROBLEMS, write_problems

from specdec_bench import humaneval
from specdec_bench.sandbox import run_program
from specdec.errors import SpecdecError


def test_every_non_blank_solution_line_is_one_hole():
    tasks = humaneval.single_line_tasks(PROBLEMS)
    assert [t.task_id for t in tasks] == ["SingleLineInfilling/Toy/0/L0", "SingleLineInfilling/Toy/0/L2"] + [
        f"SingleLineInfilling/Toy/1/L{i}" for i in range(5)]  # ADD's blank line 1 is never a hole
    first, last = tasks[0], tasks[1]
    assert first.prefix == ADD["prompt"] and first.middle == "    total = a + b\n"
    assert first.suffix == "\n    return total\n"  # the solution's later lines, the blank one included
    assert last.prefix == ADD["prompt"] + "    total = a + b\n\n" and last.middle == "    return total\n"
    assert last.suffix == ""  # nothing after the solution: the tests come later, in the program only
    for task in tasks:
        problem = ADD if task.problem_id == "Toy/0" else LARGEST
        assert task.reference == problem["prompt"] + problem["canonical_solution"]
        assert task.middle.strip() and task.middle.endswith("\n") and task.middle.count("\n") == 1
        assert task.entry_point == problem["entry_point"] and task.test == problem["test"]
    program = first.program(first.reference)
    assert program.startswith(first.reference) and program.rstrip().endswith("check(add)")


def test_a_last_line_without_a_line_break_is_a_hole_too():
    problem = dict(ADD, canonical_solution="    total = a + b\n    return total")
    tasks = humaneval.single_line_tasks([problem])
    assert [t.middle for t in tasks] == ["    total = a + b\n", "    return total"]
    assert tasks[1].suffix == ""


@pytest.mark.parametrize("name", ["toy.jsonl", "toy.jsonl.gz"])
def test_problems_files_read_as_jsonl_or_gzip(tmp_path, name):
    tasks = humaneval.load_tasks(write_problems(tmp_path / name))
    assert len(tasks) == 7  # a file of one's own: no count to match


def test_a_broken_problems_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "x"}) + "\n")
    with pytest.raises(SpecdecError, match="bad.jsonl:1: not a HumanEval problem"):
        humaneval.load_tasks(bad)
    with pytest.raises(SpecdecError, match="no such HumanEval file"):
        humaneval.load_tasks(tmp_path / "missing.jsonl")


def test_the_pinned_file_must_give_its_count(tmp_path, monkeypatch):
    monkeypatch.setattr(humaneval, "fetch", lambda: write_problems(tmp_path / "pinned.jsonl.gz"))
    with pytest.raises(SpecdecError, match="derived 7 single-line tasks .* expected 1033"):
        humaneval.load_tasks()


def test_the_sample_is_seeded_in_dataset_order_and_spread():
    tasks = humaneval.single_line_tasks(PROBLEMS * 30)
    picked = humaneval.sample(tasks, 20, seed=0)
    assert picked == humaneval.sample(tasks, 20, seed=0) and picked != humaneval.sample(tasks, 20, seed=1)
    order = {id(t): i for i, t in enumerate(tasks)}
    assert [order[id(t)] for t in picked] == sorted(order[id(t)] for t in picked)
    assert order[id(picked[-1])] > len(tasks) // 2  # not just the first tasks
    assert humaneval.sample(tasks, 0) == tasks and humaneval.sample(tasks, 10_000) == tasks
    assert set(map(id, picked)) < set(map(id, humaneval.sample(tasks, 50, seed=0)))  # a larger limit extends it


def test_a_correct_program_passes_and_a_wrong_one_fails():
    task = humaneval.single_line_tasks([LARGEST])[2]  # "        if x > best:"
    assert run_program(task.program(task.reference), timeout=30).passed
    wrong = task.prefix + "        if x < best:\n" + task.suffix
    outcome = run_program(task.program(wrong), timeout=30)
    assert not outcome.passed and outcome.status == "failed" and "AssertionError" in outcome.detail
    broken = run_program(task.program(task.prefix + "        if x >\n" + task.suffix), timeout=30)
    assert broken.status == "failed" and "SyntaxError" in broken.detail


def test_a_program_that_runs_too_long_is_killed(tmp_path):
    marker = tmp_path / "started"
    source = f"import time\nopen({str(marker)!r}, 'w').close()\nwhile True:\n    time.sleep(0.05)\n"
    start = time.perf_counter()
    outcome = run_program(source, timeout=1.5)
    assert outcome.status == "timed out" and not outcome.passed
    assert time.perf_counter() - start < 10
    assert marker.exists()  # it did run before it was killed


def test_the_guard_refuses_sockets_subprocesses_and_file_removal(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("x")
    for source in ("import socket\nsocket.socket()\n", "import subprocess\nsubprocess.run(['true'])\n",
                   f"import os\nos.remove({str(keep)!r})\n", "import os\nos.kill(os.getppid(), 9)\n",
                   "import os\nos.posix_spawn('/bin/true', ['true'], {})\n"):
        outcome = run_program(source, timeout=30)
        assert outcome.status == "failed" and "PermissionError" in outcome.detail, source
    assert keep.exists()


@pytest.mark.slow
def test_the_pinned_humaneval_gives_1033_tasks_whose_references_all_pass(real_cache):
    path = humaneval.fetch()  # into the tests' own cache, once (conftest's real_cache; the user's copy read via a link)
    assert path.is_relative_to(real_cache)
    assert humaneval._sha256(path.read_bytes()) == humaneval.SHA256
    assert len(humaneval.read_problems(path)) == humaneval.PROBLEMS
    tasks = humaneval.load_tasks()
    assert len(tasks) == humaneval.SINGLE_LINE_TASKS == 1033
    failing = [t.task_id for t in tasks if not run_program(t.program(t.reference), timeout=30).passed]
    assert not failing


def test_a_humaneval_run_takes_server_settings_over_the_defaults():
    """--humaneval-setting KEY=VALUE (JSON values): the prompt budgets a run measures, e.g. a shorter suffix; an unknown
    key or a bad value is one line, before any model loads."""
    from argparse import Namespace

    from specdec_bench.humaneval_bench import server_settings
    from specdec.errors import SpecdecError

    base = dict(target="t", draft="", dtype="fp32", draft_quant="int8", target_quant="auto", int4_kernel="auto",
                max_draft=8)
    settings = server_settings(Namespace(**base, humaneval_setting=["maxSuffixTokens=32", "fimOrder=spm"]), ["plain"])
    assert (settings.max_suffix_tokens, settings.fim_order) == (32, "spm")
    with pytest.raises(SpecdecError, match="not a server setting"):
        server_settings(Namespace(**base, humaneval_setting=["maxSufixTokens=32"]), ["plain"])
    with pytest.raises(SpecdecError, match="maxSuffixTokens must be"):
        server_settings(Namespace(**base, humaneval_setting=["maxSuffixTokens=-1"]), ["plain"])
