"""`specdec finetune` keeps its word (issue #52 item 13): `--max-minutes` bounds the whole command (a slow phase
leaves training what is left, and the report's time split says where the time went), a GGUF target teaches on the
native forward from its codes (no dequantized copy, no conversion), nothing is left in the user's cache that
serving does not make itself, and the report carries the peak RSS and the time split. Clocks are injected: no
assert depends on how fast this machine is."""

import json
import re
from pathlib import Path

import pytest
import torch

import tiny
from gguf_files import gguf_pair as write_gguf_pair
from repos import make_repo
from test_run import args_for

PHASES = ("load", "dataset", "before_eval", "train", "after_eval")


class FakeClock:
    """A monotonic clock that moves only when a test says so."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def slow_load(monkeypatch, clock: FakeClock, seconds: float) -> None:
    """Loading the models takes `seconds` on the fake clock."""
    from specdec_finetune import models

    real = models.load_models

    def load_models(*args, **kwargs):
        loaded = real(*args, **kwargs)
        clock.advance(seconds)
        return loaded

    monkeypatch.setattr(models, "load_models", load_models)


def test_a_slow_load_leaves_training_what_is_left_and_the_command_ends_by_its_budget(tmp_path, pair, monkeypatch):
    clock, lines = FakeClock(), []
    slow_load(monkeypatch, clock, 30.0)
    repo = make_repo(tmp_path / "repo", files=6)
    # a minute for everything: 30 s of loading, then 5 s a step (the evaluations take no time on this clock)
    outcome = finetune_repo_with(repo, pair, clock, lines, max_minutes=1.0, max_steps=40, force=True,
                                 on_step=lambda step, loss: clock.advance(5.0))
    split = outcome["time"]
    assert split["load"] == 30.0 and split["budget"] == 60.0
    assert outcome["training"]["stopped_by"] == "minutes"
    # the evaluation after training (as long as the one before: 0 s here) and registering (5 s) are reserved
    assert outcome["training"]["steps"] == 5 and split["train"] == 25.0
    assert split["total"] <= split["budget"]
    assert set(PHASES) <= set(split) and sum(split[p] for p in PHASES) <= split["total"]
    assert outcome["registered"] and outcome["peak_rss_gb"] > 0
    assert outcome["peak_rss_bytes"] == pytest.approx(outcome["peak_rss_gb"] * 1e9, rel=0.01)
    assert any(line.startswith("time: load 30 s, dataset 0 s, before-eval 0 s, train 25 s") and
               line.endswith("total 55 s of a 60 s budget") for line in lines), lines
    assert any(re.fullmatch(r"peak RSS \d+\.\d GB \(in [a-z-]+\)", line) for line in lines), lines
    assert set(outcome["peak_rss_by_phase"]) <= set(PHASES) | {"register"}
    assert outcome["peak_rss_phase"] in outcome["peak_rss_by_phase"]


def test_a_load_that_spends_the_budget_trains_nothing_and_registers_nothing(tmp_path, pair, monkeypatch):
    from specdec_adapters.registry import Registry

    clock, lines = FakeClock(), []
    slow_load(monkeypatch, clock, 90.0)
    repo = make_repo(tmp_path / "repo", files=6)
    outcome = finetune_repo_with(repo, pair, clock, lines, max_minutes=1.0, max_steps=40, force=True,
                                 on_step=lambda step, loss: pytest.fail("a step past the deadline"))
    assert outcome["training"]["steps"] == 0 and outcome["training"]["stopped_by"] == "minutes"
    assert outcome["registered"] is None and Registry().list() == []
    assert outcome["after"] == outcome["before"] and outcome["acceptance_gain"] == 0.0
    assert "after_eval" not in outcome["time"] and outcome["time"]["total"] == 90.0
    assert any(line.startswith("not registered: no training step fit in the budget") for line in lines), lines
    assert any(line.endswith("total 90 s of a 60 s budget (30 s over)") for line in lines), lines


def test_evaluations_cut_short_by_the_deadline_compare_the_holes_both_measured(tmp_path, pair, monkeypatch):
    from specdec.prompts.completion import Completer

    clock, lines, hole_seconds = FakeClock(), [], [4.0]
    real_complete = Completer.complete

    def complete(self, *args, **kwargs):
        result = real_complete(self, *args, **kwargs)
        clock.advance(hole_seconds[0])
        return result

    def step(step, loss):
        clock.advance(10.0)
        hole_seconds[0] = 10.0  # the machine got busy: the holes after training take longer

    monkeypatch.setattr(Completer, "complete", complete)
    repo = make_repo(tmp_path / "repo", files=6)
    outcome = finetune_repo_with(repo, pair, clock, lines, on_step=step, max_minutes=1.0, max_steps=40, force=True,
                                 eval_holes=4)
    # before: a fifth of the minute (12 s) holds 3 holes of 4 s; training stops where 1.25 x 12 s + 5 s are left
    # (2 steps of 10 s); after: the 10 s holes that end 5 s before the deadline
    holes = outcome["eval_holes"]
    assert holes["available"] > 3 and (holes["measured"], holes["compared"]) == (3, 2)
    assert outcome["training"]["steps"] == 2
    assert outcome["before"]["total"]["holes"] == outcome["after"]["total"]["holes"] == 2
    assert outcome["time"]["before_eval"] == 12.0 and outcome["time"]["after_eval"] == 20.0
    assert outcome["time"]["total"] == 52.0 <= outcome["time"]["budget"]
    assert any("ran out of budget after 2 of 3 holes" in line for line in lines), lines


def finetune_repo_with(repo, pair, clock, lines, on_step=None, **overrides):
    from specdec_finetune.run import finetune_repo

    return finetune_repo(args_for(repo, pair, **overrides), report=lines.append, on_step=on_step, clock=clock)


def test_a_measurement_stops_starting_holes_at_its_deadline_and_spreads_them_over_the_files(tmp_path, pair):
    from specdec.models.loading import load
    from specdec_finetune.dataset import split_files
    from specdec_finetune.evaluate import holes_for, measure, spread
    from specdec_finetune.files import select

    files = split_files(select(make_repo(tmp_path / "repo", files=3, git=False)), 0.0).train
    holes = spread(holes_for(files, 2, 0))
    assert [h.source.member for h in holes[:3]] == [f.path for f in files]  # every file's first hole first
    key = lambda h: (h.source.member, h.line)  # noqa: E731
    assert sorted(map(key, holes)) == sorted(map(key, holes_for(files, 2, 0)))  # the same holes, in turns
    target, draft = load(str(pair[0]), "fp32"), load(str(pair[1]), "fp32")
    ticks = iter(range(100))  # every reading of the clock is a second later than the one before

    def clock():
        return float(next(ticks))

    # the first hole always runs; then a hole starts only if the mean so far says it ends by the deadline
    cut = measure(target.model, draft.model, target.tokenizer, holes, 6, deadline=2.5, clock=clock)
    assert cut["total"]["holes"] == 2
    full = measure(target.model, draft.model, target.tokenizer, holes[:2], 6)
    assert full["total"] == cut["total"]
    assert measure(target.model, draft.model, target.tokenizer, [], 6)["total"]["holes"] == 0


@pytest.fixture
def gguf_pair(tmp_path):
    """A target and a draft GGUF (different random weights, the same tokenizer in each file), as a catalog pull
    keeps them: the native forward runs both."""
    from specdec.models import w4a8
    from specdec.native.layers import ops_available

    if w4a8.load() is None or not ops_available():
        pytest.skip("the native forward cannot run here")
    return write_gguf_pair(tmp_path / "gguf")


def cache_files() -> dict[str, int]:
    from specdec.paths import cache_dir

    return {str(p.relative_to(cache_dir())): p.stat().st_size for p in sorted(cache_dir().rglob("*")) if p.is_file()}


@pytest.mark.parametrize("objective", ["distill", "lm"])
def test_a_gguf_target_teaches_on_the_native_forward_and_the_cache_keeps_only_what_serving_made(
        objective, gguf_pair, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    from specdec.models import store
    from specdec.models.loading import load_pair
    from specdec.native.lm import NativeModel
    from specdec_finetune import run as run_module
    from specdec_finetune import train as train_module

    target, draft = gguf_pair
    load_pair(str(target), str(draft), target_quant="auto")  # a user who served first: what serving caches
    served = cache_files()
    assert served and all(Path(name).name.startswith("native-") for name in served)

    loaded_by_transformers, teachers = [], []
    real_from_pretrained = AutoModelForCausalLM.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        loaded_by_transformers.append(kwargs.get("gguf_file") or args[0])
        return real_from_pretrained(cls, *args, **kwargs)

    def no_conversion(*args, **kwargs):
        raise AssertionError("a GGUF converted for transformers")

    real_train = train_module.train

    def train(draft_model, target_model, *args, **kwargs):
        teachers.append(target_model)
        return real_train(draft_model, target_model, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(from_pretrained))
    monkeypatch.setattr(store, "convert_gguf", no_conversion)
    monkeypatch.setattr(train_module, "train", train)
    repo = make_repo(tmp_path / "repo", files=6)
    report = tmp_path / "report.json"
    # the command's budget counts from its process's start: here pytest's, so a budget it cannot spend
    args = args_for(repo, (target, draft), max_steps=3, eval_holes=2, eval_tokens=8, seq_len=96, max_minutes=1e4,
                    draft_quant="int8", force=True, report=str(report), quiet=False, objective=objective)
    assert run_module.cmd_finetune(args) == 0
    outcome = json.loads(report.read_text())
    # the target's signal came from the native forward; transformers only ever read the draft (to train it)
    assert len(teachers) == 1 and (isinstance(teachers[0], NativeModel) if objective != "lm" else teachers[0] is None)
    assert loaded_by_transformers == ["draft.gguf"]
    assert outcome["target_forward"] == "native" and outcome["evaluated_with"] == "native"
    assert outcome["teacher"] == ("native" if objective != "lm" else None)
    assert outcome["training"]["steps"] == 3 and outcome["registered"]
    assert cache_files() == served  # nothing added, nothing rewritten
    assert set(PHASES) | {"register", "total", "budget"} <= set(outcome["time"])
    assert outcome["peak_rss_gb"] > 0 and outcome["peak_rss_phase"] in outcome["peak_rss_by_phase"]
    out = capsys.readouterr().out
    assert (f"the target on the native forward {'teaches and verifies' if objective != 'lm' else 'verifies'}; "
            "the native draft drafts the measurement") in out
    assert "\ntime: " in out and "\npeak RSS " in out


def test_the_native_teacher_gives_each_row_the_logits_of_its_own_prefill(gguf_pair):
    from specdec.native.loading import load_native
    from specdec_finetune.train import NativeTeacher, Vocabulary, collate

    model, _ = load_native(str(gguf_pair[0]), gguf_pair[0])
    rows = [[5, 9, 17, 33, 2, 8, 101, 7], [40, 41, 42], [300, 12, 5, 9, 17]]
    ids, mask = collate(rows, 4)
    teacher = NativeTeacher(model, max(map(len, rows)))
    logits = teacher(ids, mask, None)
    assert logits.shape == (3, 8, 384)
    for i, row in enumerate(rows):
        alone = model.new_cached_lm().extend(row)
        assert torch.equal(logits[i, : len(row)], alone)  # row-exact: the batch changes no bit
        assert not logits[i, len(row) :].any()  # padding: zeros, masked out of every loss
    vocab = Vocabulary(torch.tensor([2, 5, 9, 300]))
    assert torch.equal(teacher(ids, mask, vocab), logits[..., vocab.ids])
    one, full = collate(rows[:1], 4)  # one row, no padding: a CPU step's pass
    assert torch.equal(teacher(one, full, None), logits[:1])


def test_the_finetune_command_takes_the_servers_forward_choice():
    from argparse import ArgumentParser

    from specdec_finetune.run import register

    parser = ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["finetune", "repo"]).forward == "auto"
    assert parser.parse_args(["finetune", "repo", "--forward", "transformers"]).forward == "transformers"
    helps = {a.dest: a.help for a in parser._subparsers._group_actions[0].choices["finetune"]._actions}
    assert "whole command" in helps["max_minutes"]


def test_the_finetune_bench_hands_its_budget_to_the_whole_fine_tune_and_says_so():
    """`specdec bench --finetune REPO --max-minutes N` runs `specdec finetune`'s whole command within N minutes
    (finetune_repo's budget), and its help says what N bounds."""
    from argparse import ArgumentParser

    from specdec_bench import finetune as bench_finetune

    parser = ArgumentParser()
    bench_finetune.register(parser)
    args = parser.parse_args(["--finetune", "repo", "--max-minutes", "4"])
    args.target, args.draft, args.dtype, args.draft_quant = "t", "d", "auto", "int8"
    assert bench_finetune._finetune_args(args).max_minutes == 4.0
    helps = {a.dest: a.help for a in parser._actions}
    assert "whole time budget" in helps["max_minutes"] and "training time budget" not in helps["max_minutes"]



@pytest.mark.parametrize("objective", ["distill", "mixed", "lm"])
def test_a_step_a_chunk_of_positions_at_a_time_has_the_whole_batchs_loss_and_gradients(objective):
    """train's step scores the output layer a few positions at a time (the full-vocabulary logits of a whole batch
    were gigabytes): the same loss and LoRA gradients as loss_fn over the whole batch's logits."""
    from contextlib import nullcontext

    from peft import LoraConfig, get_peft_model

    from specdec_finetune.train import collate, loss_fn, output_logits, step_backward

    rows = [[5, 9, 17, 33, 2, 8, 101, 7, 12, 40, 41], [40, 41, 42, 43, 44], [300, 12, 5, 9, 17, 3, 3]]
    ids, mask = collate(rows, 4)
    target = tiny.model(seed=4)(input_ids=ids, attention_mask=mask).logits.detach()
    grads = []
    for chunked in (False, True):
        model = get_peft_model(tiny.model(seed=2), LoraConfig(r=4, target_modules=["q_proj", "down_proj"],
                                                               lora_dropout=0.0))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
        if chunked:
            loss = step_backward(model, ids, mask, None, target, objective, nullcontext, lambda x: x.backward(),
                                 chunk=3)
        else:
            loss = loss_fn(output_logits(model, ids, mask, None), ids, mask, target, objective)
            loss.backward()
        grads.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    (whole, whole_grads), (chunks, chunk_grads) = grads
    assert chunks == pytest.approx(whole, rel=1e-5)
    assert whole_grads.keys() == chunk_grads.keys() and whole_grads
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunk_grads[name], grad, rtol=1e-4, atol=1e-6)
