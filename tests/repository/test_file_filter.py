"""The one file filter, now in specdec: the fine-tune's import path is the same filter, and an editor's buffer is
judged by select()'s rules."""

from pathlib import Path

import specdec_finetune.files as finetune_files
from repos import SECRETS, make_repo

from specdec.repository import files


def test_the_finetune_and_the_index_share_one_filter():
    assert finetune_files.select is files.select and finetune_files.FileSelection is files.FileSelection
    assert finetune_files.secret_reason is files.secret_reason


def test_a_buffer_is_judged_as_its_file_would_be(tmp_path):
    root = make_repo(tmp_path / "repo", files=2, git=True)
    rel = Path("mod_0.py")
    assert files.document_reason(root, rel, "def f():\n    return 1\n") is None
    assert files.document_reason(root, rel, f'TOKEN = "{SECRETS[3]}"\n').startswith("secret")
    assert files.document_reason(root, rel, "") == "empty"
    assert files.document_reason(root, Path("ignored/skip.py"), "x = 1\n") == "ignored"  # .gitignore'd
    assert files.document_reason(root, Path("node_modules/x/a.js"), "x = 1\n") == "ignored"
    assert files.document_reason(root, Path("notes.md"), "# hi\n") == "not source code"
    assert files.document_reason(root, rel, "x = 1\n" * 100, max_bytes=100).startswith("too large")


def test_select_pauses_before_reading_each_candidate(tmp_path):
    root = make_repo(tmp_path / "repo", files=3, git=False)
    calls = []
    selection = files.select(root, pause=lambda: calls.append(1))
    assert len(selection.files) == 3 and len(calls) >= 3
