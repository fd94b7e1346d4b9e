"""`specdec bench --finetune REPO --objective distill,lm,mixed,argmax,tvd`: which objective raises acceptance fastest?

The issue's rule is "default to what measures best", so this measures it on the real pair: every objective
trains a fresh LoRA on the same samples under the same time budget (lm needs no target forward, so it gets
more steps per minute, as it would for a user). The score is teacher-forced top-1 agreement between draft
and target on held-out samples -- the per-token chance that a greedy draft token is accepted -- which is
cheap to measure, and the acceptance at k drafted tokens it implies.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdec_finetune.dataset import SampleBuilder
from specdec_finetune.evaluate import as_served
from specdec_finetune.run import MAX_SAMPLES, split_repo, train_config
from specdec_finetune.train import collate, pad_token_id, train
from specdec.prompts import fim


@dataclass
class ObjectiveScore:
    objective: str
    steps: int
    tokens: int
    minutes: float
    agreement_before: float
    agreement_after: float

    @property
    def gain(self) -> float:
        return self.agreement_after - self.agreement_before


def implied_acceptance(agreement: float, k: int = 4) -> float:
    """Accepted / drafted at k when each token is accepted with probability `agreement` until the first miss."""
    return sum(agreement**i for i in range(1, k + 1)) / k


def _argmax(model, ids, mask, batch: int = 2) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(input_ids=ids[i : i + batch], attention_mask=mask[i : i + batch]).logits.argmax(-1)
                          for i in range(0, len(ids), batch)])


def top1_agreement(draft, target_argmax: torch.Tensor, ids, mask) -> float:
    """Share of real next-token positions where the draft's argmax is the target's."""
    draft.eval()
    same = _argmax(draft, ids, mask)[:, :-1] == target_argmax[:, :-1]
    return float(same[mask[:, 1:].bool()].float().mean())


def compare_objectives(args, objectives: list[str], report=print) -> list[ObjectiveScore]:
    from specdec.models.loading import check_same_tokenizer, load

    _, _, split = split_repo(args.repo, args.holdout, args.seed)
    target = load(args.target, args.dtype)
    tokenizer = target.tokenizer
    builder = SampleBuilder(tokenizer, fim.detect(tokenizer), args.seq_len)
    samples = builder.samples(split.train, min(args.max_steps * args.batch_size, MAX_SAMPLES), args.seed)
    heldout = builder.samples(split.heldout, args.heldout_samples, args.seed + 1)
    ids, mask = collate(heldout, pad_token_id(tokenizer))
    target_argmax = _argmax(target.model, ids, mask)
    report(f"{len(samples)} training samples from {len(split.train)} files; {len(heldout)} held-out samples "
           f"({int(mask.sum())} tokens) from {len(split.heldout)} files")
    scores, before = [], None
    for objective in objectives:
        draft = load(args.draft, "fp32")  # a fresh base draft for every objective
        check_same_tokenizer(tokenizer, draft.tokenizer, args.target, args.draft)
        config = train_config(args, objective)
        if before is None:  # the same base every time: score it once
            before = top1_agreement(as_served(draft.model, config.quant), target_argmax, ids, mask)
        with tempfile.TemporaryDirectory() as workdir:  # fresh every time: never resume an earlier comparison
            model, result = train(draft.model, target.model if objective != "lm" else None, tokenizer, samples,
                                  config, Path(workdir), progress=not args.quiet)
        score = ObjectiveScore(objective, result.steps, result.tokens, result.seconds / 60, before,
                               top1_agreement(as_served(model, config.quant), target_argmax, ids, mask))
        report(f"{objective}: {score.steps} steps, agreement {before:.4f} -> {score.agreement_after:.4f}")
        scores.append(score)
    return scores


def print_scores(scores: list[ObjectiveScore], k: int = 4) -> None:
    print(f"\n{'objective':10} {'steps':>6} {'tokens':>8} {'min':>5} {'agree':>7} {'after':>7} {'gain':>7} "
          f"{'accept@' + str(k):>9} {'after':>7}")
    for s in scores:
        print(f"{s.objective:10} {s.steps:6d} {s.tokens:8d} {s.minutes:5.1f} {s.agreement_before:7.4f} "
              f"{s.agreement_after:7.4f} {s.gain:+7.4f} {implied_acceptance(s.agreement_before, k):9.3f} "
              f"{implied_acceptance(s.agreement_after, k):7.3f}")
    best = max(scores, key=lambda s: s.gain)
    print(f"best: {best.objective} ({best.gain:+.4f} top-1 agreement in {best.minutes:.1f} min)")


def score_dicts(scores: list[ObjectiveScore]) -> list[dict]:
    return [{**asdict(s), "gain": s.gain} for s in scores]
