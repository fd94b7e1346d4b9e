"""The background indexer: waits for the tokenizer, builds, follows edits, saves and closes, takes accepted
completions, and holds still while a completion runs."""

import threading
import time

import pytest
from repos import SECRETS, make_repo

from specdec.engine.drafters.repo_index import RepoIndex
from specdec.repository.build import document_key
from specdec.repository.indexer import WorkspaceIndexer


def wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    raise AssertionError("timed out")


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def continues(index, tok, context: str, text: str, exclude=None) -> bool:
    found = index.query(ids(tok, context), exclude=exclude, horizon=len(ids(tok, text)))
    return found is not None and found.chain(len(ids(tok, text)))[0] == ids(tok, text)


@pytest.fixture
def indexer():
    idle = threading.Event()
    idle.set()
    made = WorkspaceIndexer(RepoIndex(), idle=idle, debounce=0.05)
    yield made
    made.stop(timeout=10)


def test_builds_after_the_tokenizer_then_follows_the_editor(tmp_path, tok, indexer):
    root = make_repo(tmp_path / "repo", files=4)
    indexer.open_root(root)
    time.sleep(0.2)
    assert len(indexer.index) == 0 and indexer.state == "waiting for the tokenizer"
    indexer.set_tokenizer(tok)
    wait_until(lambda: indexer.state == "ready" and len(indexer.index) == 4)
    stats = indexer.stats()
    assert stats["files"] == 4 and stats["tokens"] > 0 and stats["bytes"] > 0 and stats["build_seconds"] > 0

    edited = root / "mod_1.py"
    indexer.update(edited, "def fresh_name(a, b):\n    return a * b + 17\n")  # didChange: unsaved text
    wait_until(lambda: continues(indexer.index, tok, "def fresh_name(a, b):\n    return", " a * b + 17"))
    assert not continues(indexer.index, tok, "def handler_1(quux_1):\n    zorblax.frob", "nicate(quux_1")

    indexer.update(edited, f'TOKEN = "{SECRETS[3]}"\ndef fresh_name(a, b):\n    return a * b + 17\n')
    wait_until(lambda: document_key(edited) not in indexer.index)  # a typed secret takes the file out

    indexer.revert(edited)  # didClose: the disk's text is the truth again
    wait_until(lambda: continues(indexer.index, tok, "def handler_1(quux_1):\n    zorblax.frob", "nicate(quux_1"))
    assert indexer.stats()["updates"] == 3

    indexer.accepted("x = 1\ndef helper(", "alpha, beta):\n    return alpha - beta\n")
    wait_until(lambda: "accepted:1" in indexer.index)
    assert continues(indexer.index, tok, "def helper(alpha, beta):\n    return", " alpha - beta")

    indexer.close_root(root)
    wait_until(lambda: len(indexer.index) == 1)  # the accepted completion stays; the folder's files go
    assert indexer.index.keys() == ["accepted:1"]


def test_nothing_moves_while_a_completion_runs(tmp_path, tok, indexer):
    root = make_repo(tmp_path / "repo", files=2)
    indexer.set_tokenizer(tok)
    indexer.open_root(root)
    wait_until(lambda: len(indexer.index) == 2 and indexer.state == "ready")
    indexer.idle.clear()  # a completion is running
    indexer.update(root / "mod_0.py", "def during(a):\n    return a + 99\n")
    time.sleep(0.5)
    assert not continues(indexer.index, tok, "def during(a):\n    return", " a + 99")
    indexer.idle.set()
    wait_until(lambda: continues(indexer.index, tok, "def during(a):\n    return", " a + 99"))


def test_a_new_tokenizer_rebuilds_and_a_smaller_cap_refills(tmp_path, tok, indexer):
    import tiny

    root = make_repo(tmp_path / "repo", files=3)
    indexer.set_tokenizer(tok)
    indexer.open_root(root)
    wait_until(lambda: len(indexer.index) == 3 and indexer.state == "ready")
    before = indexer.stats()["tokens"]
    other = tiny.tokenizer(vocab_size=300)
    indexer.set_tokenizer(other)
    wait_until(lambda: indexer.stats()["tokens"] != before and len(indexer.index) == 3)
    assert continues(indexer.index, other, "def handler_2(quux_2):\n    zorblax.frob", "nicate(quux_2")
    tokens = indexer.stats()["tokens"]
    indexer.set_max_tokens(tokens // 2)
    wait_until(lambda: indexer.stats()["max_tokens"] == tokens // 2 and indexer.state == "ready"
               and 0 < len(indexer.index) < 3)
    assert indexer.stats()["tokens"] <= tokens // 2
