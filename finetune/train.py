"""LoRA training of the draft on a repository's code, toward what the target would predict.

Objectives: `lm` (cross-entropy on the code), `distill` (DistillSpec: KL from the target's
next-token distribution to the draft's on the same text: acceptance is what it raises),
or `mixed`. The target is a frozen teacher: a transformers module, or the native forward on
its GGUF's codes (NativeTeacher: what the server verifies with, a sixth of an fp32 copy's memory).
With `quant` the LoRA is fitted over the int8 draft the server runs (specdec.models.int8),
so it corrects that draft, not an fp32 one nobody serves. Budgets in steps, minutes and
tokens, and a deadline (the whole command's: specdec_finetune.budget) past which no step starts.
A checkpoint (adapter, optimizer, step, RNG) is written atomically every few steps
and on Ctrl-C, so a run resumes where it stopped and nothing half-written is ever left behind.
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
from specdec.models.lora import TARGET_MODULES as DEFAULT_MODULES  # every module the server can switch per workspace
from specdec.models.lora import ignore_peft_checkpointing_notice
from specdec.models.choices import DRAFT_QUANT
from specdec.models.quantize import swap_int8
from specdec_finetune.precision import train_precision
from specdec_finetune.choices import OBJECTIVES  # defined torch-free: the CLI lists them


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
    precision: str = "auto"  # auto: bf16 on CUDA and on CPUs with native bf16, else fp32
    vocab: str = "full"  # full: all 151k tokens; repo: only the training samples' tokens (faster steps)
    top_layers: int = 0  # LoRA on the last N decoder layers only (backward stops there); 0: all
    quant: str = "none"  # train the LoRA over the draft quantized as the server runs it (see specdec.models.int8)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise SpecdecError(f"objective must be one of {', '.join(OBJECTIVES)}, not {self.objective!r}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise SpecdecError(f"precision must be auto, bf16 or fp32, not {self.precision!r}")
        if self.vocab not in ("repo", "full"):
            raise SpecdecError(f"vocab must be repo or full, not {self.vocab!r}")
        if self.rank < 1 or self.alpha < 1 or self.max_steps < 1 or self.batch_size < 1:
            raise SpecdecError("rank, alpha, max-steps and batch size must be >= 1")
        if self.quant not in DRAFT_QUANT:
            raise SpecdecError(f"quant must be one of {', '.join(DRAFT_QUANT)}, not {self.quant!r}")
        if self.quant != "none" and self.vocab == "repo":
            raise SpecdecError("an int8 draft's output layer cannot be cut to the repo vocabulary: use --vocab full")
        if self.top_layers < 0:
            raise SpecdecError("top-layers must be >= 0 (0: every layer)")

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


def pad_token_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def collate(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def length_bucketed_batches(samples: list[list[int]], batch_size: int, seed: int, window: int = 32) -> list[list[int]]:
    """Sample indices in batches of similar length, in a seeded random order.

    A batch is padded to its longest sample, and short FIM samples paired with full-length windows
    waste a large share of every step on padding (docs/finetuning.md). Sorting by length inside
    shuffled windows of `window` batches pairs like with like; the batches are shuffled again so
    training still sees the repository in random order. Every sample is used once per pass over
    the pool.
    """
    rng = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(samples), generator=rng).tolist()
    span = batch_size * window
    batches = []
    for start in range(0, len(order), span):
        chunk = sorted(order[start : start + span], key=lambda i: len(samples[i]))
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=rng).tolist()]


class Vocabulary:
    """The token ids the losses are computed over, and a map from full ids to positions in it.

    A repository's code uses a few thousand of the 151k tokens. Restricting both models' output
    layers and the softmaxes to those (plus the special tokens) cuts the largest matmuls and the
    KL from vocab-wide to repo-wide: a quarter of a bf16 training step on the CPU. Mass the target
    puts outside the repository's tokens is dropped from both distributions alike.
    """

    def __init__(self, ids: torch.Tensor):
        self.ids = ids  # sorted, unique
        self.index = torch.full((int(ids.max()) + 1,), -1, dtype=torch.long)
        self.index[ids] = torch.arange(len(ids))

    @classmethod
    def of(cls, samples: list[list[int]], tokenizer, size: int) -> "Vocabulary":
        used = {t for s in samples for t in s} | set(getattr(tokenizer, "all_special_ids", []))
        return cls(torch.tensor(sorted(t for t in used if 0 <= t < size), dtype=torch.long))

    def labels(self, ids: torch.Tensor) -> torch.Tensor:
        return self.index.to(ids.device)[ids]


def output_logits(model, ids, mask, vocab: Vocabulary | None) -> torch.Tensor:
    """Next-token logits, over `vocab` only when given (the decoder runs once, the head on those rows)."""
    if vocab is None:
        return model(input_ids=ids, attention_mask=mask).logits
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    head = model.get_output_embeddings()
    rows = vocab.ids.to(hidden.device)
    logits = hidden @ head.weight[rows].to(hidden.dtype).T
    return logits if head.bias is None else logits + head.bias[rows]


def output_width(model) -> int:
    """The width of a model's output layer: a transformers module's, or a native model's vocabulary."""
    if is_native(model):
        return model.model.config.vocab
    return model.get_output_embeddings().weight.shape[0]


def is_native(model) -> bool:
    """Weights that make caches of their own (specdec.native.lm.NativeModel), not a transformers module."""
    return callable(getattr(model, "new_cached_lm", None))


class NativeTeacher:
    """The target's next-token logits from the native forward (specdec.native: the GGUF's own int4 codes, as the
    server verifies with), for a batch of padded rows: each row prefilled alone into one cache of the samples'
    length (a row's logits do not depend on the rows beside it), zeros at the padding (the losses mask it)."""

    def __init__(self, model, length: int):
        from specdec.native.lm import NativeLM

        self.lm = NativeLM(model.model, capacity=length, tree_room=1, cache_dtype=model.cache_dtype)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, vocab: "Vocabulary | None") -> torch.Tensor:
        out = None
        for i, row in enumerate(ids.tolist()):
            n = int(mask[i].sum())
            if n == 0:
                continue
            self.lm.reset()
            logits = self.lm.extend(row[:n])  # f32[n, V]
            if vocab is not None:
                logits = logits[:, vocab.ids]
            if len(ids) == 1 and n == ids.shape[1]:  # one unpadded row (a CPU step's): the logits as they are
                return logits[None].to(ids.device)
            if out is None:
                out = torch.zeros(*ids.shape, logits.shape[-1])
            out[i, :n] = logits
            del logits
        return out.to(ids.device)


def loss_fn(draft_logits, labels, mask, target_logits, objective: str) -> torch.Tensor:
    """Mean over real next-token positions of CE on the code (lm), KL(p_target || q_draft) (distill),
    both (mixed), CE on the target's own top token (argmax: hard distillation, which is what a
    greedy verifier counts), or the total variation distance (tvd, another of DistillSpec's
    divergences: 1 - TVD is exactly the chance min(1, p/q) acceptance keeps a sampled draft token).
    `labels` are the ids in the logits' own vocabulary (see Vocabulary.labels)."""
    valid = mask[:, 1:].bool()
    sums = loss_sums(draft_logits[:, :-1], labels[:, 1:], valid,
                     None if target_logits is None else target_logits[:, :-1], objective)
    count = valid.sum()
    return sum(part / count for part in sums) / len(sums)


def loss_sums(logits, labels, valid, target_logits, objective: str) -> list[torch.Tensor]:
    """loss_fn's terms (one, or two for mixed), each summed over the valid positions: logits [B, n, V] at the
    positions that predict labels [B, n] (valid [B, n]: not padding), target_logits [B, n, V'] at the same ones."""
    logits = logits.float()
    sums = []
    if objective in ("lm", "mixed"):
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
        sums.append(ce[valid].sum())
    if objective in ("distill", "mixed", "argmax", "tvd"):
        vocab = min(logits.shape[-1], target_logits.shape[-1])
        logits, target = logits[..., :vocab], target_logits[..., :vocab].float()
    if objective in ("distill", "mixed"):
        log_q, log_p = logits.log_softmax(-1), target.log_softmax(-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        sums.append(kl[valid].sum())
    if objective == "argmax":
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target.argmax(-1), reduction="none")
        sums.append(ce[valid].sum())
    if objective == "tvd":
        tvd = 0.5 * (target.softmax(-1) - logits.softmax(-1)).abs().sum(-1)
        sums.append(tvd[valid].sum())
    return sums


LOSS_CHUNK = 32  # positions of a batch whose full-vocabulary logits exist at once in a training step


def step_backward(model, ids, mask, vocab: Vocabulary | None, target_logits, objective: str, autocast,
                  backward, chunk: int = LOSS_CHUNK, count: int | None = None) -> torch.Tensor:
    """One step's loss (loss_fn over output_logits) and its gradients, the output layer and the loss a chunk of
    positions at a time: the decoder runs once; each chunk's logits are made, scored, back-propagated to the hidden
    states and freed; then the hidden states' gradient goes back through the decoder. The same loss and gradients
    (up to the order of the sums), without the several [batch, length, vocabulary] tensors a whole-batch loss
    holds (2 x 384 x 151,936 floats each: 0.47 GB). autocast: a context manager for the forward; backward(loss).
    count: the positions the loss is a mean over (None: these rows'; a batch's when its rows come one call each,
    whose losses and gradients then add up to the batch's)."""
    labels = vocab.labels(ids) if vocab else ids
    valid = mask[:, 1:].bool()
    with autocast():
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    cut = hidden.detach().requires_grad_()
    head = model.get_output_embeddings()
    rows = None if vocab is None else vocab.ids.to(hidden.device)
    count = valid.sum().clamp(min=1) if count is None else max(1, count)
    terms = 2 if objective == "mixed" else 1
    total = torch.zeros((), device=hidden.device)
    for start in range(0, ids.shape[1] - 1, chunk):
        end = min(ids.shape[1] - 1, start + chunk)
        with autocast():
            part = cut[:, start:end]
            if rows is None:
                logits = head(part)
            else:
                logits = part @ head.weight[rows].to(part.dtype).T
                logits = logits if head.bias is None else logits + head.bias[rows]
            sums = loss_sums(logits, labels[:, start + 1 : end + 1], valid[:, start:end],
                             None if target_logits is None else target_logits[:, start:end], objective)
            loss = sum(sums) / (count * terms)
        backward(loss)
        total += loss.detach()
        del logits, sums, loss
    if cut.grad is not None:
        hidden.backward(cut.grad)
    return total


def _bf16_exact(model) -> bool:
    """Whether casting the weights to bf16 and back loses nothing (true for the cached bf16 models)."""
    return all(p.dtype == torch.bfloat16 or torch.equal(p, p.to(torch.bfloat16).to(p.dtype))
               for p in model.parameters())


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


def discard_checkpoint(workdir: Path) -> None:
    """Forget a finished run, so the next `specdec finetune` of the repository trains afresh
    instead of resuming a run whose budget is already spent (and re-registering its adapter)."""
    for name in ("checkpoint", ".checkpoint.tmp", ".checkpoint.old"):
        shutil.rmtree(workdir / name, ignore_errors=True)


def load_checkpoint_state(workdir: Path, config: TrainConfig) -> dict | None:
    state_file = workdir / "checkpoint" / "state.json"
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    return state if state.get("fingerprint") == config.fingerprint() else None


def train(draft, target, tokenizer, samples: list[list[int]], config: TrainConfig, workdir: Path,
          progress: bool = True, on_step=None, device: str | None = None, deadline: float | None = None,
          clock=time.monotonic) -> tuple[object, TrainResult]:
    """Returns (peft model with the adapter, result). `target` may be None for the `lm` objective; a native model
    (specdec.native.lm.NativeModel) teaches through NativeTeacher. device: where to train (None: CUDA if there is
    one, else the CPU); it decides the precision (precision.train_precision). deadline: a clock() value no step
    starts past if the steps so far say it would end after it (stopped_by "minutes", as config.max_minutes)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from peft import LoraConfig, PeftModel, get_peft_model
    from tqdm import tqdm

    if not samples:
        raise SpecdecError("no training samples: the repository has no usable source files")
    if config.objective != "lm" and target is None:
        raise SpecdecError(f"objective {config.objective} needs the target model")
    torch.manual_seed(config.seed)
    plan = train_precision(device or ("cuda" if torch.cuda.is_available() else "cpu"), config.precision, config.quant)
    AcceleratorState._reset_state()  # accelerate keeps one precision per process; each training chooses its own
    accelerator = Accelerator(cpu=not plan.on_cuda, mixed_precision=plan.mixed_precision)
    if accelerator.num_processes > 1:
        # The step calls the unwrapped model (output_logits needs its decoder and head), which a
        # DistributedDataParallel wrapper would not synchronise: refuse rather than train wrongly.
        raise SpecdecError("specdec finetune trains on one device; run it without `accelerate launch`")
    base_dtype = next(draft.parameters()).dtype
    held = plan.base_dtype is not None and base_dtype != plan.base_dtype
    exact = held and _bf16_exact(draft)
    held = held and (exact or not plan.exact_only)
    # an inexact round trip (CUDA only): the caller's weights are kept aside and put back as they were
    kept = [(p, p.detach().to("cpu", copy=True)) for p in draft.parameters()] if held and not exact else []
    if held:
        draft.to(plan.base_dtype)  # frozen weights in bf16: no per-step casts
    state = load_checkpoint_state(workdir, config)
    ignore_peft_checkpointing_notice()
    if state:
        model = PeftModel.from_pretrained(draft, workdir / "checkpoint", is_trainable=True)
    else:
        layers = draft.config.num_hidden_layers
        top = range(max(0, layers - config.top_layers), layers) if config.top_layers else None
        model = get_peft_model(draft, LoraConfig(r=config.rank, lora_alpha=config.alpha,
                                                 lora_dropout=config.dropout, layers_to_transform=top and list(top),
                                                 target_modules=list(config.target_modules), task_type="CAUSAL_LM"))
    for param in model.parameters():
        if param.requires_grad:  # the adapter: fp32 whatever the base (peft's default too, made explicit)
            param.data = param.data.to(plan.lora_dtype)
    swapped = swap_int8(model, plan.quant) if plan.quant != "none" else []
    for parent, name, original in swapped:  # backward reads the float weights kept to put back, not a second copy
        getattr(parent, name).backward_through(original.weight)
    # a CPU step takes one sample at a time (the activations, logits and teacher logits of one row, not of the
    # batch: the same gradients, summed) and keeps only each decoder layer's input for the backward, recomputing
    # the rest (1.5 GB of activations for a 384-token row of the 0.5B in fp32, for one more decoder forward); a
    # GPU the whole batch, every activation kept
    per_pass = config.batch_size if plan.on_cuda else 1
    recompute = not plan.on_cuda and getattr(draft, "supports_gradient_checkpointing", False)
    if recompute:
        draft.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    vocab = None
    if config.vocab == "repo":
        size = draft.get_output_embeddings().weight.shape[0]
        if target is not None:
            size = min(size, output_width(target))
        vocab = Vocabulary.of(samples, tokenizer, size)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    if state:
        saved = torch.load(workdir / "checkpoint" / "trainer.pt", weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
    model, optimizer = accelerator.prepare(model, optimizer)
    teacher = None
    if target is not None and config.objective != "lm":
        if is_native(target):
            teacher = NativeTeacher(target, max(len(s) for s in samples))
        else:
            target.eval()
            teacher = lambda ids, mask, vocab: output_logits(target, ids, mask, vocab)  # noqa: E731
    pad_id = pad_token_id(tokenizer)
    step, tokens = (state["step"], state["tokens"]) if state else (0, 0)
    elapsed = state["seconds"] if state else 0.0
    result = TrainResult(step, tokens, elapsed, resumed_from=step)
    batches = length_bucketed_batches(samples, config.batch_size, config.seed)
    started = clock() - elapsed
    run_started = clock()  # this run's own steps (not a resumed run's) time a step

    def checkpoint():
        _save_checkpoint(accelerator.unwrap_model(model), optimizer,
                         {"step": step, "tokens": tokens, "seconds": clock() - started,
                          "fingerprint": config.fingerprint(), "losses": result.losses[-50:]}, workdir)

    bar = tqdm(total=config.max_steps, initial=step, desc="finetune", unit="step", disable=not progress)
    model.train()
    try:
        while True:
            now = clock()
            minutes = (now - started) / 60
            per_step = (now - run_started) / (step - result.resumed_from) if step > result.resumed_from else 0.0
            if step >= config.max_steps:
                result.stopped_by = "steps"
                break
            if minutes >= config.max_minutes or (deadline is not None and now + per_step > deadline):
                result.stopped_by = "minutes"
                break
            if config.max_tokens and tokens >= config.max_tokens:
                result.stopped_by = "tokens"
                break
            batch = [samples[i] for i in batches[step % len(batches)]]
            count = sum(max(0, len(row) - 1) for row in batch)  # the batch's next-token positions
            loss = 0.0
            for part in range(0, len(batch), per_pass):
                ids, mask = collate(batch[part : part + per_pass], pad_id)
                ids, mask = ids.to(accelerator.device), mask.to(accelerator.device)
                target_logits = None
                if teacher is not None:
                    with torch.no_grad():
                        target_logits = teacher(ids, mask, vocab)
                loss = loss + step_backward(accelerator.unwrap_model(model), ids, mask, vocab, target_logits,
                                            config.objective, accelerator.autocast, accelerator.backward,
                                            count=count)
                del target_logits
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            tokens += sum(len(row) for row in batch)
            loss = loss.detach().item()
            result.losses.append(loss)
            spent = max(1e-6, clock() - started)
            per_step = spent / max(1, step - result.resumed_from)
            left = min((config.max_steps - step) * per_step, config.max_minutes * 60 - spent)
            if config.max_tokens:
                left = min(left, (config.max_tokens - tokens) / max(1e-6, tokens / spent))
            if deadline is not None:
                left = min(left, deadline - clock())
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / spent:.0f}",
                            eta=f"{int(max(0, left)) // 60}:{int(max(0, left)) % 60:02d}")
            bar.update()
            if on_step:
                on_step(step, loss)
            if step % config.checkpoint_every == 0:
                checkpoint()
    except KeyboardInterrupt:
        result.stopped_by = "interrupted"
        checkpoint()
        bar.close()
        raise
    finally:
        if recompute:
            draft.activation_checkpointing_disable()
        for parent, name, original in swapped:  # the caller's draft as it was: the adapter merges into these
            setattr(parent, name, original)
        if held:
            model.to(base_dtype)  # the caller's draft as it was (exact, see _bf16_exact, or put back from `kept`)
            for param, original in kept:
                param.data.copy_(original)
    bar.close()
    checkpoint()
    model.eval()
    result.steps, result.tokens, result.seconds = step, tokens, clock() - started
    # without accelerate's autocast wrapper on forward: the caller measures and serves the draft as it is
    return accelerator.unwrap_model(model, keep_fp32_wrapper=False), result
