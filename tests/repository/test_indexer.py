"""The background indexer: waits for the tokenizer, builds, follows edits, saves and closes, takes accepted
completions, and holds still while a completion runs. Tests wait on what the indexer reports (settled, paused),
never on the machine's speed: the ceilings are generous and only end a test that would otherwise hang."""

import threading
import time

import pytest
from repos import SECRETS, make_repo

from specdec.engine.drafters.repo_index import RepoIndex, vocabulary_of
from specdec.repository.build import document_key
from specdec.repository.indexer import WorkspaceIndexer


CEILING = 120.0  # seconds: a loaded machine is slow, never this slow


def wait_until(predicate, timeout=CEILING):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    raise AssertionError("timed out")


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def continues(index, tok, context: str, text: str, exclude=None, vocabulary=None) -> bool:
    found = index.query(ids(tok, context), exclude=exclude, horizon=len(ids(tok, text)), vocabulary=vocabulary)
    return found is not None and found.chain(len(ids(tok, text)))[0] == ids(tok, text)


@pytest.fixture
def indexer():
    idle = threading.Event()
    idle.set()
    made = WorkspaceIndexer(RepoIndex(), idle=idle, debounce=0.05)
    yield made
    made.stop(timeout=10)


def settle(indexer):
    assert indexer.wait_settled(CEILING), indexer.stats()


def test_builds_after_the_tokenizer_then_follows_the_editor(tmp_path, tok, indexer):
    root = make_repo(tmp_path / "repo", files=4)
    indexer.open_root(root)
    assert not indexer.wait_settled(0.2)  # nothing can happen without the tokenizer
    assert len(indexer.index) == 0 and indexer.state == "waiting for the tokenizer"
    indexer.set_tokenizer(tok)
    settle(indexer)
    stats = indexer.stats()
    assert stats["state"] == "ready" and stats["settled"] and len(indexer.index) == 4
    assert stats["files"] == 4 and stats["tokens"] > 0 and stats["bytes"] > 0 and stats["build_seconds"] > 0

    edited = root / "mod_1.py"
    indexer.update(edited, "def fresh_name(a, b):\n    return a * b + 17\n")  # didChange: unsaved text
    settle(indexer)
    assert continues(indexer.index, tok, "def fresh_name(a, b):\n    return", " a * b + 17")
    assert not continues(indexer.index, tok, "def handler_1(quux_1):\n    zorblax.frob", "nicate(quux_1")

    indexer.update(edited, f'TOKEN = "{SECRETS[3]}"\ndef fresh_name(a, b):\n    return a * b + 17\n')
    settle(indexer)
    assert document_key(edited) not in indexer.index  # a typed secret takes the file out

    indexer.revert(edited)  # didClose: the disk's text is the truth again
    settle(indexer)
    assert continues(indexer.index, tok, "def handler_1(quux_1):\n    zorblax.frob", "nicate(quux_1")
    assert indexer.stats()["updates"] == 3

    indexer.accepted("x = 1\ndef helper(", "alpha, beta):\n    return alpha - beta\n", root / "mod_2.py")
    settle(indexer)
    assert "accepted:1" in indexer.index
    assert continues(indexer.index, tok, "def helper(alpha, beta):\n    return", " alpha - beta")

    indexer.close_root(root)
    settle(indexer)  # the accepted completion stays; the folder's files go
    assert indexer.index.keys() == ["accepted:1"]


def test_nothing_moves_while_a_completion_runs(tmp_path, tok, indexer):
    root = make_repo(tmp_path / "repo", files=2)
    indexer.set_tokenizer(tok)
    indexer.open_root(root)
    settle(indexer)
    assert len(indexer.index) == 2
    indexer.idle.clear()  # a completion is running
    indexer.update(root / "mod_0.py", "def during(a):\n    return a + 99\n")
    wait_until(lambda: indexer.paused)  # the edit is due and waits for the completion to end
    assert not continues(indexer.index, tok, "def during(a):\n    return", " a + 99")
    assert not indexer.wait_settled(0.3)
    indexer.idle.set()
    settle(indexer)
    assert continues(indexer.index, tok, "def during(a):\n    return", " a + 99")


def test_a_new_tokenizer_rebuilds_and_a_smaller_cap_refills(tmp_path, tok, indexer):
    import tiny

    root = make_repo(tmp_path / "repo", files=3)
    indexer.set_tokenizer(tok)
    indexer.open_root(root)
    settle(indexer)
    assert len(indexer.index) == 3
    other = tiny.tokenizer(vocab_size=300)
    indexer.set_tokenizer(other)
    settle(indexer)  # the rebuild for the new tokenizer is done, not merely under way
    stats = indexer.stats()
    assert stats["rebuilds"] == 1 and stats["files"] == 3 and len(indexer.index) == 3
    assert continues(indexer.index, other, "def handler_2(quux_2):\n    zorblax.frob", "nicate(quux_2",
                     vocabulary=vocabulary_of(other))
    tokens = indexer.stats()["tokens"]
    indexer.set_max_tokens(tokens // 2)
    settle(indexer)
    stats = indexer.stats()
    assert stats["max_tokens"] == tokens // 2 and stats["state"] == "ready" and 0 < len(indexer.index) < 3
    assert stats["tokens"] <= tokens // 2


def test_no_query_drafts_from_the_other_tokenizer_while_a_switch_rebuilds(tmp_path, tok, indexer):
    """From the moment a new tokenizer is set, a query in its ids finds nothing of the old one's documents, and
    a query in the old one's ids nothing of the new one's; a build under way in the old ids stops and adds no
    more of them."""
    import tiny

    other = tiny.tokenizer(vocab_size=300)
    ours, theirs = vocabulary_of(tok), vocabulary_of(other)
    context, following = "def handler_1(quux_1):\n    zorblax.frob", "nicate(quux_1"
    root = make_repo(tmp_path / "repo", files=4)
    indexer.set_tokenizer(tok)
    indexer.open_root(root)
    settle(indexer)
    indexer.accepted("x = 1\ndef helper(", "alpha, beta):\n    return alpha - beta\n", root / "mod_2.py")
    settle(indexer)
    assert continues(indexer.index, tok, context, following, vocabulary=ours)

    indexer.idle.clear()  # a completion runs: the rebuild starts, then waits at its first pause
    indexer.set_tokenizer(other)
    assert indexer.index.query(ids(other, context), vocabulary=theirs) is None  # at once, before any rebuild
    wait_until(lambda: indexer.paused)
    assert indexer.index.vocabulary == theirs and len(indexer.index) == 0  # emptied and stamped in one step
    assert indexer.index.query(ids(tok, context), vocabulary=ours) is None

    # a build in the old ids, interrupted by a switch back: it stops at its pause and nothing of it lands
    indexer.set_tokenizer(tok)
    wait_until(lambda: indexer.index.vocabulary == ours and indexer.paused)
    indexer.set_tokenizer(other)
    wait_until(lambda: indexer.index.vocabulary == theirs and indexer.paused)
    assert len(indexer.index) == 0
    indexer.idle.set()
    settle(indexer)
    assert indexer.index.vocabulary == theirs and len(indexer.index) == 5  # four files, one accepted completion
    assert continues(indexer.index, other, context, following, vocabulary=theirs)
    assert continues(indexer.index, other, "def helper(alpha, beta):\n    return", " alpha - beta",
                     vocabulary=theirs)
    assert indexer.index.query(ids(tok, context), vocabulary=ours) is None
    assert not indexer.index.add_many([("stale", ids(tok, context))], vocabulary=ours)[0]  # old ids refused


def test_the_stamp_is_refused_by_a_drafter_of_another_tokenizer(tok):
    import tiny

    from specdec.engine.drafters.base import RequestContext
    from specdec.engine.drafters.repo import RepoDrafter

    index = RepoIndex()
    index.restamp(vocabulary_of(tok))
    text = "def handler_1(quux_1):\n    zorblax.frobnicate(quux_1, wibble=3)\n"
    assert index.add_many([("a.py", ids(tok, text))], vocabulary=vocabulary_of(tok)) == [True]
    context = ids(tok, "def handler_1(quux_1):\n    zorblax.frob")
    ours = RequestContext(vocabulary=vocabulary_of(tok))
    assert RepoDrafter(index).propose(context, 4, request=ours).tokens
    other = RequestContext(vocabulary=vocabulary_of(tiny.tokenizer(vocab_size=300)))
    assert RepoDrafter(index).propose(context, 4, request=other).tokens == []


def test_an_accepted_completion_is_indexed_only_where_its_document_would_be(tmp_path, tok, indexer):
    """Issue #40.12: the text before an accepted completion meets the file filter's rules for its document (the
    whole buffer and its path), as the document's file would."""
    root = make_repo(tmp_path / "repo", files=2)
    key = "AKIA" + "QWERTYUIOPASDFGH"
    indexer.set_tokenizer(tok)
    indexer.open_root(root)
    settle(indexer)
    # a buffer the filter excludes: the key right above the accepted completion, then far above it
    near = root / "aws_near.py"
    near_text = f'import boto3\n\nAWS_ACCESS_KEY_ID = "{key}"\n'
    indexer.update(near, near_text)
    indexer.accepted(near_text, "client = boto3.client('s3')\n", near)
    far = root / "aws_far.py"
    far_text = f'AWS_ACCESS_KEY_ID = "{key}"\n' + "".join(f"def step_{i}(x):\n    return x + {i}\n" for i in range(60))
    indexer.update(far, far_text)
    indexer.accepted(far_text, "def step_60(x):\n    return x + 60\n", far)
    indexer.accepted("import zorblax\n", "x = 1\n", root / "settings.py")  # on disk only: its AWS key counts
    indexer.accepted("def f(", "): pass\n", tmp_path / "elsewhere.py")  # outside every workspace root
    indexer.accepted("def handler_0(quux_0):\n", f'    KEY = "{key}"\n', root / "mod_0.py")  # the completion's own
    indexer.accepted("def handler_1(quux_1):\n", "    return quux_1 * 41\n", root / "mod_1.py")  # a clean file
    settle(indexer)
    stats = indexer.stats()
    assert stats["accepted_refused"] == 5 and stats["accepted"] == 1
    assert [k for k in indexer.index.keys() if k.startswith("accepted:")] == ["accepted:1"]
    assert not continues(indexer.index, tok, 'AWS_ACCESS_KEY_ID = "', key[:8])
    assert not continues(indexer.index, tok, 'KEY = "', key[:8])
    assert continues(indexer.index, tok, "def handler_1(quux_1):\n    return", " quux_1 * 41")


def test_a_path_no_file_can_have_is_ignored(tmp_path, tok, indexer):
    """Issue #40.14: a URI with %00 gives a path with a NUL: no key lookup raises, nothing of it is indexed."""
    root = make_repo(tmp_path / "repo", files=2)
    indexer.set_tokenizer(tok)
    indexer.open_root(root)
    settle(indexer)
    bad = str(root / "a\0b.py")
    assert document_key(bad).endswith("a\0b.py")
    indexer.update(bad, "def nul_named(a):\n    return a\n")
    indexer.accepted("def f(", "): pass\n", bad)
    indexer.revert(bad)
    settle(indexer)
    stats = indexer.stats()
    assert stats["state"] == "ready" and stats["errors"] == 0 and stats["accepted_refused"] == 1
    assert len(indexer.index) == 2
