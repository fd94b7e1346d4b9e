"""A transformers causal LM plus the KV cache of exactly the tokens it has seen: the engine's
CachedLM (cached_lm.py) on transformers' forward.

`extend` appends tokens and returns their logits; `sync` makes the cache match a new
context by keeping the longest shared prefix and computing only the rest. Rolling back
rejected drafts and reusing the previous request's prompt are both just `sync`.

Trees: behind the committed tokens the cache may hold an uncommitted tree region.
`extend_tree` appends tree nodes in one pass (tree_attention.py builds the mask),
`keep_path` commits one root-descending path and drops the other branches, so a
verified tree costs no recomputation, on the target or on the draft.
"""

from __future__ import annotations

import torch

from specdec.engine.cached_lm import PREFILL_CHUNK, Cancelled, PrefixSync  # noqa: F401 - importable from here too
from specdec.engine.tree import ROOT
from specdec.engine.tree_attention import check_tree_attention, compact, tree_mask
from specdec.errors import SpecdecError


class KVModel(PrefixSync):
    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.tokens: list[int] = []  # committed: the linear context the cache starts with
        self.cache = None
        self.tree_tokens: list[int] = []  # the uncommitted tree region after the committed tokens, slot by slot
        self.tree_parents: list[int] = []  # parent slot per slot; ROOT = attached to the committed tokens
        self.tree_depths: list[int] = []  # 1 for a child of the committed tokens

    def reset(self) -> None:
        self.tokens, self.cache = [], None
        self._forget_tree()

    @torch.inference_mode()
    def extend(self, new_tokens: list[int], keep_logits: int | None = None) -> torch.Tensor:
        """Feed new_tokens; returns logits for the last keep_logits of them (all by default)."""
        if self.tree_tokens:
            raise SpecdecError("extend behind an uncommitted tree: keep_path (or truncate) first")
        logits = self._forward(new_tokens, len(new_tokens) if keep_logits is None else keep_logits)
        self.tokens.extend(new_tokens)
        return logits

    @torch.inference_mode()
    def extend_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Append tree nodes in one forward pass; returns their logits [len(tokens), vocab].

        parents[i] is a slot of the tree region: an earlier node of this call or of a call
        since the last commit, or ROOT (-1) for a child of the committed tokens. A node sits
        at position len(committed) + depth - 1 and attends to the committed tokens, its
        ancestors and itself. A chain from the committed tokens into an empty region takes
        the plain causal pass, so chain logits are exactly `extend`'s.
        """
        base, n = len(self.tree_tokens), len(tokens)
        if n == 0 or len(parents) != n:
            raise SpecdecError(f"extend_tree needs one parent per node and at least one node ({n} tokens, "
                               f"{len(parents)} parents)")
        depths = list(self.tree_depths)
        for i, parent in enumerate(parents):
            if not ROOT <= parent < base + i:
                raise SpecdecError(f"tree node {base + i} has parent {parent}: parents must precede children")
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        if base == 0 and parents == list(range(ROOT, n - 1)):
            logits = self._forward(tokens, n)
        else:
            check_tree_attention(self.model)
            committed = len(self.tokens)
            positions = torch.tensor([[committed + d - 1 for d in depths[base:]]], device=self.device)
            mask = tree_mask(committed, self.tree_parents + list(parents), base, self._dtype(), self.device)
            logits = self._forward(tokens, n, positions, mask)
        self.tree_tokens.extend(tokens)
        self.tree_parents.extend(parents)
        self.tree_depths = depths
        return logits

    @torch.inference_mode()
    def keep_path(self, slots: list[int]) -> None:
        """Commit the tree slots of one root-descending path (in order) after the committed
        tokens and drop every other slot; [] drops the whole tree region."""
        parent = ROOT
        for slot in slots:
            if not 0 <= slot < len(self.tree_tokens) or self.tree_parents[slot] != parent:
                raise SpecdecError(f"keep_path {slots}: slot {slot} does not continue a path from the committed tokens")
            parent = slot
        if self.tree_tokens:
            compact(self.cache, len(self.tokens), len(self.tree_tokens), slots)
        self.tokens.extend(self.tree_tokens[s] for s in slots)
        self._forget_tree()

    def truncate(self, length: int) -> None:
        """Forget every token after the first `length` committed ones (and any tree region)."""
        self.keep_path([])
        if length >= len(self.tokens):
            return
        if length == 0:
            self.reset()
            return
        self.cache.crop(length - len(self.tokens))  # transformers 5: a negative count drops tokens
        del self.tokens[length:]

    def check_tree_attention(self) -> None:
        check_tree_attention(self.model)

    def _forward(self, tokens: list[int], keep: int, positions: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        extra = {} if mask is None else {"position_ids": positions, "attention_mask": mask}
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=keep, **extra)
        self.cache = out.cache
        return out.logits[0]

    def _dtype(self) -> torch.dtype:
        """The activations' dtype, which an additive mask must share (int8/int4 layers keep float embeddings)."""
        return self.model.get_input_embeddings().weight.dtype

    def _forget_tree(self) -> None:
        self.tree_tokens, self.tree_parents, self.tree_depths = [], [], []
