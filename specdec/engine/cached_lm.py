"""The engine's edge: a causal LM that keeps the KV cache of exactly the tokens it has seen.

`Session` and the drafters drive a target or a draft only through this protocol, so any forward
can serve them: transformers' (`kv.KVModel`) or one of our own (`specdec.native.lm.NativeLM`).
Positions are explicit, as in gpt-fast's `KVCache.update(input_pos, ...)`: the committed tokens
sit at positions 0..len(tokens)-1, and a tree node at len(tokens) + depth - 1.

Trees: behind the committed tokens the cache may hold an uncommitted tree region (`tree_tokens`,
slot by slot). `extend_tree` appends nodes in one pass, each attending to the committed tokens,
its ancestors and itself; `keep_path` commits one root-descending path and drops the rest without
recomputing anything. Rolling back rejected drafts and reusing the previous request's prompt are
both `sync`: keep the longest shared prefix, prefill the rest in chunks a cancel can land between (and, on
a forward that can stop inside a pass, between its layers: `prefill_chunk`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

PREFILL_CHUNK = 64  # tokens per forward while prefilling: a cancel lands within one chunk


class Cancelled(Exception):
    """Raised between prefill chunks when the caller's cancel flag is set."""


@runtime_checkable
class CachedLM(Protocol):
    tokens: list[int]  # committed: the linear context the cache starts with
    tree_tokens: list[int]  # the uncommitted tree region after the committed tokens, slot by slot
    device: torch.device

    def reset(self) -> None:
        """Forget every token (committed and tree)."""

    def extend(self, new_tokens: list[int], keep_logits: int | None = None) -> torch.Tensor:
        """Commit new_tokens after the committed ones (no tree region may be pending); returns the logits
        [keep_logits, vocab] of the last keep_logits of them (all by default)."""

    def extend_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Append tree nodes in one pass; returns their logits [len(tokens), vocab]. parents[i]: a slot of
        the tree region before node i, or ROOT (-1) for a child of the committed tokens. A chain from the
        committed tokens into an empty region gives exactly `extend`'s logits."""

    def keep_path(self, slots: list[int]) -> None:
        """Commit the tree slots of one root-descending path (in order); drop the rest. [] drops the region."""

    def truncate(self, length: int) -> None:
        """Forget every token after the first `length` committed ones, and any tree region."""

    def shared_prefix(self, context: list[int]) -> int:
        """How many leading committed tokens equal context's."""

    def sync(self, context: list[int], should_stop: Callable[[], bool] | None = None
             ) -> tuple[torch.Tensor, int, int]:
        """Make the cache hold `context`; returns (next-token logits [vocab], tokens reused, tokens computed).
        Raises Cancelled between prefill chunks once should_stop() is true."""

    def check_tree_attention(self) -> None:
        """Raise SpecdecError when this forward cannot run tree passes (drafters then draft chains)."""


class PrefixSync:
    """`shared_prefix` and `sync` over a class's own `tokens`, `truncate` and `extend`: one rule for every
    CachedLM of how a new context reuses the cache and how its prefill is chunked and cancelled."""

    tokens: list[int]

    def shared_prefix(self, context: list[int]) -> int:
        n = min(len(self.tokens), len(context))
        i = 0
        while i < n and self.tokens[i] == context[i]:
            i += 1
        return i

    def sync(self, context: list[int], should_stop: Callable[[], bool] | None = None
             ) -> tuple[torch.Tensor, int, int]:
        """At least the last token is recomputed, since its logits are what the caller wants."""
        if not context:
            raise ValueError("empty context")
        reused = min(self.shared_prefix(context), len(context) - 1)
        self.truncate(reused)
        todo = context[reused:]
        logits = None
        for start in range(0, len(todo), PREFILL_CHUNK):
            if should_stop is not None and should_stop():
                raise Cancelled()
            logits = self.prefill_chunk(todo[start : start + PREFILL_CHUNK], should_stop)
        return logits[-1], reused, len(todo)

    def prefill_chunk(self, tokens: list[int], should_stop: Callable[[], bool] | None) -> torch.Tensor:
        """One chunk of a prefill: the last row's logits. A forward that can stop inside a pass overrides it
        (NativeLM: between layers), raising Cancelled with the chunk not committed."""
        return self.extend(tokens, keep_logits=1)


def as_cached_lm(model) -> CachedLM:
    """What Session and the drafters accept, as a CachedLM: a CachedLM as it is; weights that make caches
    (`new_cached_lm()`, a native model) a fresh cache of their own; a transformers causal LM wrapped in KVModel.
    Each session then keeps its own cache over shared weights, whichever forward runs."""
    if isinstance(model, CachedLM):
        return model
    if callable(getattr(model, "new_cached_lm", None)):
        return model.new_cached_lm()
    from specdec.engine.kv import KVModel

    return KVModel(model)
