"""A causal LM plus the KV cache of exactly the tokens it has seen.

`extend` appends tokens and returns their logits; `sync` makes the cache match a new
context by keeping the longest shared prefix and computing only the rest. Rolling back
rejected drafts and reusing the previous request's prompt are both just `sync`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PREFILL_CHUNK = 64  # tokens per forward while prefilling: a cancel lands within one chunk


class Cancelled(Exception):
    """Raised between prefill chunks when the caller's cancel flag is set."""


class KVModel:
    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.tokens: list[int] = []
        self.cache = None

    def reset(self) -> None:
        self.tokens, self.cache = [], None

    @torch.inference_mode()
    def extend(self, new_tokens: list[int], keep_logits: int | None = None) -> torch.Tensor:
        """Feed new_tokens; returns logits for the last keep_logits of them (all by default)."""
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        keep = len(new_tokens) if keep_logits is None else keep_logits
        ids = torch.tensor([new_tokens], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        self.cache = out.past_key_values
        self.tokens.extend(new_tokens)
        return out.logits[0]

    def truncate(self, length: int) -> None:
        """Forget every token after the first `length`."""
        if length >= len(self.tokens):
            return
        if length == 0:
            self.reset()
            return
        self.cache.crop(length - len(self.tokens))  # transformers 5: a negative count drops tokens
        del self.tokens[length:]

    def shared_prefix(self, context: list[int]) -> int:
        n = min(len(self.tokens), len(context))
        i = 0
        while i < n and self.tokens[i] == context[i]:
            i += 1
        return i

    def sync(self, context: list[int], should_stop: Callable[[], bool] | None = None) -> tuple[torch.Tensor, int, int]:
        """Make the cache hold `context`; returns (next-token logits, tokens reused, tokens computed).

        At least the last token is recomputed, since its logits are what the caller wants.
        """
        if not context:
            raise ValueError("empty context")
        reused = min(self.shared_prefix(context), len(context) - 1)
        self.truncate(reused)
        todo = context[reused:]
        logits = None
        for start in range(0, len(todo), PREFILL_CHUNK):
            if should_stop is not None and start > 0 and should_stop():
                raise Cancelled()
            logits = self.extend(todo[start : start + PREFILL_CHUNK], keep_logits=1)
        return logits[-1], reused, len(todo)
