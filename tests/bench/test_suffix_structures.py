"""The structures the repository index was measured against answer the same question as the index does."""

import random

import numpy as np

from specdec_bench.suffix_structures import DEPTH, NgramHashIndex, SortedLeftContexts, SuffixAutomaton


def longest_anywhere(stream: list[int], context: list[int], with_continuation: bool) -> int:
    tail = context[-DEPTH:]
    for length in range(len(tail), 0, -1):
        needle = tail[-length:]
        for p in range(length, len(stream) + 1):
            if stream[p - length : p] == needle and (not with_continuation or (p < len(stream) and stream[p] != -1)):
                return length
    return 0


def test_the_three_structures_find_the_longest_match():
    rng = random.Random(3)
    stream = [-1]
    for _ in range(30):
        stream += [rng.randrange(6) for _ in range(rng.randrange(5, 40))] + [-1]
    tokens = np.array(stream, np.int32)
    ours, ngrams, automaton = SortedLeftContexts(tokens), NgramHashIndex(tokens), SuffixAutomaton(tokens)
    for _ in range(60):
        context = [rng.randrange(6) for _ in range(rng.randrange(2, 12))]
        expected = longest_anywhere(stream, context, with_continuation=True)
        length, rows = ours.longest(context, limit=10_000)
        assert length == expected
        assert automaton.longest(context)[0] == longest_anywhere(stream, context, with_continuation=False)
        if expected >= 2:  # the hash index answers from 2- and 4-gram hits
            assert ngrams.longest(context, limit=10_000)[0] == expected
        for row in rows:  # what followed is the stream's own continuation
            assert row[0] != -1
