"""A file's last commits as next-edit hunks (issue #51 item 1): oldest first, bounded; nothing, never an error,
outside a repository or without git."""

import shutil
import subprocess

import pytest

from specdec.prompts.git_history import commit_hunks

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine")


def git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(root), "PATH": "/usr/bin:/bin"})


def test_the_last_commits_hunks_come_oldest_first_and_bounded(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    git(root, "init", "-q")
    source = root / "pkg" / "area.py"
    source.write_text("def area(w, h):\n    size = w * h\n    return size\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "one")
    source.write_text("def area(w, h):\n    area_ = w * h\n    return area_\n")
    git(root, "commit", "-q", "-am", "rename")
    source.write_text("def area(w, h):\n    area_ = w * h * 1\n    return area_\n")
    git(root, "commit", "-q", "-am", "scale")
    hunks = commit_hunks(source)
    assert [h.path for h in hunks] == ["pkg/area.py"] * 3
    assert "size = w * h" in hunks[1].original and "area_ = w * h\n" in hunks[1].updated  # the rename
    assert "area_ = w * h * 1" in hunks[-1].updated  # the newest commit last
    assert len(commit_hunks(source, commits=1)) == 1 and len(commit_hunks(source, max_hunks=2)) == 2


def test_no_repository_or_no_git_is_no_history(tmp_path, monkeypatch):
    plain = tmp_path / "a.py"
    plain.write_text("x = 1\n")
    assert commit_hunks(plain) == [] and commit_hunks(tmp_path / "missing" / "b.py") == []
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert commit_hunks(plain) == []
