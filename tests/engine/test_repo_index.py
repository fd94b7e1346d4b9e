"""The repository index: longest match, frequency of continuations, trees, updates, the cap, concurrent readers."""

import random
import threading
from collections import Counter

import numpy as np
import pytest

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import RequestContext
from specdec.engine.drafters.repo import PromptMarkers, RepoDrafter, left_context
from specdec.engine.drafters.repo_index import Continuations, RepoIndex
from specdec.engine.drafters.suffix_segment import SEPARATOR, left_context_order
from specdec.engine.tree import DETERMINISTIC, ROOT


def reference(documents: dict[str, list[int]], context: list[int], depth: int, horizon: int, exclude=None,
              min_match: int = 1):
    """Brute force: the longest match of the context's end with a continuation, and what followed it."""
    for length in range(min(depth, len(context)), min_match - 1, -1):
        tail = context[-length:]
        found = Counter()
        for key, doc in documents.items():
            if key == exclude:
                continue
            for p in range(length, len(doc)):
                if doc[p - length : p] == tail:
                    found[tuple(doc[p : p + horizon])] += 1
        if found:
            return length, found
    return 0, Counter()


def test_left_context_order_sorts_by_reversed_preceding_tokens():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 4, 300).astype(np.int32)
    tokens[::37] = SEPARATOR
    for depth in (1, 3, 8):
        order = left_context_order(tokens, depth)
        keys = [tuple(int(tokens[p - j]) if p - j >= 0 else -2 for j in range(1, depth + 1)) for p in order]
        assert keys == sorted(keys)
        assert sorted(order.tolist()) == list(range(len(tokens)))


@pytest.mark.parametrize("seed", range(6))
def test_longest_match_and_its_continuations_equal_brute_force(seed):
    rng = random.Random(seed)
    documents = {f"d{i}": [rng.randrange(5) for _ in range(rng.randrange(1, 120))] for i in range(12)}
    index = RepoIndex(depth=6, max_segments=3)
    for i, (key, doc) in enumerate(documents.items()):  # several adds: several segments, merges
        if i % 4 == 0:
            index.add_many([(k, documents[k]) for k in list(documents)[i : i + 4]])
    for _ in range(40):
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 10))]
        exclude = rng.choice([None, "d0", "d3"])
        expected_length, expected = reference(documents, context, 6, 4, exclude)
        found = index.query(context, exclude=exclude, horizon=4, limit=10_000)
        if not expected:
            assert found is None
            continue
        assert found.match_length == expected_length
        assert dict(zip(found.sequences, found.counts)) == dict(expected)


def test_chain_follows_the_most_frequent_continuation_with_its_frequency():
    index = RepoIndex()
    for i in range(3):
        index.add(f"a{i}", [1, 2, 3, 10, 11, 12])
    index.add("b", [1, 2, 3, 20, 21])
    found = index.query([9, 2, 3])
    assert found.match_length == 2 and found.occurrences == 4
    tokens, freqs = found.chain(5)
    assert tokens == [10, 11, 12] and freqs == [0.75, 1.0, 1.0]
    assert found.chain(5, min_probability=0.8)[0] == []  # not frequent enough to propose
    assert found.chain(2)[0] == [10, 11]


def test_a_document_end_counts_against_every_continuation():
    found = Continuations(1, ((5,), (5, 6)), (1, 1))
    assert found.chain(3) == ([5, 6], [1.0, 0.5])
    assert found.chain(3, min_probability=0.6)[0] == [5]


def test_distinct_continuations_become_a_trie_within_the_node_budget():
    index = RepoIndex()
    index.add_many([("a", [1, 2, 10, 11, 12]), ("b", [1, 2, 10, 11, 12]), ("c", [1, 2, 10, 13]),
                    ("d", [1, 2, 20, 21])])
    found = index.query([1, 2])
    tree = found.tree(k=3, nodes=16)
    assert tree.drawn == [DETERMINISTIC] * (len(tree) + 1) and tree.child_probs is None
    paths = {tuple(tree.tokens[n] for n in tree.path(leaf)) for leaf in range(len(tree)) if not tree.children(leaf)}
    assert paths == {(10, 11, 12), (10, 13), (20, 21)}
    assert [tree.tokens[c] for c in tree.children(ROOT)] == [10, 20]  # most frequent first
    assert tree.tokens[: 2] == [10, 11]  # best-first: the likeliest path is drafted first
    small = found.tree(k=3, nodes=3)
    assert small.tokens == [10, 11, 12]  # path frequencies 3/4, 1/2, 1/2 beat 20's and 13's 1/4
    assert found.tree(k=3, nodes=16, min_probability=0.4).tokens == [10, 11, 12]
    chain_tokens, _ = found.chain(3)
    assert chain_tokens == [10, 11, 12]


def test_replace_and_remove_are_reflected_and_exclude_skips_a_document():
    index = RepoIndex()
    index.add("a", [1, 2, 3, 4])
    index.add("b", [7, 2, 3, 9])
    assert index.query([2, 3]).sequences == ((4,), (9,)) or index.query([2, 3]).sequences == ((9,), (4,))
    index.add("a", [1, 2, 3, 5])  # didChange: the new text replaces the old
    assert set(index.query([2, 3]).sequences) == {(5,), (9,)}
    index.remove("b")
    assert index.query([2, 3]).sequences == ((5,),)
    assert index.query([2, 3], exclude="a") is None
    index.add("c", [3, 8])
    found = index.query([2, 3], exclude="a")  # the longest match is only in the excluded document: a shorter one
    assert found.match_length == 1 and found.sequences == ((8,),)
    assert "b" not in index and len(index) == 2


def test_the_cap_holds_and_dead_tokens_are_compacted_to_make_room():
    index = RepoIndex(max_tokens=100)
    assert index.add_many([(f"f{i}", list(range(i, i + 20))) for i in range(4)]) == [True] * 4
    assert not index.add("big", list(range(30)))  # 80 + 30 > 100
    assert index.stats().refused == 1 and index.stats().stored_tokens == 80
    for i in range(4):  # replacing leaves dead tokens; they are compacted when room is needed
        index.add(f"f{i}", list(range(100 + i, 120 + i)))
        assert index.stats().stored_tokens <= 100
    index.add("accepted:1", [7] * 10, evictable=True)
    index.add("accepted:2", [8] * 10, evictable=True)
    assert index.stats().tokens == 100
    assert index.add("more", [9] * 15)  # the oldest accepted completions give way
    s = index.stats()
    assert "accepted:1" not in index and "accepted:2" not in index and s.evicted == 2
    assert s.stored_tokens <= 100 and s.tokens == 95
    assert not index.add("fx", [1] * 20)  # files are never evicted for files
    assert index.set_max_tokens(200) and index.add("fx", [1] * 20)
    assert not index.set_max_tokens(50) and len(index) == 0  # over the new cap: dropped, the owner refills


def test_segments_stay_few_as_documents_arrive_one_by_one():
    index = RepoIndex(max_segments=4)
    rng = random.Random(1)
    docs = {f"f{i}": [rng.randrange(50) for _ in range(rng.randrange(5, 60))] for i in range(200)}
    for key, doc in docs.items():
        index.add(key, doc)
    assert index.stats().segments <= 4
    assert index.stats().tokens == sum(map(len, docs.values()))
    doc = next(d for d in docs.values() if len(d) >= 30)
    found = index.query(doc[:20], horizon=5)
    assert found.match_length == min(20, index.depth) and tuple(doc[20:25]) in found.sequences


def test_queries_run_while_another_thread_rewrites_the_index():
    index = RepoIndex(max_tokens=5_000, max_segments=3)
    versions = {f"f{i}": [i % 7, 100, 101, 102, 200 + i] for i in range(50)}
    index.add_many(versions.items())
    stop, errors, answers = threading.Event(), [], []

    def writer():
        rng = random.Random(2)
        try:
            while not stop.is_set():
                key = f"f{rng.randrange(50)}"
                if rng.random() < 0.3:
                    index.remove(key)
                else:
                    index.add(key, [rng.randrange(7), 100, 101, 102, 200 + int(key[1:])])
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(2000):
            found = index.query([100, 101, 102])
            if found is not None:
                answers.append(found)
    finally:
        stop.set()
        thread.join()
    assert not errors and answers
    for found in answers:  # every continuation read is one some version of a document had
        assert found.match_length == 3
        assert all(len(s) == 1 and 200 <= s[0] < 250 for s in found.sequences)


def test_left_context_stitches_the_text_before_the_cursor_to_the_completion():
    P, S, M = 90, 91, 92
    psm = PromptMarkers(prefix=P, suffix=S, middle=M)
    assert left_context([1, P, 2, 3, S, 4, 5, M, 6, 7], psm, 32) == [2, 3, 6, 7]
    assert left_context([1, P, 2, 3, S, 4, 5, M], psm, 3) == [2, 3]
    assert left_context([S, 4, 5, P, 2, 3, M, 6], psm, 32) == [2, 3, 6]  # SPM
    assert left_context([S, 4, P, 2, 3], PromptMarkers(prefix=P, suffix=S), 32) == [2, 3]  # SPM without a middle
    assert left_context([1, 2, 3], psm, 2) == [2, 3] and left_context([1, 2, 3], None, 5) == [1, 2, 3]


def test_repo_drafter_drafts_the_continuation_of_the_text_before_the_cursor():
    P, S, M = 90, 91, 92
    index = RepoIndex()
    index.add("/w/other.py", [1, 2, 3, 4, 5, 6, 7])
    index.add("/w/this.py", [1, 2, 3, 40, 50])
    drafter = RepoDrafter(index, markers=PromptMarkers(P, S, M), length=DraftLength(k_max=8, adaptive=False))
    prompt = [P, 1, 2, S, 9, 9, M]
    draft = drafter.propose(prompt + [3], 4)
    assert draft.source == "repo" and draft.probs is None
    assert draft.tokens in ([4, 5, 6, 7], [40, 50])
    this = RequestContext(document="/w/this.py")  # the request's: the document being completed
    assert drafter.propose(prompt + [3], 4, request=this).tokens == [4, 5, 6, 7]
    assert drafter.propose(prompt + [3, 4], 2, request=this).tokens == [5, 6]
    assert drafter.propose([P, 8, S, M], 4, request=this).tokens == []  # one token is below min_match
    tree = drafter.propose_tree(prompt + [3], 4, nodes=8, request=this)
    assert tree.tokens == [4, 5, 6, 7]
