"""How well a draft agrees with the target on held-out code: acceptance and tokens per target pass.

Fill-in-the-middle holes are cut from the held-out files (as the benchmark cuts them)
and completed with draft-model speculation at a fixed draft length, so two drafts
(before and after fine-tuning) are measured on exactly the same work. Greedy by default,
as completions are; a seeded temperature measures what sampled completions would gain.
A deadline cuts a measurement short between holes (spread: each held-out file's first hole before any
file's second); before and after are compared on the holes both measured (aggregate).
"""

from __future__ import annotations

import copy
import time

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


def spread(holes):
    """The holes in turns over their files (every file's first hole, then every file's second...), so a
    measurement its deadline cuts short still covers the held-out files evenly."""
    by_file: dict[tuple[str, str], list] = {}
    for hole in holes:
        by_file.setdefault((hole.source.package, hole.source.member), []).append(hole)
    rounds = max((len(file_holes) for file_holes in by_file.values()), default=0)
    return [file_holes[i] for i in range(rounds) for file_holes in by_file.values() if i < len(file_holes)]


def measure(target, draft, tokenizer, holes, max_new_tokens: int = 32, k: int = 4,
            max_prefix_tokens: int = 512, max_suffix_tokens: int = 128,
            sampling: SamplingConfig = SamplingConfig(),
            draft_suffix_tokens: int | None = DRAFT_SUFFIX_TOKENS, deadline: float | None = None,
            clock=time.monotonic, records: list[dict] | None = None) -> dict:
    """Totals and per-language acceptance / tokens per pass of `draft` speculating for `target`. The draft reads
    the prompt as the server's does (draft_view: the suffix section cut to draft_suffix_tokens; None: all of it).
    deadline: a clock() value no hole starts past if the holes so far say it would end after it (the first hole is
    always measured); `total`'s `holes` says how many were. `total` is there even when no hole is. records: each
    measured hole's counts are appended to it, in order (aggregate() totals any of them again)."""
    view = DraftView(fim.markers(tokenizer, fim.detect(tokenizer)), draft_suffix_tokens)
    session = Session(target, tokenizer, DraftModel(draft, DraftLength(k_max=k, adaptive=False), view=view),
                      strategy="draft")
    completer = Completer.for_session(session, max_prefix_tokens=max_prefix_tokens,
                                      max_suffix_tokens=max_suffix_tokens)
    config = GenerationConfig(max_new_tokens, sampling, max_draft=k)
    measured = []
    started = clock()
    for done, hole in enumerate(holes):
        if deadline is not None and done:
            now = clock()
            if now + (now - started) / done > deadline:
                break
        session.reset()
        stats = completer.complete(hole.prefix, hole.suffix, config).stats
        measured.append({"language": hole.language, "drafted": stats.drafted, "accepted": stats.accepted,
                         "new_tokens": stats.new_tokens, "produced": stats.produced, "passes": stats.target_passes})
    if records is not None:
        records.extend(measured)
    return aggregate(measured)


def aggregate(records: list[dict]) -> dict:
    """measure's totals and per-language figures of some of its holes' records."""
    def zero():
        return {"holes": 0, "drafted": 0, "accepted": 0, "new_tokens": 0, "produced": 0, "passes": 0}

    per: dict[str, dict] = {"total": zero()}
    for record in records:
        for key in (record["language"], "total"):
            agg = per.setdefault(key, zero())
            agg["holes"] += 1
            for name in ("drafted", "accepted", "new_tokens", "produced", "passes"):
                agg[name] += record[name]
    per["total"] = per.pop("total")  # after the languages
    for agg in per.values():
        agg["acceptance_rate"] = agg["accepted"] / agg["drafted"] if agg["drafted"] else 0.0
        agg["tokens_per_pass"] = agg["produced"] / agg["passes"] if agg["passes"] else 0.0  # as GenerationStats
    return per
