"""`specdec finetune` end to end on tiny models: acceptance gain, registration, resume, refusals, bench."""

from types import SimpleNamespace

import pytest

import tiny
from specdec_adapters.registry import Registry, repo_identity
from specdec_finetune.dataset import split_files
from specdec_finetune.files import select
from specdec_finetune.run import finetune_repo
from specdec.errors import SpecdecError
from adapter_files import random_adapter
from repos import make_repo, training_samples


def args_for(repo, pair, **overrides):
    """`specdec finetune`'s arguments for the tiny pair. --max-minutes bounds the whole command (the evaluation's
    holes included): an hour, so no outcome here depends on how busy the machine is (test_budget.py's clocks)."""
    base = dict(repo=str(repo), target=str(pair[0]), draft=str(pair[1]), dtype="fp32", objective="distill",
                rank=16, alpha=16, target_modules="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                lr=1e-2, batch_size=4, seq_len=128, max_steps=40, max_minutes=60.0, max_tokens=0, holdout=0.25,
                eval_holes=4, eval_tokens=12, eval_temperature=0.0, seed=0, force=False, report=None, quiet=True,
                progress_json=False, precision="fp32", vocab="full", top_layers=0, draft_quant="none")
    return SimpleNamespace(**{**base, **overrides})


def test_finetune_raises_acceptance_and_registers(tmp_path, pair):
    repo = make_repo(tmp_path / "repo")
    outcome = finetune_repo(args_for(repo, pair, objective="mixed", max_steps=60), report=lambda m: None)
    before, after = outcome["before"]["total"], outcome["after"]["total"]
    assert after["acceptance_rate"] > before["acceptance_rate"] + 0.08, (before, after)
    assert after["tokens_per_pass"] > before["tokens_per_pass"]
    assert outcome["registered"]
    meta = Registry().latest(repo_identity(repo)[0])
    assert meta.name == outcome["registered"] and meta.version == "v1"
    assert meta.metrics_after["total"]["acceptance_rate"] == after["acceptance_rate"]
    assert meta.dataset["train"]["files"] == 9 and meta.base_draft == str(pair[1])


def test_sampled_evaluation_accepts_every_token_of_a_draft_that_is_the_target_and_is_seeded(tmp_path, pair):
    from specdec_finetune.evaluate import holes_for, measure
    from specdec.models.loading import load
    from specdec.engine.sampling import SamplingConfig

    holes = holes_for(split_files(select(make_repo(tmp_path / "repo", files=4, git=False)), 0.0).train, 2, 0)
    target, draft = load(str(pair[0]), "fp32"), load(str(pair[1]), "fp32")
    hot = SamplingConfig(temperature=1.0, seed=7)
    # the target as its own draft, reading the whole prompt (not the server's short view of the suffix)
    itself = measure(target.model, target.model, target.tokenizer, holes, 12, sampling=hot,
                     draft_suffix_tokens=None)["total"]
    assert itself["drafted"] > 0 and itself["acceptance_rate"] == 1.0  # p / q = 1: lossless sampling accepts all
    other = measure(target.model, draft.model, target.tokenizer, holes, 12, sampling=hot)["total"]
    assert other["acceptance_rate"] < 1.0
    assert measure(target.model, draft.model, target.tokenizer, holes, 12, sampling=hot)["total"] == other
    assert measure(target.model, draft.model, target.tokenizer, holes, 12)["total"] != other  # greedy differs
    with pytest.raises(SpecdecError, match="temperature"):
        finetune_repo(args_for(tmp_path / "repo", pair, eval_temperature=-1.0), report=lambda m: None)


def test_target_modules_the_server_cannot_switch_are_refused_before_training(tmp_path, pair):
    repo = make_repo(tmp_path / "repo", files=4)
    for modules, named in (("q_proj,lm_head", "lm_head"), ("q_prj", "q_prj"), ("", "empty")):
        with pytest.raises(SpecdecError, match=f"--target-modules: {named} cannot be switched"):
            finetune_repo(args_for(repo, pair, target_modules=modules), report=lambda m: None)
    assert Registry().list() == []
    outcome = finetune_repo(args_for(repo, pair, target_modules=" q_proj, v_proj", max_steps=2, force=True),
                            report=lambda m: None)
    assert outcome["training"]["target_modules"] == ("q_proj", "v_proj")


def test_interrupted_training_leaves_registry_unchanged_and_resumes(tmp_path, pair):
    repo = make_repo(tmp_path / "repo", files=6)

    def interrupt(step, loss):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune_repo(args_for(repo, pair, max_steps=6), report=lambda m: None, on_step=interrupt)
    assert Registry().list() == []
    outcome = finetune_repo(args_for(repo, pair, max_steps=6, force=True), report=lambda m: None)
    assert outcome["training"]["resumed_from"] == 3 and outcome["training"]["steps"] == 6
    assert len(Registry().list()) == 1
    # a finished run is not resumed again: the next fine-tune of the repository trains afresh
    again = finetune_repo(args_for(repo, pair, max_steps=6, force=True), report=lambda m: None)
    assert again["training"]["resumed_from"] == 0 and again["training"]["steps"] == 6
    assert [m.version for m in Registry().list()] == ["v1", "v2"]


def test_objective_comparison_scores_each_objective_from_the_same_base(tmp_path, pair, capsys):
    from specdec_bench.finetune_compare import compare_objectives, implied_acceptance, print_scores

    repo = make_repo(tmp_path / "repo")
    args = args_for(repo, pair, max_steps=30, heldout_samples=6, batch_size=4)
    scores = compare_objectives(args, ["distill", "lm"], report=lambda m: None)
    assert [s.objective for s in scores] == ["distill", "lm"]
    assert scores[0].agreement_before == scores[1].agreement_before  # each starts from a fresh base draft
    assert all(s.steps == 30 and 0 <= s.agreement_after <= 1 for s in scores)
    assert scores[0].agreement_after > scores[0].agreement_before + 0.05  # distillation learns the repo's idiom
    assert implied_acceptance(1.0) == 1.0 and implied_acceptance(0.5, k=2) == (0.5 + 0.25) / 2
    print_scores(scores)
    best = max(scores, key=lambda s: s.gain)
    assert f"best: {best.objective}" in capsys.readouterr().out


def test_training_refuses_several_processes_before_touching_the_draft(tmp_path, tok, monkeypatch):
    import torch

    import accelerate

    from specdec_finetune import train as train_module

    class TwoProcesses(accelerate.Accelerator):
        num_processes = 2

    monkeypatch.setattr(accelerate, "Accelerator", TwoProcesses)  # as `accelerate launch` on two GPUs reports
    draft = tiny.model(seed=2, layers=2)
    samples = training_samples(tmp_path, tok, files=2, count=4)
    config = train_module.TrainConfig(objective="lm", precision="bf16", max_steps=1)
    with pytest.raises(SpecdecError, match="trains on one device"):
        train_module.train(draft, None, tok, samples, config, tmp_path / "run", progress=False)
    assert not any("lora_" in name for name, _ in draft.named_parameters())
    assert all(p.dtype == torch.float32 for p in draft.parameters())


def test_finetune_bench_trains_with_the_finetune_commands_own_defaults():
    from specdec_bench.finetune import _finetune_args

    bench = SimpleNamespace(finetune="/repo", target="T", draft="D", dtype="fp32", max_minutes=6.0,
                            draft_quant="int8-down-fp32")
    args = _finetune_args(bench, objective="lm", max_steps=100_000, force=True)
    assert (args.repo, args.target, args.draft, args.dtype, args.max_minutes) == ("/repo", "T", "D", "fp32", 6.0)
    assert (args.objective, args.max_steps, args.force) == ("lm", 100_000, True)
    assert (args.rank, args.alpha, args.lr, args.batch_size, args.seq_len, args.holdout) == (16, 32, 3e-4, 2, 384, 0.1)
    assert args.target_modules == "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    assert (args.vocab, args.top_layers) == ("full", 0)
    assert args.draft_quant == "int8-down-fp32"  # the adapter is fitted over the draft the bench will run


def test_bench_runs_an_adapter_over_the_int8_draft_exactly_as_the_server_does(tmp_path):
    """Both fold the adapter into the fp32 weights, then quantize: int8(W + BA), bit for bit."""
    import torch
    from peft import PeftModel

    from specdec.models.lora import SwitchableDraft
    from specdec.models.loading import load_pair

    random_adapter(tmp_path / "adapter", 0)
    peft_model = PeftModel.from_pretrained(tiny.model(seed=2), tmp_path / "adapter")
    target, draft = tiny.save(tmp_path, seed=1, name="target"), tiny.save(tmp_path, seed=2, name="draft")
    ids = torch.tensor([[10, 11, 12, 13]])
    server = SwitchableDraft(tiny.model(seed=2))
    server.activate("a", tmp_path / "adapter")
    with torch.no_grad():
        bench = load_pair(str(target), str(draft), "fp32", "int8", adapter=str(tmp_path / "adapter")).draft.model
        assert torch.equal(bench(ids).logits, server.model(ids).logits)
        plain = load_pair(str(target), str(draft), "fp32", "int8").draft.model
        assert not torch.allclose(bench(ids).logits, plain(ids).logits)
        merged = load_pair(str(target), str(draft), "fp32", "none", adapter=str(tmp_path / "adapter")).draft.model
        assert not any("lora_" in name for name, _ in merged.named_modules())  # unquantized: folded in
        torch.testing.assert_close(merged(ids).logits, peft_model(ids).logits, rtol=1e-4, atol=1e-4)
