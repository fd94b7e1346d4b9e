"""The structures measured for the repository index, side by side on one real token stream.

The index (specdec/engine/drafters/suffix_segment.py) sorts positions by their reversed left
context: a suffix array of the reversed text, cut at 32 tokens. Two alternatives are measured
against it here, each complete enough to answer the same question (longest match of a
context's end, <= 32 tokens, and what followed):

- an n-gram hash index with positions: sorted 64-bit hashes of every 4-gram and 2-gram, then
  the candidates of the longest order that hits are extended backward to find the longest match;
- a suffix automaton (pure Python, dict transitions), the structure SuffixDecoding's suffix
  trees are the compact cousin of: linear-time build, a lookup walks the context once.

Only the sorted-array index supports what the server needs besides (documents removed and
replaced without a rebuild, exact frequencies from one range); these numbers show what it
costs or saves in build time, memory and lookup latency. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from specdec.engine.drafters.suffix_segment import SEPARATOR, Segment

DEPTH = 32
HORIZON = 8


class NgramHashIndex:
    """Sorted hashes of the n-grams that end before each position, per order; the longest order with a hit wins."""

    def __init__(self, tokens: np.ndarray, orders: tuple[int, ...] = (4, 2)):
        self.tokens = tokens
        self.orders = orders
        self.levels = {}
        n = len(tokens)
        with np.errstate(over="ignore"):
            for order in orders:
                keys = np.zeros(n, np.uint64)
                clean = np.ones(n, bool)
                for back in range(1, order + 1):
                    shifted = np.zeros(n, np.int64)
                    shifted[back:] = tokens[:-back]
                    keys = keys * np.uint64(1_000_003) + shifted.astype(np.uint64)
                    clean[:back] = False
                    clean[back:] &= tokens[:-back] != SEPARATOR
                clean &= tokens != SEPARATOR
                positions = np.nonzero(clean)[0].astype(np.int32)
                keys = keys[positions]
                order_ = np.argsort(keys)
                self.levels[order] = (keys[order_], positions[order_])

    def nbytes(self) -> int:
        return self.tokens.nbytes + sum(k.nbytes + p.nbytes for k, p in self.levels.values())

    def _key(self, grams: list[int]) -> np.uint64:
        key = 0
        for token in reversed(grams):  # the same order as the build: the newest token first
            key = (key * 1_000_003 + token) % (1 << 64)
        return np.uint64(key)

    def longest(self, context: list[int], limit: int = 256) -> tuple[int, list[list[int]]]:
        for order in self.orders:
            if len(context) < order:
                continue
            keys, positions = self.levels[order]
            key = self._key(context[-order:])
            lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
            if lo == hi:
                continue
            found = positions[lo:hi:max(1, -(-(hi - lo) // limit))].astype(np.int64)
            backwards = np.array(context[::-1][:DEPTH], np.int64)
            grid = np.maximum(found[:, None] - 1 - np.arange(len(backwards)), 0)
            agree = np.cumprod(self.tokens[grid] == backwards, axis=1)
            lengths = agree.sum(axis=1)
            best = int(lengths.max())
            if best < order:  # a hash collision, not a match
                continue
            starts = found[lengths == best]
            rows = self.tokens[np.minimum(starts[:, None] + np.arange(HORIZON), len(self.tokens) - 1)]
            return best, rows.tolist()
        return 0, []


class SuffixAutomaton:
    """The minimal automaton of every substring of the stream; each state keeps the end of its first occurrence."""

    def __init__(self, tokens: np.ndarray):
        self.stream = tokens.tolist()
        self.next: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.length = [0]
        self.end = [-1]
        last = 0
        for position, token in enumerate(self.stream):
            cur = len(self.length)
            self.next.append({})
            self.length.append(self.length[last] + 1)
            self.link.append(0)
            self.end.append(position)
            p = last
            while p != -1 and token not in self.next[p]:
                self.next[p][token] = cur
                p = self.link[p]
            if p != -1:
                q = self.next[p][token]
                if self.length[p] + 1 == self.length[q]:
                    self.link[cur] = q
                else:
                    clone = len(self.length)
                    self.next.append(dict(self.next[q]))
                    self.length.append(self.length[p] + 1)
                    self.link.append(self.link[q])
                    self.end.append(self.end[q])
                    while p != -1 and self.next[p].get(token) == q:
                        self.next[p][token] = clone
                        p = self.link[p]
                    self.link[q] = self.link[cur] = clone
            last = cur

    def longest(self, context: list[int]) -> tuple[int, list[list[int]]]:
        state, length = 0, 0
        for token in context[-DEPTH:]:
            while state and token not in self.next[state]:
                state = self.link[state]
                length = self.length[state]
            if token in self.next[state]:
                state, length = self.next[state][token], length + 1
        if not length:
            return 0, []
        end = self.end[state] + 1
        return length, [self.stream[end : end + HORIZON]]


class SortedLeftContexts:
    """The index's own segment, behind the same two calls."""

    def __init__(self, tokens: np.ndarray):
        cuts = np.nonzero(tokens == SEPARATOR)[0]
        documents = [(i, tokens[a + 1 : b]) for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])) if b > a + 1]
        self.segment = Segment.build(documents, DEPTH)

    def nbytes(self) -> int:
        return self.segment.nbytes

    def longest(self, context: list[int], limit: int = 256) -> tuple[int, list[list[int]]]:
        ranges = self.segment.match(context[::-1][:DEPTH])
        if not ranges:
            return 0, []
        found = self.segment.positions(*ranges[-1], limit)
        return len(ranges), self.segment.continuations(found, HORIZON).tolist()


def measure(name: str, build: Callable[[], object], contexts: list[list[int]]) -> dict:
    """Build time, traced memory (peak during the build, held after it) and lookup latency of one structure."""
    gc.collect()
    tracemalloc.start()
    started = time.perf_counter()
    structure = build()
    seconds = time.perf_counter() - started
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    times, lengths = [], []
    for context in contexts:
        t0 = time.thread_time()  # CPU time: on a shared machine wall time measures the neighbours
        length, _ = structure.longest(context)
        times.append(time.thread_time() - t0)
        lengths.append(length)
    del structure
    times.sort()
    return {"structure": name, "build_seconds": seconds, "held_bytes": held, "peak_bytes": peak,
            "cpu_us_p50": 1e6 * times[len(times) // 2], "cpu_us_p99": 1e6 * times[int(len(times) * 0.99)],
            "mean_match": statistics.mean(lengths)}


def compare(stream: np.ndarray, contexts: list[list[int]], automaton_tokens: int) -> list[dict]:
    """Each structure over `stream` ([n] int32, SEPARATOR between documents); the automaton over its first
    `automaton_tokens` (pure Python: its memory is the point)."""
    rows = [measure("sorted left contexts (ours)", lambda: SortedLeftContexts(stream), contexts),
            measure("n-gram hash index (4, 2)", lambda: NgramHashIndex(stream), contexts)]
    cut = stream[:automaton_tokens]
    rows.append(measure(f"suffix automaton ({len(cut)} tokens)", lambda: SuffixAutomaton(cut), contexts))
    for row in rows:
        row["tokens"] = automaton_tokens if row["structure"].startswith("suffix automaton") else len(stream)
    return rows
