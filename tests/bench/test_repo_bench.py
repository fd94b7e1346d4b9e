"""`specdec bench --repo PKG` on tiny models and a tiny local package: the five configurations, the held-out files
kept out of the index and the adapter, the holes' answers kept out of online training, the adapter cache."""

import json
import tarfile

import pytest

from repos import make_repo
from specdec.cli import main
from specdec.errors import SpecdecError


def bench(pair, out, *extra):
    return main(["bench", "--target", str(pair[0]), "--draft", str(pair[1]), "--dtype", "fp32", "--repo-steps", "2",
                 "--max-new-tokens", "8", "--max-draft", "4", "--holes", "2", "--output", str(out), *extra])


def test_the_five_configurations_on_a_local_package(tmp_path, pair, monkeypatch, capsys):
    from specdec_finetune import online
    from specdec_finetune.evaluate import holes_for
    from specdec_finetune.run import split_repo

    package = make_repo(tmp_path / "pkg", files=10, git=False)
    captured = []

    def build_data(job, tokenizer, template):  # what the online refresh trains on, as token ids
        data = real_build_data(job, tokenizer, template)
        captured.append([tokenizer.decode(s.ids) for s in data.train])
        return data

    real_build_data = online.build_data
    monkeypatch.setattr(online, "build_data", build_data)
    out = tmp_path / "repo.json"
    assert bench(pair, out, "--repo", str(package)) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("config "):]
    assert [line.split()[0] for line in table.splitlines()[1:6]] == ["base", "+lora", "+index", "+both", "+online"]

    result = json.loads(out.read_text())["packages"][0]
    _, selection, split = split_repo(str(package), 0.1, 0)
    heldout = {f.path for f in split.heldout}
    assert set(result["heldout_files"]) == heldout and heldout
    assert set(result["index"]["documents"]) == {f.path for f in split.train}  # the training files, no held-out one
    assert list(result["summary"]) == ["base", "+lora", "+index", "+both", "+online"]
    for label, s in result["summary"].items():
        assert s["holes"] == len(result["holes"]) == 2 and s["equal_to_base"] == 1.0, label  # lossless
        assert s["tokens_per_second_median"] > 0
    assert result["summary"]["base"]["delta_tokens_per_second"] == 0.0
    assert result["adapter"]["steps"] == 2 and not result["adapter"]["cached"]

    # online training saw the held-out files (the replay) but none of the holes' answers
    assert len(captured) == 1 and result["online"]["edited_samples"] > 0 and result["replay"]["accepted"] >= 2
    samples = "\n".join(captured[0])
    texts = {f.path: f.text for f in split.heldout}
    holes = holes_for(split.heldout, 2, 0)
    answer_lines = set()
    for hole in holes:
        lines = texts[hole.source.member].split("\n")
        answer_lines |= {lines[i].strip() for i in range(hole.line - 1, hole.line + hole.middle.count("\n"))}
        answer_lines |= {piece.strip() for piece in hole.middle.split("\n") if len(piece.strip()) >= 8}
    assert answer_lines and not [a for a in answer_lines if a in samples]
    others = [line.strip() for f in split.heldout for line in f.text.split("\n")
              if "frobnicate" in line and line.strip() not in answer_lines]
    assert any(line in samples for line in others)  # the rest of the held-out text was trained on


def test_a_pinned_package_is_fetched_once_and_its_adapter_trained_once(tmp_path, pair, monkeypatch, capsys):
    from specdec_bench import workload

    source = make_repo(tmp_path / "src", files=8, git=False)
    archive = tmp_path / "archives" / "demo-1.0.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tf:
        for path in sorted(source.rglob("*.py")):
            tf.add(path, f"demo-1.0/{path.relative_to(source)}")
    downloads = []

    def download(src, folder):
        downloads.append(src.package)
        return archive

    monkeypatch.setattr(workload, "_download", download)
    out = tmp_path / "repo.json"
    for run in range(2):
        assert bench(pair, out, "--repo", "demo==1.0", "--repo-configs", "base,+lora") == 0
        result = json.loads(out.read_text())["packages"][0]
        assert list(result["summary"]) == ["base", "+lora"] and "index" not in result and "online" not in result
        assert result["adapter"]["cached"] is (run == 1)
    assert downloads == ["demo==1.0"]
    assert result["root"].endswith("demo-1.0") and result["train_files"] + len(result["heldout_files"]) == 9


def test_bad_input_is_one_line(tmp_path, pair, capsys):
    from specdec_bench.repo_bench import parse_configs, parse_packages

    assert parse_packages(["a==1,b==2", "a==1", " c==3 "]) == ["a==1", "b==2", "c==3"]
    assert [c.label for c in parse_configs("online,+base")] == ["base", "+online"]
    with pytest.raises(SpecdecError, match="unknown lora2"):
        parse_configs("base,lora2")
    assert bench(pair, tmp_path / "x.json", "--repo", "rich") == 2
    assert "not a package pinned as name==version" in capsys.readouterr().err


def test_scrub_cuts_every_line_holding_an_answer():
    from specdec_bench.workload import Hole, SourceFile
    from specdec_bench.repo_bench import scrub

    text = "a = 1\nvalue = compute(alpha, beta)\nb = 2\nprint(compute(alpha, beta))\nc = 3\n"
    source = SourceFile("python", "local", "x", "x.py", "", "")
    start = text.index("compute(alpha")
    end = text.index("\n", start)
    hole = Hole(source, 0, text[:start], text[end:], text[start:end], 2)
    kept, found = scrub(text, [hole])
    assert found == {"compute(alpha, beta)", "value = compute(alpha, beta)"}
    assert kept == "a = 1\nb = 2\nc = 3\n"
