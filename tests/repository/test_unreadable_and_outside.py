"""What the file filter cannot read is skipped, not fatal (issue #40.6), and nothing outside the workspace root,
symlinks resolved, is ever read: not by the index, the fine-tune or online adaptation (issue #40.7).

Root reads files whatever their mode, so the permission cases run in a child process as an unprivileged user
(the real EACCES paths); each case also has an in-process check that makes the same OSError happen."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from repos import make_repo

from specdec.engine.drafters.repo_index import RepoIndex, vocabulary_of
from specdec.repository import files
from specdec.repository.build import build_index, document_key
from specdec.repository.indexer import WorkspaceIndexer

CEILING = 120.0
NOBODY = 65534
CANARY = "canary_b7e1f0_from_outside"


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=root, check=True,
                   capture_output=True)


@pytest.fixture
def shared_tmp():
    """A folder an unprivileged user may enter (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="specdec-unreadable-"))
    folder.chmod(0o755)
    yield folder
    for dirpath, dirnames, _ in os.walk(folder):  # top-down: each folder is opened up before it is entered
        for name in dirnames:
            if not os.path.islink(os.path.join(dirpath, name)):
                os.chmod(os.path.join(dirpath, name), 0o755)
    shutil.rmtree(folder, ignore_errors=True)


CHILD = """
import json, os, sys
sys.path.insert(0, {tests!r})
import tiny
from specdec.engine.drafters.repo_index import RepoIndex
from specdec.repository.files import select
from specdec.repository.indexer import WorkspaceIndexer


def run(root):
    selection = select(root)
    indexer = WorkspaceIndexer(RepoIndex(), debounce=0.05)
    indexer.set_tokenizer(tokenizer)
    indexer.open_root(root)
    settled = indexer.wait_settled({ceiling})
    stats = indexer.stats()
    indexer.stop(timeout=10)
    return {{"files": sorted(p.as_posix() for p in selection.files), "skipped": selection.skipped,
             "settled": settled, "index": stats}}


tokenizer = tiny.tokenizer()
run({warmup!r})  # every module loaded while the interpreter's own folders may still be read
if os.geteuid() == 0:  # then as a user the file modes apply to
    os.setgroups([])
    os.setgid({nobody})
    os.setuid({nobody})
print(json.dumps({{"uid": os.getuid(), **run({root!r})}}))
"""


def select_and_index_unprivileged(root: Path, warmup: Path) -> dict:
    """select() and a WorkspaceIndexer's build of root in a child process that drops root's privileges first."""
    env = {**os.environ, "HOME": str(root.parent), "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
           "GIT_CONFIG_VALUE_0": "*"}  # the repository is root's: git would refuse it as another user's
    code = CHILD.format(tests=str(Path(__file__).resolve().parent.parent), root=str(root), warmup=str(warmup),
                        ceiling=CEILING, nobody=NOBODY)
    done = subprocess.run([sys.executable, "-c", code], cwd=root.parent, env=env, capture_output=True, text=True,
                          timeout=CEILING * 2)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("git_repo", [True, False])
def test_unreadable_files_folders_gitignore_and_links_are_skipped_and_the_rest_indexed(shared_tmp, git_repo):
    root = make_repo(shared_tmp / "repo", files=3, git=git_repo)
    for path in [shared_tmp, *shared_tmp.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    (root / "locked").mkdir()
    (root / "locked" / "inner.py").write_text("def hidden():\n    return 1\n")
    (root / "cwd").symlink_to("/proc/1/cwd")  # as in a workspace `/`: stat raises EACCES there
    if git_repo:
        git(root, "add", "-A")  # tracked, then made unreadable: ls-files lists them
    (root / "mod_1.py").chmod(0)
    (root / ".gitignore").chmod(0)
    (root / "locked").chmod(0)
    result = select_and_index_unprivileged(root, make_repo(shared_tmp / "warmup", files=2, git=git_repo))
    if os.geteuid() == 0:
        assert result["uid"] == NOBODY
    assert {"mod_0.py", "mod_2.py"} <= set(result["files"]) and "mod_1.py" not in result["files"]
    assert result["skipped"]["mod_1.py"] == "unreadable: Permission denied"
    assert result["skipped"].get("cwd", "unreadable").startswith("unreadable")  # listed only where git tracks it
    if git_repo:
        assert result["skipped"]["locked/inner.py"].startswith("unreadable")
    assert "locked/inner.py" not in result["files"]
    index = result["index"]
    assert result["settled"] and index["state"] == "ready" and index["errors"] == 0
    assert index["files"] == len(result["files"]) >= 2 and index["documents"] == index["files"]
    assert index["skipped"] == len(result["skipped"]) and index["skipped"] >= 9


def test_a_permission_error_anywhere_skips_that_file_only(tmp_path, monkeypatch):
    """In-process, as any user: stat (as of a link into /proc/1/cwd) and read (a chmod 000 file) raising EACCES."""
    root = make_repo(tmp_path / "repo", files=3, git=False)
    (root / "cwd.py").write_text("x = 1\n")
    real_is_file, real_read = Path.is_file, files.read_file

    def is_file(self):
        if self.name == "cwd.py":
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self)

    def read_file(base, rel):
        if rel.name == "mod_1.py":
            raise PermissionError(13, "Permission denied", str(base / rel))
        return real_read(base, rel)

    monkeypatch.setattr(Path, "is_file", is_file)
    monkeypatch.setattr(files, "read_file", read_file)
    selection = files.select(root)
    assert sorted(p.as_posix() for p in selection.files) == ["mod_0.py", "mod_2.py"]
    assert selection.skipped["mod_1.py"] == selection.skipped["cwd.py"] == "unreadable: Permission denied"


def test_files_deleted_or_renamed_between_stat_and_read_are_skipped(tmp_path, monkeypatch, tok):
    root = make_repo(tmp_path / "repo", files=4, git=True)
    real_read = files.read_file

    def racing_read(base, rel):  # path_reason has just passed the file: now it goes, before the open
        if rel.name == "mod_1.py":
            (base / rel).unlink()
        if rel.name == "mod_2.py":
            (base / rel).rename(base / "moved.py")
        return real_read(base, rel)

    monkeypatch.setattr(files, "read_file", racing_read)
    selection = files.select(root)
    assert sorted(p.as_posix() for p in selection.files) == ["mod_0.py", "mod_3.py"]
    assert selection.skipped["mod_1.py"] == selection.skipped["mod_2.py"] == "unreadable: No such file or directory"
    monkeypatch.undo()

    (root / "mod_0.py").unlink()  # gone after it was selected: the build skips it and counts it
    report = build_index(root, tok, RepoIndex(), selection=selection)
    assert report.files == 1 and report.skipped == len(selection.skipped) + 1


def test_the_indexer_survives_files_vanishing_while_it_waits_for_a_completion(tmp_path, tok):
    """The issue's case: the indexer pauses before reading a file while a completion runs; the file is deleted
    or renamed meanwhile."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (root / name).write_text(f"def {name[0]}_function(x):\n    return x * 3\n")
    idle = threading.Event()  # clear: a completion runs
    indexer = WorkspaceIndexer(RepoIndex(), idle=idle, debounce=0.05)
    try:
        indexer.set_tokenizer(tok)
        indexer.open_root(root)
        deadline = time.monotonic() + CEILING
        while not indexer.paused:  # stopped before reading a.py
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (root / "a.py").unlink()
        (root / "b.py").rename(root / "renamed.txt")
        idle.set()
        assert indexer.wait_settled(CEILING)
        stats = indexer.stats()
        assert stats["state"] == "ready" and stats["errors"] == 0
        assert stats["files"] == 1 and stats["skipped"] == 2 and indexer.index.keys() == [document_key(root / "c.py")]
    finally:
        indexer.stop(timeout=10)


def outside_repro(tmp_path: Path) -> Path:
    """The issue's repro: a tracked folder replaced by a symlink to a folder outside the workspace."""
    outside = tmp_path / "outside" / "subdir"
    outside.mkdir(parents=True)
    (outside / "inner.py").write_text(f"def {CANARY}(x):\n    return x + 1\n" * 3)
    w = tmp_path / "w"
    (w / "sub").mkdir(parents=True)
    (w / "sub" / "inner.py").write_text("def f(): pass\n")
    for name in ("main.py", "util.py", "more.py"):
        (w / name).write_text("".join(f"def {name[:-3]}_{i}(x):\n    return x * {i} + 1\n" for i in range(20)))
    subprocess.run(["git", "init", "-q"], cwd=w, check=True)
    git(w, "add", "-A")
    git(w, "commit", "-q", "-m", "x")
    shutil.rmtree(w / "sub")
    (w / "sub").symlink_to(outside, target_is_directory=True)
    return w


def test_a_tracked_folder_linked_out_of_the_workspace_is_never_read(tmp_path, tok):
    w = outside_repro(tmp_path)
    assert Path("sub/inner.py") in files.list_files(w)  # git still lists it
    selection = files.select(w)
    assert selection.skipped["sub/inner.py"] == "outside the workspace"
    assert sorted(p.as_posix() for p in selection.files) == ["main.py", "more.py", "util.py"]

    index = RepoIndex()  # the repository index
    build_index(w, tok, index)
    assert sorted(index.keys()) == sorted(document_key(w / n) for n in ("main.py", "more.py", "util.py"))
    canary = tok(f"def {CANARY}", add_special_tokens=False)["input_ids"]
    found = index.query(canary)
    assert found is None or found.match_length < len(canary)

    # a selection made before the folder was swapped for the link: the reader still refuses it
    with pytest.raises(files.OutsideRoot):
        files.read_file(w, Path("sub/inner.py"))
    stale = files.FileSelection(w, [Path("sub/inner.py"), Path("main.py")])
    assert build_index(w, tok, RepoIndex(), selection=stale).files == 1


def test_the_reader_checks_the_file_it_opened(tmp_path, monkeypatch):
    """A link swapped in after the path check (the check passes, then the folder is replaced) is still refused:
    on Linux the opened descriptor's own path is checked."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the opened file's path is read from /proc/self/fd")
    w = outside_repro(tmp_path)
    monkeypatch.setattr(files, "inside", lambda root, rel: True)  # as if checked before the swap
    with pytest.raises(files.OutsideRoot):
        files.read_file(w, Path("sub/inner.py"))
    assert files.read_file(w, Path("main.py")).startswith(b"def main_0")


def test_the_finetune_never_reads_outside_the_workspace(tmp_path, tok):
    from specdec.prompts import fim
    from specdec_finetune.dataset import SampleBuilder
    from specdec_finetune.run import split_repo

    w = outside_repro(tmp_path)
    _, selection, split = split_repo(str(w), 0.34, 1)  # the path `specdec finetune` takes
    assert selection.skipped["sub/inner.py"] == "outside the workspace"
    texts = [f.text for f in split.train + split.heldout]
    assert texts and not any(CANARY in t for t in texts)
    samples = SampleBuilder(tok, fim.detect(tok), seq_len=64).samples(split.train + split.heldout, 200, seed=1)
    assert CANARY not in "".join(tok.decode(s) for s in samples)


def test_the_indexer_and_online_adaptation_never_take_a_document_from_outside(tmp_path, tok):
    from lsp_server.online import in_workspace
    from lsp_server.service import EditorRequest

    w = outside_repro(tmp_path)
    linked = w / "sub" / "inner.py"
    indexer = WorkspaceIndexer(RepoIndex(), debounce=0.05)
    try:
        indexer.set_tokenizer(tok)
        indexer.open_root(w)
        assert indexer.wait_settled(CEILING)
        indexer.update(linked, linked.read_text())  # the editor opened it through the link
        indexer.accepted(f"def {CANARY}(x):\n", "    return x + 1\n", linked)
        indexer.revert(linked)
        assert indexer.wait_settled(CEILING)
        stats = indexer.stats()
        assert stats["files"] == 3 and stats["documents"] == 3 and stats["accepted_refused"] == 1
        assert all(key.startswith(str(document_key(w))) for key in indexer.index.keys())
        assert indexer.index.vocabulary == vocabulary_of(tok)
    finally:
        indexer.stop(timeout=10)

    request = EditorRequest.at(linked.as_uri(), "python", str(w), f"def {CANARY}(x):\n", "", path="sub/inner.py")
    assert not in_workspace(request)
    assert in_workspace(EditorRequest.at((w / "main.py").as_uri(), "python", str(w), "", "", path="main.py"))
