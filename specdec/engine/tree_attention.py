"""What a tree pass needs from attention and the KV cache: the ancestor mask, and compaction.

A tree's nodes share positions with their cousins, so the causal mask is wrong for them:
each node must see the committed prefix, its own ancestors and itself, nothing else.
transformers 5 passes a 4D mask through untouched (masking_utils returns it as-is) to
eager and sdpa attention; flash-attention kernels take no arbitrary mask, hence the check.
After verification the accepted path's K/V are moved up behind the prefix in place of
the discarded branches, so nothing is recomputed.
"""

from __future__ import annotations

import torch

from specdec.engine.tree import ROOT
from specdec.errors import SpecdecError

MASKABLE_ATTENTION = ("sdpa", "eager")  # the implementations that add a 4D mask as given


def check_tree_attention(model) -> None:
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in MASKABLE_ATTENTION:
        raise SpecdecError(f"tree drafts need attention that takes a custom mask ({' or '.join(MASKABLE_ATTENTION)}); "
                           f"this model uses {implementation}: load it with attn_implementation='sdpa' or draft chains")


def tree_mask(committed: int, parents: list[int], first: int, dtype: torch.dtype,
              device: torch.device | str) -> torch.Tensor:
    """The additive mask [1, 1, new, committed + len(parents)] for tree slots first.. (new of them).

    parents: parent slot of every slot of the tree region (ROOT = -1 for a child of the
    committed tokens). Row i lets slot first + i see the committed tokens, its ancestors and
    itself (0); everything else gets dtype's minimum.
    """
    total = len(parents)
    sees = torch.zeros(total - first, total, dtype=torch.bool)
    for row, slot in enumerate(range(first, total)):
        while slot != ROOT:
            sees[row, slot] = True
            slot = parents[slot]
    mask = torch.full((total - first, committed + total), torch.finfo(dtype).min, dtype=dtype)
    mask[:, :committed] = 0
    mask[:, committed:].masked_fill_(sees, 0)
    return mask[None, None].to(device)


def compact(cache, committed: int, region: int, slots: list[int]) -> None:
    """Keep the committed tokens and tree slots `slots` (in that order) of every layer of a
    DynamicCache holding committed + region tokens; drop the rest of the region.

    A prefix of the region (a chain's accepted drafts) is a plain crop; otherwise only the
    kept slots are copied, behind the prefix, so the cost does not grow with the context.
    """
    length = cache.get_seq_length()
    if length != committed + region:
        raise SpecdecError(f"the KV cache holds {length} tokens, expected {committed} committed + {region} tree")
    kept = len(slots)
    if slots == list(range(kept)):
        cache.crop(kept - region)  # a negative count drops the region's tail; 0 is a no-op
        return
    index = torch.tensor([committed + s for s in slots], dtype=torch.long)
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
            raise SpecdecError(f"tree drafts need a full-attention KV cache; found {type(layer).__name__}")
        for name in ("keys", "values"):
            states = getattr(layer, name)  # [batch, heads, seq, head_dim]
            path = states.index_select(2, index.to(states.device))
            states = states[:, :, : committed + kept]
            states[:, :, committed:] = path
            setattr(layer, name, states)
