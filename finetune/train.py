"""LoRA training of the draft on a repository's code, toward what the target would predict.

Objectives: `lm` (cross-entropy on the code), `distill` (DistillSpec: KL from the target's
next-token distribution to the draft's on the same text: acceptance is what it raises),
or `mixed`. Budgets in steps, minutes and tokens. A checkpoint (adapter, optimizer, step,
RNG) is written atomically every few steps and on Ctrl-C, so a run resumes where it
stopped and nothing half-written is ever left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specdec.errors import SpecdecError

OBJECTIVES = ("distill", "lm", "mixed")
DEFAULT_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class TrainConfig:
    objective: str = "distill"
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = DEFAULT_MODULES
    learning_rate: float = 3e-4
    batch_size: int = 2
    seq_len: int = 384
    max_steps: int = 200
    max_minutes: float = 30.0
    max_tokens: int = 0  # 0: no token budget
    seed: int = 0
    checkpoint_every: int = 10
    precision: str = "auto"  # auto: bf16 autocast on CUDA and on CPUs with native bf16, else fp32

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise SpecdecError(f"objective must be one of {', '.join(OBJECTIVES)}, not {self.objective!r}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise SpecdecError(f"precision must be auto, bf16 or fp32, not {self.precision!r}")
        if self.rank < 1 or self.alpha < 1 or self.max_steps < 1 or self.batch_size < 1:
            raise SpecdecError("rank, alpha, max-steps and batch size must be >= 1")

    def fingerprint(self) -> str:
        """Settings that must match for a checkpoint to be resumed (budgets may change)."""
        keep = {k: v for k, v in asdict(self).items() if k not in ("max_steps", "max_minutes", "max_tokens",
                                                                    "checkpoint_every")}
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=list).encode()).hexdigest()[:16]


@dataclass
class TrainResult:
    steps: int
    tokens: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    stopped_by: str = ""  # steps | minutes | tokens | interrupted
    resumed_from: int = 0


def collate(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def loss_fn(draft_logits, ids, mask, target_logits, objective: str) -> torch.Tensor:
    """Mean over real next-token positions of CE (lm), KL(p_target || q_draft) (distill), or both."""
    logits = draft_logits[:, :-1].float()
    valid = mask[:, 1:].bool()
    losses = []
    if objective in ("lm", "mixed"):
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        losses.append(ce[valid].mean())
    if objective in ("distill", "mixed"):
        log_q = logits.log_softmax(-1)
        log_p = target_logits[:, :-1].float().log_softmax(-1)
        vocab = min(log_p.shape[-1], log_q.shape[-1])
        log_p, log_q = log_p[..., :vocab], log_q[..., :vocab]
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        losses.append(kl[valid].mean())
    return sum(losses) / len(losses)


def _mixed_precision(choice: str) -> str:
    if choice == "fp32":
        return "no"
    if choice == "bf16":
        return "bf16"
    if torch.cuda.is_available():
        return "bf16"
    try:  # CPUs with AVX512-BF16/AMX run bf16 matmuls natively: about twice the fp32 speed
        return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "no"
    except (AttributeError, RuntimeError):
        return "no"


def _save_checkpoint(model, optimizer, state: dict, workdir: Path) -> None:
    """adapter + optimizer + state into workdir/checkpoint, replacing the old one atomically."""
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / ".checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}, tmp / "trainer.pt")
    (tmp / "state.json").write_text(json.dumps(state))
    final, old = workdir / "checkpoint", workdir / ".checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint_state(workdir: Path, config: TrainConfig) -> dict | None:
    state_file = workdir / "checkpoint" / "state.json"
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    return state if state.get("fingerprint") == config.fingerprint() else None


def train(draft, target, tokenizer, samples: list[list[int]], config: TrainConfig, workdir: Path,
          progress: bool = True, on_step=None) -> tuple[object, TrainResult]:
    """Returns (peft model with the adapter, result). `target` may be None for the `lm` objective."""
    from accelerate import Accelerator
    from peft import LoraConfig, PeftModel, get_peft_model
    from tqdm import tqdm

    if not samples:
        raise SpecdecError("no training samples: the repository has no usable source files")
    if config.objective != "lm" and target is None:
        raise SpecdecError(f"objective {config.objective} needs the target model")
    torch.manual_seed(config.seed)
    state = load_checkpoint_state(workdir, config)
    if state:
        model = PeftModel.from_pretrained(draft, workdir / "checkpoint", is_trainable=True)
    else:
        model = get_peft_model(draft, LoraConfig(r=config.rank, lora_alpha=config.alpha,
                                                 lora_dropout=config.dropout,
                                                 target_modules=list(config.target_modules), task_type="CAUSAL_LM"))
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=_mixed_precision(config.precision))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    if state:
        saved = torch.load(workdir / "checkpoint" / "trainer.pt", weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
    model, optimizer = accelerator.prepare(model, optimizer)
    if target is not None:
        target.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    step, tokens = (state["step"], state["tokens"]) if state else (0, 0)
    elapsed = state["seconds"] if state else 0.0
    result = TrainResult(step, tokens, elapsed, resumed_from=step)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(config.seed)).tolist()
    started = time.monotonic() - elapsed

    def checkpoint():
        _save_checkpoint(accelerator.unwrap_model(model), optimizer,
                         {"step": step, "tokens": tokens, "seconds": time.monotonic() - started,
                          "fingerprint": config.fingerprint(), "losses": result.losses[-50:]}, workdir)

    bar = tqdm(total=config.max_steps, initial=step, desc="finetune", unit="step", disable=not progress)
    model.train()
    try:
        while True:
            minutes = (time.monotonic() - started) / 60
            if step >= config.max_steps:
                result.stopped_by = "steps"
                break
            if minutes >= config.max_minutes:
                result.stopped_by = "minutes"
                break
            if config.max_tokens and tokens >= config.max_tokens:
                result.stopped_by = "tokens"
                break
            picks = [samples[order[(step * config.batch_size + i) % len(order)]] for i in range(config.batch_size)]
            ids, mask = collate(picks, pad_id)
            ids, mask = ids.to(accelerator.device), mask.to(accelerator.device)
            target_logits = None
            if target is not None and config.objective != "lm":
                with torch.no_grad():
                    target_logits = target(input_ids=ids, attention_mask=mask).logits
            with accelerator.autocast():
                logits = model(input_ids=ids, attention_mask=mask).logits
                loss = loss_fn(logits, ids, mask, target_logits, config.objective)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            tokens += int(mask.sum())
            result.losses.append(float(loss))
            spent = max(1e-6, time.monotonic() - started)
            per_step = spent / max(1, step - result.resumed_from)
            left = min((config.max_steps - step) * per_step, config.max_minutes * 60 - spent)
            if config.max_tokens:
                left = min(left, (config.max_tokens - tokens) / max(1e-6, tokens / spent))
            bar.set_postfix(loss=f"{float(loss):.3f}", tok_s=f"{tokens / spent:.0f}",
                            eta=f"{int(max(0, left)) // 60}:{int(max(0, left)) % 60:02d}")
            bar.update()
            if on_step:
                on_step(step, float(loss))
            if step % config.checkpoint_every == 0:
                checkpoint()
    except KeyboardInterrupt:
        result.stopped_by = "interrupted"
        checkpoint()
        bar.close()
        raise
    bar.close()
    checkpoint()
    model.eval()
    result.steps, result.tokens, result.seconds = step, tokens, time.monotonic() - started
    return accelerator.unwrap_model(model), result
