"""`specdec bench --strategies repo`: the `repo` row drafts from an index of the hole's package's other files."""

from __future__ import annotations

import json

import pytest

from specdec_bench.workload import load_workload, local_sources, neighbours


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    import tiny

    return tiny.save(tmp_path_factory.mktemp("models"), seed=1, name="target")


def test_a_local_files_neighbours_are_its_folders_other_files_with_its_suffix(tmp_path):
    (tmp_path / "lib.py").write_text("a = 1\n")
    (tmp_path / "other.py").write_text("b = 2\n")
    (tmp_path / "notes.txt").write_text("not code\n")
    (source,) = local_sources([str(tmp_path / "lib.py")])
    assert neighbours(source) == [(str(tmp_path / "other.py"), "b = 2\n")]


def test_the_repo_row_drafts_from_the_other_files_and_equals_plain(tiny_target, tmp_path, capsys):
    from specdec.cli import main

    code = "".join(f"def scaled_{i}(value):\n    return value * {i} + offset\n\n" for i in range(30))
    (tmp_path / "lib.py").write_text(code)
    bench = ["bench", "--target", str(tiny_target), "--files", str(tmp_path / "lib.py"), "--holes", "2",
             "--max-new-tokens", "12", "--dtype", "fp32", "--cold"]  # cold: each request alone, whatever ran before
    assert main([*bench, "--strategies", "plain", "--output", str(tmp_path / "plain.json")]) == 0
    plain = {r["hole"]: r["text"] for r in json.loads((tmp_path / "plain.json").read_text())["rows"]}
    holes = load_workload(None, 2, local_sources([str(tmp_path / "lib.py")]))
    # the project repeats itself: another file holds each hole's text before the cursor and what the model then
    # writes there, so the index finds the cursor's place in it and drafts what follows
    (tmp_path / "copy.py").write_text("".join(hole.prefix + plain[hole.name] + "\n" for hole in holes))
    out = tmp_path / "bench.json"
    status = main([*bench, "--strategies", "plain,repo", "--output", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "repository index for python:lib.py: 1 other .py files" in printed
    rows = [r for r in json.loads(out.read_text())["rows"] if r["strategy"] == "repo"]
    assert len(rows) == 2 and all(r["equals_plain"] for r in rows)
    # drafted, not necessarily accepted: the second run's fp32 target may break a random tiny model's near-tie
    # differently from the first's (it did once in the whole suite), and acceptance is the engine's, tested elsewhere
    assert sum(r["drafted_by"].get("repo", 0) for r in rows) > 0, [(r["drafted"], r["drafted_by"]) for r in rows]
