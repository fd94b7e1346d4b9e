"""The draft's output layer over a shortlist of the vocabulary: the ids it can propose.

Why: the 0.5B draft's output layer (151,936 x 896) is a fifth of the bytes its decode step reads, and a draft
only proposes; the target still scores every id. So the draft scores the first SHORTLIST_TILES tiles of 16 ids
(32,768 ids: a byte-level BPE numbers its tokens in merge order, so these are its most frequent pieces; they
held 93-97% of the tokens the target wrote in the bench's holes and HumanEval), the tiles of every id its
context holds (a file's own identifiers, which are most of the rest) and those of the tokenizer's special ids
(end of text, the FIM stops). An id outside scores -inf: the draft's q is 0 there, so greedy argmax and the
acceptance rule (min(1, p/q), the residual max(0, p - q)) stay exact; the target's output does not change, only
how much of it was drafted (FR-Spec, Zhao et al. 2025, with a context part added).

The packed W4A8/W8A8 layouts keep a tile's 16 rows together ([N/16 tiles][K/32 groups] blocks), so the first
tiles are a view of the full matrix and the context's tiles are copied out once each. The static part is shared
by every session over the model; each NativeLM keeps a ContextHead of its own.
"""

from __future__ import annotations

import os

import torch

from specdec.models import w4a8
from specdec.native.layers import Linear

SHORTLIST_TILES = 2048  # tiles of w4a8.TILE_N ids scored always: ids 0 .. 32,767
MIN_VOCABULARY = 4 * SHORTLIST_TILES * w4a8.TILE_N  # below this the full layer is cheap enough: no shortlist


def enabled() -> bool:
    """SPECDEC_DRAFT_SHORTLIST=0 gives a draft its whole output layer (the benchmark's A/B switch)."""
    return os.environ.get("SPECDEC_DRAFT_SHORTLIST", "1") != "0"


class Shortlist:
    """The shared part: the first `tiles` tiles of `output` (a view) and the tiles of the `always` ids."""

    def __init__(self, output: Linear, always: list[int], tiles: int = SHORTLIST_TILES):
        if not supports(output):
            raise ValueError(f"a shortlist needs a packed W4A8/W8A8 output layer, not {output.kernel}")
        self.output, self.vocab = output, output.out_features
        self.tiles = min(tiles, self.vocab // w4a8.TILE_N)
        self.tile_bytes = output.packed.numel() // (self.vocab // w4a8.TILE_N)
        ids = self.tiles * w4a8.TILE_N  # the first tiles: a view of the full layer's leading bytes and columns
        self.first = Linear(output.kernel, ids, output.in_features,
                            packed=output.packed[: self.tiles * self.tile_bytes],
                            scale=None if output.scale is None else output.scale[:ids],
                            bias=None if output.bias is None else output.bias[:ids])
        self.always = sorted({i // w4a8.TILE_N for i in always if 0 <= i < self.vocab} - set(range(self.tiles)))

    def for_context(self) -> ContextHead:
        return ContextHead(self)


class ContextHead:
    """One cache's output layer: the shortlist's tiles, then its own context's (added as its tokens arrive)."""

    def __init__(self, shortlist: Shortlist):
        self.shortlist = shortlist
        self.extra_tiles: list[int] = []
        self._covered = set(shortlist.always)
        self.extra: Linear | None = None
        self.extra_ids = torch.empty(0, dtype=torch.long)
        self._build()  # the always tiles

    def cover(self, ids) -> None:
        """Make every id in `ids` one the draft can propose (tiles past the first ones are copied out once)."""
        s = self.shortlist
        new = {i // w4a8.TILE_N for i in ids if s.tiles * w4a8.TILE_N <= i < s.vocab} - self._covered
        if new:
            self._covered |= new
            self._build()

    def _build(self) -> None:
        s = self.shortlist
        self.extra_tiles = sorted(self._covered)
        if not self.extra_tiles:
            self.extra, self.extra_ids = None, torch.empty(0, dtype=torch.long)
            return
        tiles = torch.tensor(self.extra_tiles)
        packed = s.output.packed.view(s.vocab // w4a8.TILE_N, s.tile_bytes)[tiles].reshape(-1)
        self.extra_ids = (tiles[:, None] * w4a8.TILE_N + torch.arange(w4a8.TILE_N)).reshape(-1)
        scale = None if s.output.scale is None else s.output.scale[self.extra_ids].contiguous()
        self.extra = Linear(s.output.kernel, len(self.extra_ids), s.output.in_features, packed=packed, scale=scale,
                            bias=None if s.output.bias is None else s.output.bias[self.extra_ids])

    def __call__(self, x) -> torch.Tensor:
        """x f32[n, d] or int8 rows -> logits f32[n, vocab], -inf outside the shortlist."""
        s = self.shortlist
        first = s.first(x)
        out = torch.full((first.shape[0], s.vocab), -torch.inf)
        out[:, : first.shape[1]] = first
        if self.extra is not None:
            out[:, self.extra_ids] = self.extra(x)
        return out


def draft_shortlist(output: Linear, tokenizer) -> Shortlist | None:
    """A native draft's shortlist (its tokenizer's special ids always in it), or None where it has none: the
    switch is off, or its output layer is small or not packed."""
    if not enabled() or not supports(output) or output.out_features < MIN_VOCABULARY:
        return None
    return Shortlist(output, sorted(getattr(tokenizer, "added_tokens_decoder", {}) or ()) + list(
        getattr(tokenizer, "all_special_ids", ()) or ()))


def supports(output: Linear) -> bool:
    """Whether `output` can be shortlisted: whole packed tiles (W4A8/W8A8), no adapter."""
    return output.kernel in ("w4a8", "w8a8") and output.out_features % w4a8.TILE_N == 0 and output.lora is None

