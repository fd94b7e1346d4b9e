"""How well a draft agrees with the target on held-out code: acceptance and tokens per target pass.

Fill-in-the-middle holes are cut from the held-out files (as the benchmark cuts them)
and completed with draft-model speculation at a fixed draft length, so two drafts
(before and after fine-tuning) are measured on exactly the same work. Greedy by default,
as completions are; a seeded temperature measures what sampled completions would gain.
"""

from __future__ import annotations

import copy

from specdec.engine.draft_length import DraftLength
from specdec.prompts.holes import SourceFile, cut_holes
from specdec.prompts.completion import Completer
from specdec.engine.drafters.draft_model import DraftModel
from specdec.engine.drafters.draft_view import DRAFT_SUFFIX_TOKENS, DraftView
from specdec.prompts import fim
from specdec.engine.session import GenerationConfig, Session
from specdec.engine.sampling import SamplingConfig


def as_served(draft, quant: str):
    """A copy of the draft as the server runs it: its LoRA adapter, if any, folded into the
    full-precision weights, then quantized as `quant` says (specdec.models.lora)."""
    from specdec.models.quantize import quantize_draft

    model = copy.deepcopy(draft)
    if hasattr(model, "merge_and_unload"):  # a peft model
        model = model.merge_and_unload()
    return quantize_draft(model, quant)


def holes_for(files, holes_per_file: int = 3, seed: int = 0):
    holes = []
    for f in files:
        source = SourceFile(f.language, "local", f"repo:{f.path}", f.path, "", "")
        holes.extend(cut_holes(source, f.text, holes_per_file, seed))
    return holes


def measure(target, draft, tokenizer, holes, max_new_tokens: int = 32, k: int = 4,
            max_prefix_tokens: int = 512, max_suffix_tokens: int = 128,
            sampling: SamplingConfig = SamplingConfig(),
            draft_suffix_tokens: int | None = DRAFT_SUFFIX_TOKENS) -> dict:
    """Totals and per-language acceptance / tokens per pass of `draft` speculating for `target`. The draft reads
    the prompt as the server's does (draft_view: the suffix section cut to draft_suffix_tokens; None: all of it)."""
    view = DraftView(fim.markers(tokenizer, fim.detect(tokenizer)), draft_suffix_tokens)
    session = Session(target, tokenizer, DraftModel(draft, DraftLength(k_max=k, adaptive=False), view=view),
                      strategy="draft")
    completer = Completer.for_session(session, max_prefix_tokens=max_prefix_tokens,
                                      max_suffix_tokens=max_suffix_tokens)
    config = GenerationConfig(max_new_tokens, sampling, max_draft=k)
    per: dict[str, dict] = {}
    for hole in holes:
        session.reset()
        stats = completer.complete(hole.prefix, hole.suffix, config).stats
        for key in (hole.language, "total"):
            agg = per.setdefault(key, {"holes": 0, "drafted": 0, "accepted": 0, "new_tokens": 0, "produced": 0,
                                       "passes": 0})
            agg["holes"] += 1
            agg["drafted"] += stats.drafted
            agg["accepted"] += stats.accepted
            agg["new_tokens"] += stats.new_tokens
            agg["produced"] += stats.produced
            agg["passes"] += stats.target_passes
    for agg in per.values():
        agg["acceptance_rate"] = agg["accepted"] / agg["drafted"] if agg["drafted"] else 0.0
        agg["tokens_per_pass"] = agg["produced"] / agg["passes"] if agg["passes"] else 0.0  # as GenerationStats
    return per
