"""The repository index: every document's token ids, searchable for the longest match of a context.

Documents (a workspace's files, the completions the user accepted) are added, replaced and
removed by key while the decode thread queries. Writers take one lock and publish a new tuple
of immutable segments (suffix_segment.py); a query reads whichever tuple is current and never
waits for a writer. New documents go into a new small segment; a removed or replaced one is
masked dead in its segment. Small segments are merged and mostly-dead ones rebuilt, like an
LSM tree, so no update rebuilds the whole index, and a query visits a bounded number of them.

Stamped: token ids mean something only under the tokenizer that made them. `restamp()` empties the
index for another tokenizer's ids in the same step that names it, writers say whose ids they add
(another tokenizer's are refused), and a query that says whose ids it asks with finds nothing in an
index stamped for another: no draft ever mixes two vocabularies, even while a rebuild runs.

Bounded: at most `max_tokens` token ids are stored, dead ones included (they are compacted
away first when room is needed); evictable documents (accepted completions) give way oldest
first; anything else that does not fit is refused and counted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from specdec.engine.drafters.suffix_segment import SEPARATOR, Segment
from specdec.engine.limits import MAX_DRAFT, REPO_INDEX_MAX_TOKENS, REPO_INDEX_TOKENS_LIMIT

DEFAULT_MAX_TOKENS = REPO_INDEX_MAX_TOKENS  # token ids stored at most (bytes per token: docs/benchmarks.md)
MAX_TOKENS_LIMIT = REPO_INDEX_TOKENS_LIMIT
MAX_DEPTH = 32  # longest match looked for, in tokens
MAX_SEGMENTS = 8  # more than this and the two smallest are merged
SEGMENT_TOKENS = 4_000_000  # merges stop at this size: bounds a merge's time and its transient memory
MAX_CANDIDATES = 256  # occurrences read for one query (more are sampled evenly)


def vocabulary_of(tokenizer) -> tuple:
    """What names a tokenizer's ids for the index's stamp: its name or path, its size and its kind."""
    return (getattr(tokenizer, "name_or_path", ""), len(tokenizer), type(tokenizer).__name__)


@dataclass
class IndexStats:
    documents: int = 0
    tokens: int = 0  # live token ids
    stored_tokens: int = 0  # live + dead (not yet compacted)
    segments: int = 0
    bytes: int = 0  # numpy arrays of every segment
    max_tokens: int = 0
    refused: int = 0  # documents that did not fit under max_tokens
    evicted: int = 0  # evictable documents dropped to make room
    merges: int = 0
    merge_seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Located:
    """One document where a context's end occurs: its key, its token ids [n], the offset in them just after the
    match (where the continuation starts), the match's length and how many occurrences it has there."""

    key: str
    tokens: np.ndarray
    offset: int
    match_length: int
    occurrences: int


@dataclass(frozen=True)
class Continuations:
    """What followed the longest match: distinct continuations and how often each occurred.

    sequences: distinct token sequences (each <= horizon tokens; shorter where a document ended).
    counts:    occurrences of each, same order.
    """

    match_length: int
    sequences: tuple[tuple[int, ...], ...]
    counts: tuple[int, ...]

    @classmethod
    def from_rows(cls, match_length: int, rows: np.ndarray) -> Continuations:
        """rows: [occurrences, horizon] int32, SEPARATOR-padded after a document's end."""
        counted = Counter(map(tuple, rows.tolist())).most_common()
        sequences = tuple(row[: row.index(SEPARATOR)] if SEPARATOR in row else row for row, _ in counted)
        return cls(match_length, sequences, tuple(n for _, n in counted))

    @property
    def occurrences(self) -> int:
        return sum(self.counts)

    def _next(self, members: list[int], depth: int) -> tuple[dict[int, list[int]], int]:
        """Among sequences `members` (which share their first `depth` tokens): next token -> members, and their
        total count (sequences that end here count: the document ended, which is evidence against any token)."""
        branches: dict[int, list[int]] = {}
        for i in members:
            if len(self.sequences[i]) > depth:
                branches.setdefault(self.sequences[i][depth], []).append(i)
        return branches, sum(self.counts[i] for i in members)

    def chain(self, k: int, min_probability: float = 0.0) -> tuple[list[int], list[float]]:
        """The most frequent continuation, token by token, while its frequency among the occurrences that
        agree so far times the same for every token before it stays >= min_probability.
        Returns (tokens, conditional frequency of each)."""
        members, tokens, freqs, path = list(range(len(self.sequences))), [], [], 1.0
        for depth in range(k):
            branches, total = self._next(members, depth)
            if not branches:
                break
            token, chosen = max(branches.items(), key=lambda kv: sum(self.counts[i] for i in kv[1]))
            p = sum(self.counts[i] for i in chosen) / total
            if path * p < min_probability:
                break
            path *= p
            tokens.append(token)
            freqs.append(p)
            members = chosen
        return tokens, freqs

    def tree(self, k: int, nodes: int, min_probability: float = 0.0):
        """The trie of the continuations, best-first by path frequency, <= nodes nodes and <= k deep.

        Children are deterministic (one-hot q), listed most frequent first. Returns a TokenTree, or
        None when nothing reaches min_probability.
        """
        import heapq

        from specdec.engine.tree import DETERMINISTIC, ROOT, TokenTree

        tokens: list[int] = []
        parents: list[int] = []
        tie = 0
        frontier: list = []

        def expand(node: int, members: list[int], depth: int, path: float) -> None:
            nonlocal tie
            if depth >= k:
                return
            branches, total = self._next(members, depth)
            for token, chosen in branches.items():
                p = path * sum(self.counts[i] for i in chosen) / total
                if p >= min_probability:
                    tie += 1
                    heapq.heappush(frontier, (-p, tie, node, token, chosen, depth + 1))

        expand(ROOT, list(range(len(self.sequences))), 0, 1.0)
        while frontier and len(tokens) < nodes:
            neg, _, parent, token, chosen, depth = heapq.heappop(frontier)
            tokens.append(token)
            parents.append(parent)
            expand(len(tokens) - 1, chosen, depth, -neg)
        return TokenTree(tokens, parents, None, DETERMINISTIC) if tokens else None


class RepoIndex:
    """Documents by key, searchable by the longest match of a context's last tokens (<= depth)."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, depth: int = MAX_DEPTH,
                 max_segments: int = MAX_SEGMENTS, segment_tokens: int = SEGMENT_TOKENS):
        if not 0 < max_tokens <= MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens must be in [1, {MAX_TOKENS_LIMIT}], not {max_tokens}")
        self.max_tokens = max_tokens
        self.depth = depth
        self.max_segments = max_segments
        self.segment_tokens = segment_tokens
        self._segments: tuple[Segment, ...] = ()  # the writers' current tuple; replaced whole, never changed
        self.vocabulary = None  # whose token ids the documents are (vocabulary_of); None: unstamped
        self._view: tuple[tuple[Segment, ...], object] = ((), None)  # what queries read: segments and their stamp
        self._ids: dict[str, int] = {}  # key -> id of its live document
        self._keys: dict[int, str] = {}  # id of a live document -> its key (locate's answer)
        self._sizes: dict[str, int] = {}  # key -> tokens of its live document
        self._evictable: OrderedDict[str, None] = OrderedDict()  # oldest first
        self._next_id = 0
        self._write = threading.Lock()
        self._stats = IndexStats(max_tokens=max_tokens)

    # -- writers (one at a time; queries go on meanwhile) ------------------------------------------------
    def add(self, key: str, tokens: Sequence[int] | np.ndarray, evictable: bool = False) -> bool:
        """Add or replace one document; False if it does not fit (its previous version is removed anyway)."""
        return self.add_many([(key, tokens)], evictable)[0]

    def add_many(self, documents: Iterable[tuple[str, Sequence[int] | np.ndarray]],
                 evictable: bool = False, vocabulary=None) -> list[bool]:
        """Add or replace documents as one new segment (a batch is far cheaper than a segment each).

        vocabulary: whose ids these are; refused whole (all False) unless it is the index's stamp.
        Returns, per document, whether it fit; of two with the same key the later one counts.
        """
        documents = [(key, np.asarray(ids, np.int32)) for key, ids in documents]
        latest = {key: i for i, (key, _) in enumerate(documents)}
        with self._write:
            if vocabulary is not None and vocabulary != self.vocabulary:
                return [False] * len(documents)
            segments = self._drop(list(self._segments), set(latest))
            batch, fitted, pending = [], [], 0
            for i, (key, ids) in enumerate(documents):
                if latest[key] != i or len(ids) == 0:  # superseded later in the batch, or empty: nothing to store
                    fitted.append(True)
                    continue
                if pending + len(ids) > self.max_tokens - self._stored(segments):
                    segments = self._make_room(segments, pending + len(ids))
                if pending + len(ids) > self.max_tokens - self._stored(segments):
                    self._stats.refused += 1
                    fitted.append(False)
                    continue
                pending += len(ids)
                self._next_id += 1
                self._ids[key] = self._next_id
                self._keys[self._next_id] = key
                self._sizes[key] = len(ids)
                if evictable:
                    self._evictable[key] = None
                batch.append((self._next_id, ids))
                fitted.append(True)
            if batch:
                segments.append(Segment.build(batch, self.depth))
            self._publish(self._merge(segments))
            return [fitted[latest[key]] for key, _ in documents]

    def remove(self, key: str) -> bool:
        return self.remove_many([key]) == 1

    def remove_many(self, keys: Iterable[str]) -> int:
        """Remove documents by key; returns how many there were."""
        with self._write:
            present = {key for key in keys if key in self._ids}
            if present:
                self._publish(self._merge(self._drop(list(self._segments), present)))
            return len(present)

    def set_max_tokens(self, max_tokens: int) -> bool:
        """A new cap. False if what is stored exceeds it: then everything is dropped (the caller re-adds)."""
        if not 0 < max_tokens <= MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens must be in [1, {MAX_TOKENS_LIMIT}], not {max_tokens}")
        with self._write:
            self.max_tokens = max_tokens
            if self._stored(self._segments) <= max_tokens:
                return True
        self.clear()
        return False

    def restamp(self, vocabulary) -> bool:
        """The index is for this tokenizer's ids from now on: emptied (in the same published step) if it was
        stamped otherwise. Returns whether it was."""
        with self._write:
            if vocabulary == self.vocabulary:
                return False
            self.vocabulary = vocabulary
            self._ids.clear()
            self._keys.clear()
            self._sizes.clear()
            self._evictable.clear()
            self._publish([])
            return True

    def clear(self) -> None:
        with self._write:
            self._ids.clear()
            self._keys.clear()
            self._sizes.clear()
            self._evictable.clear()
            self._publish([])

    def _drop(self, segments: list[Segment], keys: set[str]) -> list[Segment]:
        ids = {self._ids.pop(key) for key in keys if key in self._ids}
        for doc_id in ids:
            self._keys.pop(doc_id, None)
        for key in keys:
            self._evictable.pop(key, None)
            self._sizes.pop(key, None)
        if not ids:
            return segments
        return [seg.without(ids) if np.isin(seg.doc_ids, list(ids)).any() else seg for seg in segments]

    def _make_room(self, segments: list[Segment], need: int) -> list[Segment]:
        """Evict evictable documents oldest first until `need` more tokens would fit, then compact dead tokens."""
        room = self.max_tokens - self._stored(segments)
        freed = sum(seg.stored_tokens - seg.live_tokens for seg in segments)
        evict = []
        while need > room + freed and self._evictable:
            key, _ = self._evictable.popitem(last=False)
            evict.append(key)
            freed += self._sizes.get(key, 0)
        if evict:
            segments = self._drop(segments, set(evict))
            self._stats.evicted += len(evict)
        if freed and need <= room + freed:
            compacted = [self._rebuild([seg]) if seg.live_tokens < seg.stored_tokens else seg for seg in segments]
            segments = [seg for seg in compacted if seg is not None]
        return segments

    def _merge(self, segments: list[Segment]) -> list[Segment]:
        """Rebuild mostly-dead segments, and merge the two smallest while they are of a size (the smaller at least
        half the other: a binary counter, so O(log) segments and O(n log n) merge work) or there are too many;
        never past segment_tokens, which bounds one merge's time and transient memory."""
        segments = [self._rebuild([s]) if 2 * s.live_tokens < s.stored_tokens else s for s in segments]
        segments = [s for s in segments if s is not None]
        while len(segments) > 1:
            a, b = sorted(range(len(segments)), key=lambda i: segments[i].live_tokens)[:2]
            small, other = segments[a].live_tokens, segments[b].live_tokens
            if small + other > self.segment_tokens or (2 * small < other and len(segments) <= self.max_segments):
                break
            merged = self._rebuild([segments[a], segments[b]])
            segments = [s for i, s in enumerate(segments) if i not in (a, b)] + ([merged] if merged else [])
        return segments

    def _rebuild(self, parts: list[Segment]) -> Segment | None:
        started = time.perf_counter()
        documents = [doc for seg in parts for doc in seg.documents()]
        if not documents:
            return None
        segment = Segment.build(documents, self.depth)
        self._stats.merges += 1
        self._stats.merge_seconds += time.perf_counter() - started
        return segment

    @staticmethod
    def _stored(segments: Sequence[Segment]) -> int:
        return sum(seg.stored_tokens for seg in segments)

    def _publish(self, segments: list[Segment]) -> None:
        self._segments = tuple(segments)
        self._view = (self._segments, self.vocabulary)  # one assignment: a query never sees a mix

    # -- readers (any thread, never blocked by a writer) -------------------------------------------------
    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def keys(self) -> list[str]:
        return list(self._ids)

    def query(self, context: Sequence[int], exclude: str | None = None, min_match: int = 1,
              limit: int = MAX_CANDIDATES, horizon: int = MAX_DRAFT, vocabulary=None) -> Continuations | None:
        """What followed the longest match (>= min_match tokens) of the context's end, outside document `exclude`.

        Occurrences in dead or excluded documents do not count: when every occurrence of the
        longest match is in one, the next shorter match is used. vocabulary: whose ids the context is;
        nothing is found in an index stamped for another tokenizer.
        """
        for length, found in self._matches(context, exclude, min_match, limit, vocabulary):
            rows = [seg.continuations(positions, horizon) for seg, positions in found]
            return Continuations.from_rows(length, np.concatenate(rows))
        return None

    def locate(self, context: Sequence[int], exclude: str | None = None, min_match: int = 1, documents: int = 4,
               limit: int = MAX_CANDIDATES, vocabulary=None) -> list[Located]:
        """Where the context's end occurs outside document `exclude`: up to `documents` documents, one Located
        each (its first occurrence), those of the longest match first, then of shorter ones (>= min_match), and
        within one length the documents with more occurrences first. Same rules as `query` (live documents
        only, nothing in another tokenizer's index): these are the places the repo drafter drafts from."""
        located: dict[str, Located] = {}
        for length, found in self._matches(context, exclude, min_match, limit, vocabulary):
            counts: dict[str, list] = {}
            for seg, positions in found:
                slots = np.searchsorted(seg.starts, positions, side="right") - 1
                lengths = seg.lengths()
                for position, slot in zip(positions.tolist(), slots.tolist()):
                    key = self._keys.get(int(seg.doc_ids[slot]))
                    if key is None or key in located:
                        continue
                    start, size = int(seg.starts[slot]), int(lengths[slot])
                    entry = counts.setdefault(key, [0, seg.tokens[start: start + size], position - start])
                    entry[0] += 1
            for key, (count, tokens, offset) in sorted(counts.items(), key=lambda item: -item[1][0]):
                located[key] = Located(key, tokens, offset, length, count)
                if len(located) == documents:
                    return list(located.values())
        return list(located.values())

    def _matches(self, context: Sequence[int], exclude: str | None, min_match: int, limit: int, vocabulary):
        """(match length, [(segment, continuation positions)]) for each length with live occurrences, longest
        first: `limit` occurrences in all per length, shared by the segments' counts."""
        segments, stamp = self._view
        if vocabulary is not None and stamp is not None and vocabulary != stamp:
            return
        backwards = list(context[-self.depth :])[::-1]
        if len(backwards) < max(1, min_match):
            return
        excluded = self._ids.get(exclude, -1) if exclude is not None else -1
        matches = [(seg, seg.match(backwards)) for seg in segments]
        longest = max((len(ranges) for _, ranges in matches), default=0)
        for length in range(longest, max(1, min_match) - 1, -1):
            spans = [(seg, ranges[length - 1]) for seg, ranges in matches if len(ranges) >= length]
            total = sum(hi - lo for _, (lo, hi) in spans)
            found = []
            for seg, (lo, hi) in spans:
                positions = seg.positions(lo, hi, max(1, -(-limit * (hi - lo) // total)), excluded)
                if len(positions):
                    found.append((seg, positions))
            if found:
                yield length, found

    def stats(self) -> IndexStats:
        segments = self._segments
        s = self._stats
        return IndexStats(documents=len(self._ids), tokens=sum(seg.live_tokens for seg in segments),
                          stored_tokens=self._stored(segments), segments=len(segments),
                          bytes=sum(seg.nbytes for seg in segments), max_tokens=self.max_tokens, refused=s.refused,
                          evicted=s.evicted, merges=s.merges, merge_seconds=s.merge_seconds)
