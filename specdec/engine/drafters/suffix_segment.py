"""One immutable segment of the repository index: documents' token ids and their positions sorted by left context.

A drafter asks "where did the last L tokens of my context occur, and what followed?". Sorting
every position p by its reversed left context (t[p-1], t[p-2], ..., t[p-depth]) makes the
positions that share the last L tokens one contiguous range for every L <= depth: a suffix
array of the reversed text, cut at `depth`. The longest match is found by narrowing that
range one token at a time (two binary searches per token), and everything in the final
range is an occurrence whose continuation starts at p. Measured against an n-gram hash
index and a suffix automaton in docs/benchmarks.md (*Repository index*).

Documents are separated by SEPARATOR, which no context contains, so a match never runs
across a document's start and a continuation stops at its end. A segment is never changed
in place: removing a document makes a new segment sharing the arrays with a new `alive`
mask, so a reader holding the old one is never disturbed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEPARATOR = -1  # between documents; never a token id


def left_context_order(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Positions 0..n-1 sorted by (t[p-1], t[p-2], ..., t[p-depth]), shorter-than-depth contexts first.

    tokens: [n] int32. Prefix doubling: rank by the last m tokens, then by the pair
    (rank_m[p], rank_m[p-m]) for the last 2m, until 2m >= depth. Each round is one argsort
    of an int64 key, so a build is O(n log n log depth) in numpy; peak memory ~28 bytes/token.
    Returns [n] int64.
    """
    n = len(tokens)
    rank = np.empty(n, np.int64)
    if n == 0:
        return rank
    rank[0] = 0  # before the start: lower than any token (the separator is 1)
    rank[1:] = tokens[:-1].astype(np.int64) + 2
    m = 1
    while True:
        key = rank * (int(rank.max()) + 1)
        key[m:] += rank[:-m]
        order = np.argsort(key)
        if 2 * m >= depth:
            return order
        ordered = key[order]
        del key
        fresh = np.empty(n, np.int64)
        fresh[0] = 1
        np.not_equal(ordered[1:], ordered[:-1], out=fresh[1:])
        del ordered
        np.cumsum(fresh, out=fresh)
        rank[order] = fresh
        del fresh, order
        m *= 2


@dataclass(frozen=True)
class Segment:
    """Documents [d] in one token array [n] and their continuation positions [m] in left-context order.

    tokens:  [n] int32: SEP doc_0 SEP doc_1 SEP ... doc_{d-1} SEP.
    order:   [m] int32: positions p with a real token before and at p, sorted by left context.
    starts:  [d] int64: offset of each document's first token in `tokens`.
    doc_ids: [d] int64: the index's id of each document.
    alive:   [d] bool: False once a document was removed or replaced (dropped at the next merge).
    """

    tokens: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    doc_ids: np.ndarray
    alive: np.ndarray
    depth: int

    @classmethod
    def build(cls, documents: Sequence[tuple[int, np.ndarray]], depth: int) -> Segment:
        """documents: (id, [len] int token ids) pairs, each non-empty and without SEPARATOR."""
        lengths = np.array([len(t) for _, t in documents], np.int64)
        starts = np.cumsum(lengths + 1) - lengths  # one separator before each document
        tokens = np.full(int(lengths.sum()) + len(documents) + 1, SEPARATOR, np.int32)
        for start, (_, ids) in zip(starts, documents):
            tokens[start : start + len(ids)] = ids
        order = left_context_order(tokens, depth)
        usable = np.zeros(len(tokens), bool)
        usable[1:] = (tokens[1:] != SEPARATOR) & (tokens[:-1] != SEPARATOR)
        order = order[usable[order]].astype(np.int32)
        ids = np.array([doc_id for doc_id, _ in documents], np.int64)
        return cls(tokens, order, starts, ids, np.ones(len(documents), bool), depth)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.order.nbytes + self.starts.nbytes + self.doc_ids.nbytes + self.alive.nbytes

    def lengths(self) -> np.ndarray:
        """[d] tokens per document."""
        ends = np.append(self.starts[1:] - 1, len(self.tokens) - 1)
        return ends - self.starts

    @property
    def stored_tokens(self) -> int:
        return len(self.tokens) - len(self.starts) - 1

    @property
    def live_tokens(self) -> int:
        return int(self.lengths()[self.alive].sum())

    def holds(self, doc_id: int) -> bool:
        return bool(np.any((self.doc_ids == doc_id) & self.alive))

    def without(self, doc_ids: set[int]) -> Segment:
        """The same segment with these documents dead (arrays shared; only the mask is new)."""
        dead = np.isin(self.doc_ids, np.fromiter(doc_ids, np.int64, len(doc_ids)))
        return Segment(self.tokens, self.order, self.starts, self.doc_ids, self.alive & ~dead, self.depth)

    def documents(self) -> list[tuple[int, np.ndarray]]:
        """The live documents (id, tokens), for a merge."""
        return [(int(self.doc_ids[i]), self.tokens[s : s + n]) for i, (s, n) in
                enumerate(zip(self.starts, self.lengths())) if self.alive[i]]

    def match(self, reversed_context: Sequence[int]) -> list[tuple[int, int]]:
        """Ranges of `order` whose left context equals the context's last 1, 2, ... tokens.

        reversed_context: the context's last tokens, newest first (at most `depth` are used).
        Returns [(lo, hi)] per matched length; its length is the longest match here (dead
        documents included: `positions` filters them). Two binary searches per token while
        the range is wide, a scan once it is a handful.
        """
        tokens, order = memoryview(self.tokens), memoryview(self.order)
        lo, hi = 0, len(self.order)
        ranges = []
        for back, token in enumerate(reversed_context[: self.depth]):
            offset = back + 1
            if hi - lo <= 8:
                while lo < hi and tokens[order[lo] - offset] < token:
                    lo += 1
                end = lo
                while end < hi and tokens[order[end] - offset] == token:
                    end += 1
                if end == lo:
                    break
                hi = end
                ranges.append((lo, hi))
                continue
            a, b = lo, hi
            while a < b:  # first position whose token `offset` back is >= token
                mid = (a + b) >> 1
                if tokens[order[mid] - offset] < token:
                    a = mid + 1
                else:
                    b = mid
            first, b = a, hi
            while a < b:  # first position whose token is > token
                mid = (a + b) >> 1
                if tokens[order[mid] - offset] <= token:
                    a = mid + 1
                else:
                    b = mid
            if first >= a:
                break
            lo, hi = first, a
            ranges.append((lo, hi))
        return ranges

    def positions(self, lo: int, hi: int, limit: int, exclude: int = -1) -> np.ndarray:
        """Continuation starts in order[lo:hi] that belong to live documents other than `exclude`.

        More than `limit` occurrences are sampled evenly, so frequencies stay representative.
        Returns [<= limit] int64.
        """
        step = max(1, -(-(hi - lo) // limit))
        found = self.order[lo:hi:step].astype(np.int64)
        slot = np.searchsorted(self.starts, found, side="right") - 1
        keep = self.alive[slot]
        if exclude >= 0:
            keep &= self.doc_ids[slot] != exclude
        return found[keep]

    def continuations(self, positions: np.ndarray, horizon: int) -> np.ndarray:
        """[len(positions), horizon] int32: the tokens from each position on, SEPARATOR after a document's end."""
        grid = np.minimum(positions[:, None] + np.arange(horizon), len(self.tokens) - 1)
        rows = self.tokens[grid]
        ended = np.maximum.accumulate(rows == SEPARATOR, axis=1)
        rows[ended] = SEPARATOR
        return rows
