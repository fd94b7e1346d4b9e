"""The native model behind the engine's CachedLM protocol (specdec.engine.cached_lm).

The cache is preallocated: committed tokens in slots 0..c-1 at positions 0..c-1, then the tree region, node i in
slot c + i at position c + depth - 1. A row sees the slots 0 .. prefix-1 and then its `extra` slots: a committed
token all slots up to its own; a tree node the committed tokens, then its ancestors by depth, then itself. A chain
from the committed tokens is contiguous, so it is described exactly as `extend` describes the same tokens;
either way the ops make a row's result a function of the keys it sees, not of where they sit. `keep_path`
copies the kept nodes' K/V down behind the committed tokens; nothing is recomputed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.engine.cached_lm import Cancelled, PrefixSync
from specdec.engine.tree import ROOT
from specdec.errors import SpecdecError
from specdec.native.qwen2 import Qwen2
from specdec.native.shortlist import ContextHead, Shortlist

CAPACITY = 4096  # committed tokens a cache holds by default: a FIM prompt (<= ~1.3k) plus a long completion
TREE_ROOM = 128  # tree slots behind them: a target pass (<= MAX_DRAFT + 1 nodes) or a draft's tree levels
MAX_CONTEXT_TILES = 1024  # a cache's shortlist tiles past the first ones, before it starts again from its context


class NativeModel:
    """The loaded native weights the engine is handed: every Session (and drafter) gets a NativeLM of its own
    over them (engine.cached_lm.as_cached_lm calls new_cached_lm), as each wraps a transformers module in its own
    KVModel."""

    def __init__(self, model: Qwen2, capacity: int = CAPACITY, tree_room: int = TREE_ROOM,
                 cache_dtype: torch.dtype = torch.bfloat16):
        self.model, self.capacity, self.tree_room, self.cache_dtype = model, capacity, tree_room, cache_dtype
        self.device = torch.device("cpu")
        self.dtype = torch.float32  # the activations'
        self.kernels = "native"  # what a pass's cost depends on (the cost curve's key)
        self.shortlist: Shortlist | None = None  # a draft's (specdec.models.loading.load_draft): the ids it scores

    def nbytes(self) -> int:
        """Weight bytes one decoding step reads."""
        return self.model.weights.nbytes()

    def new_cached_lm(self) -> NativeLM:
        return NativeLM(self.model, self.capacity, self.tree_room, self.cache_dtype, self.shortlist)


class NativeLM(PrefixSync):
    def __init__(self, model: Qwen2, capacity: int = CAPACITY, tree_room: int = TREE_ROOM,
                 cache_dtype: torch.dtype = torch.bfloat16, shortlist: Shortlist | None = None):
        capacity = min(capacity, model.config.context_length)
        model.cover(capacity)  # positions < capacity: extend and extend_tree refuse a context past it
        self.model, self.capacity, self.tree_room, self.shortlist = model, capacity, tree_room, shortlist
        # the output layer over the shortlist and this cache's context ids (None: the model's whole output layer)
        self.head: ContextHead | None = None if shortlist is None else shortlist.for_context()
        self._restart_at = MAX_CONTEXT_TILES
        self.device = torch.device("cpu")
        self.cache = model.new_cache(capacity + tree_room, cache_dtype)
        self.tokens: list[int] = []
        self.tree_tokens: list[int] = []
        self.tree_parents: list[int] = []  # parent slot per tree slot; ROOT = a child of the committed tokens
        self.tree_depths: list[int] = []  # 1 for a child of the committed tokens

    def reset(self) -> None:
        self.tokens = []
        self._forget_tree()
        if self.shortlist is not None:
            self.head = self.shortlist.for_context()

    def extend(self, new_tokens: list[int], keep_logits: int | None = None,
               hidden_states: list[torch.Tensor] | None = None,
               between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """Commit new_tokens; returns the logits of the last keep_logits of them (all by default).
        hidden_states, when given, receives each layer's residual stream (for the exactness tests);
        between_layers: Qwen2.forward's (what it raises leaves new_tokens uncommitted)."""
        if self.tree_tokens:
            raise SpecdecError("extend behind an uncommitted tree: keep_path (or truncate) first")
        c, n = len(self.tokens), len(new_tokens)
        if n == 0:
            raise SpecdecError("extend needs at least one token")
        if c + n > self.capacity:
            raise SpecdecError(f"the context needs {c + n} tokens; the native forward's cache holds {self.capacity}")
        slots = torch.arange(c, c + n)
        if self.head is not None:
            self._cover(new_tokens)
        logits = self.model.forward(torch.tensor(new_tokens), slots, slots, slots + 1,
                                    torch.full((n, 1), -1, dtype=torch.long), self.cache,
                                    n if keep_logits is None else keep_logits, hidden_states, self.head,
                                    between_layers)
        self.tokens.extend(new_tokens)
        return logits

    def prefill_chunk(self, tokens: list[int], should_stop: Callable[[], bool] | None) -> torch.Tensor:
        """A prefill chunk that a cancel stops between two layers (a layer of a 64-row chunk: milliseconds to tens
        of them), so a superseded request frees the model at once; nothing of the chunk is committed then."""
        if should_stop is None:
            return self.extend(tokens, keep_logits=1)

        def between_layers() -> None:
            if should_stop():
                raise Cancelled()

        return self.extend(tokens, keep_logits=1, between_layers=between_layers)

    def _cover(self, new_tokens: list[int]) -> None:
        """The shortlist also scores the ids of the context (a file's own identifiers); after a long life across
        files a cache starts again from the context it holds, so its output layer stays small."""
        self.head.cover(new_tokens)
        if len(self.head.extra_tiles) > self._restart_at:
            self.head = self.shortlist.for_context()
            self.head.cover(self.tokens + list(new_tokens))
            self._restart_at = max(MAX_CONTEXT_TILES, 2 * len(self.head.extra_tiles))

    def extend_tree(self, tokens: list[int], parents: list[int],
                    hidden_states: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Append tree nodes in one pass; returns their logits [len(tokens), vocab] (see the module docstring)."""
        c, base, n = len(self.tokens), len(self.tree_tokens), len(tokens)
        if n == 0 or len(parents) != n:
            raise SpecdecError(f"extend_tree needs one parent per node and at least one node ({n} tokens, "
                               f"{len(parents)} parents)")
        if base + n > self.tree_room:
            raise SpecdecError(f"a tree region of {base + n} nodes exceeds the native cache's room of {self.tree_room}")
        all_parents = self.tree_parents + list(parents)
        depths = list(self.tree_depths)
        for i, parent in enumerate(parents):
            if not ROOT <= parent < base + i:
                raise SpecdecError(f"tree node {base + i} has parent {parent}: parents must precede children")
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        if c + max(depths[base:]) > self.capacity:
            raise SpecdecError(f"the context needs {c + max(depths[base:])} tokens; the native forward's cache holds "
                               f"{self.capacity}")
        seen = []  # per new node: the slots it sees after the committed tokens, by depth, itself last
        for slot in range(base, base + n):
            path = []
            while slot != ROOT:
                path.append(c + slot)
                slot = all_parents[slot]
            seen.append(path[::-1])
        prefix, extra = self._describe(c, seen)
        slots = torch.arange(c + base, c + base + n)
        positions = torch.tensor([c + d - 1 for d in depths[base:]])
        logits = self.model.forward(torch.tensor(tokens), positions, slots, prefix, extra, self.cache, n,
                                    hidden_states, self.head)
        self.tree_tokens.extend(tokens)
        self.tree_parents = all_parents
        self.tree_depths = depths
        return logits

    @staticmethod
    def _describe(committed: int, seen: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """prefix i64[n], extra i64[n, E]: each row's visible slots, the run from slot 0 as the prefix."""
        prefix, tails = [], []
        for path in seen:
            p, i = committed, 0
            while i < len(path) and path[i] == p:
                p, i = p + 1, i + 1
            prefix.append(p)
            tails.append(path[i:])
        width = max(1, max(len(t) for t in tails))
        extra = torch.full((len(seen), width), -1, dtype=torch.long)
        for row, tail in enumerate(tails):
            extra[row, : len(tail)] = torch.tensor(tail, dtype=torch.long)
        return torch.tensor(prefix), extra

    def keep_path(self, slots: list[int]) -> None:
        """Commit the tree slots of one root-descending path (in order); drop every other slot."""
        parent = ROOT
        for slot in slots:
            if not 0 <= slot < len(self.tree_tokens) or self.tree_parents[slot] != parent:
                raise SpecdecError(f"keep_path {slots}: slot {slot} does not continue a path from the committed tokens")
            parent = slot
        c = len(self.tokens)
        if c + len(slots) > self.capacity:
            raise SpecdecError(f"the context needs {c + len(slots)} tokens; the native forward's cache holds "
                               f"{self.capacity}")
        if slots != list(range(len(slots))):
            self.cache.move(torch.tensor([c + s for s in slots], dtype=torch.long), c)
        self.tokens.extend(self.tree_tokens[s] for s in slots)
        self._forget_tree()

    def truncate(self, length: int) -> None:
        """Forget every token after the first `length` committed ones (and any tree region); slots are reused."""
        self._forget_tree()
        del self.tokens[max(length, 0) :]

    def check_tree_attention(self) -> None:
        """Tree passes are native: nothing to check."""

    def _forget_tree(self) -> None:
        self.tree_tokens, self.tree_parents, self.tree_depths = [], [], []
