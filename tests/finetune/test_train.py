"""The training step: objectives, vocabulary restriction, batching, int8 and bf16 training."""

import pytest

import tiny
from repos import training_samples
from specdec.errors import SpecdecError


def test_repo_vocabulary_restricts_both_models_to_the_repos_tokens(tok):
    import torch

    from specdec_finetune.train import Vocabulary, loss_fn, output_logits

    samples = [tok.encode("def add(a, b):\n    return a + b\n"), tok.encode("for i in range(10):\n")]
    vocab = Vocabulary.of(samples, tok, len(tok))
    assert set(vocab.ids.tolist()) == {t for s in samples for t in s} | set(tok.all_special_ids)
    model = tiny.model(seed=3)
    ids = torch.tensor([samples[0][:8], samples[1][:8]])
    mask = torch.ones_like(ids)
    full = model(input_ids=ids, attention_mask=mask).logits
    restricted = output_logits(model, ids, mask, vocab)
    assert restricted.shape == (2, 8, len(vocab.ids))
    torch.testing.assert_close(restricted, full[..., vocab.ids])  # the same logits, fewer columns
    labels = vocab.labels(ids)
    assert torch.equal(vocab.ids[labels], ids)
    # cross-entropy over the repo's tokens is the full one renormalized over them
    ce = loss_fn(restricted, labels, mask, None, "lm")
    expected = torch.nn.functional.cross_entropy(full[:, :-1, vocab.ids].reshape(-1, len(vocab.ids)),
                                                 labels[:, 1:].reshape(-1))
    torch.testing.assert_close(ce, expected)
    assert float(loss_fn(restricted, labels, mask, restricted, "distill")) == pytest.approx(0.0, abs=1e-6)
    assert float(loss_fn(restricted, labels, mask, output_logits(tiny.model(seed=4), ids, mask, vocab),
                         "distill")) > 0.01


def test_length_bucketed_batches_use_every_sample_once_with_little_padding():
    import random

    from specdec_finetune.train import length_bucketed_batches

    rng = random.Random(0)  # like the real pool: FIM samples of ~200 tokens, full-length windows of 384
    samples = [[1] * (rng.randint(150, 260) if rng.random() < 0.7 else 384) for _ in range(301)]
    batches = length_bucketed_batches(samples, 2, seed=5)
    assert sorted(i for b in batches for i in b) == list(range(301))
    assert all(1 <= len(b) <= 2 for b in batches) and sum(len(b) == 1 for b in batches) == 1
    assert batches == length_bucketed_batches(samples, 2, seed=5) != length_bucketed_batches(samples, 2, seed=6)

    def padded(groups):
        return sum(len(g) * max(len(samples[i]) for i in g) for g in groups)

    real = sum(len(s) for s in samples)
    order = list(range(301))
    rng.shuffle(order)
    unsorted = [order[i : i + 2] for i in range(0, 301, 2)]
    assert real / padded(batches) > 0.97 > 0.9 > real / padded(unsorted)
    # still a random order: the first few batches are not simply the shortest samples
    assert max(len(samples[i]) for b in batches[:20] for i in b) == 384


def random_loss_inputs():
    """Draft and target logits over 11 tokens, a mask with padding, the code and its real positions."""
    import torch

    torch.manual_seed(0)
    draft, target = torch.randn(2, 6, 11), torch.randn(2, 6, 11)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    code = torch.randint(0, 11, (2, 6))
    return draft, target, mask, code, mask[:, 1:].bool()


def test_argmax_objective_is_cross_entropy_toward_the_targets_top_token():
    import torch

    from specdec_finetune.train import loss_fn

    draft, target, mask, code, valid = random_loss_inputs()
    expected = torch.nn.functional.cross_entropy(draft[:, :-1][valid], target[:, :-1].argmax(-1)[valid])
    torch.testing.assert_close(loss_fn(draft, code, mask, target, "argmax"), expected)
    # the code's own next tokens play no part: only what the target would pick greedily
    torch.testing.assert_close(loss_fn(draft, (code + 1) % 11, mask, target, "argmax"), expected)
    # a draft that puts its mass on the target's top tokens scores lower than one on other tokens
    agreeing = torch.nn.functional.one_hot(target.argmax(-1), 11).float() * 10
    disagreeing = torch.nn.functional.one_hot((target.argmax(-1) + 1) % 11, 11).float() * 10
    assert loss_fn(agreeing, code, mask, target, "argmax") < 0.01 < loss_fn(disagreeing, code, mask, target, "argmax")


def test_tvd_objective_is_the_mean_total_variation_distance_to_the_target():
    import torch

    from specdec_finetune.train import loss_fn

    draft, target, mask, code, valid = random_loss_inputs()
    p, q = target[:, :-1].softmax(-1)[valid], draft[:, :-1].softmax(-1)[valid]
    expected = torch.tensor([0.5 * sum(abs(a - b) for a, b in zip(pi.tolist(), qi.tolist())) for pi, qi in zip(p, q)])
    torch.testing.assert_close(loss_fn(draft, code, mask, target, "tvd"), expected.mean())
    # zero for a draft that is the target, bounded by 1, and the code's own tokens play no part
    assert loss_fn(target, code, mask, target, "tvd") < 1e-6
    assert 0 < loss_fn(-target * 10, code, mask, target, "tvd") <= 1
    torch.testing.assert_close(loss_fn(draft, (code + 1) % 11, mask, target, "tvd"), expected.mean())


def test_top_layers_and_bf16_training_leave_the_base_draft_exactly_as_it_was(tmp_path, tok):
    import torch

    from specdec_finetune.train import TrainConfig, train

    draft = tiny.model(seed=2, layers=3)
    for p in draft.parameters():  # bf16-representable weights, as the cached real models are
        p.data = p.data.to(torch.bfloat16).float()
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    samples = training_samples(tmp_path, tok, files=3, count=8)
    config = TrainConfig(objective="distill", top_layers=1, precision="bf16", vocab="repo", max_steps=2, batch_size=2)
    model, result = train(draft, tiny.model(seed=1), tok, samples, config, tmp_path / "run", progress=False)
    assert result.steps == 2
    lora_layers = {name.split(".layers.")[1].split(".")[0] for name, _ in model.named_parameters() if "lora_" in name}
    assert lora_layers == {"2"}  # only the last decoder layer is adapted
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in model.state_dict().items() if "lora_" not in k}
    assert all(v.dtype == torch.float32 for v in base.values())
    assert all(torch.equal(base[k], v) for k, v in before.items())  # frozen weights untouched by the bf16 round trip
    with pytest.raises(SpecdecError, match="vocab must be"):
        TrainConfig(vocab="tiny")


def test_int8_layer_passes_gradients_through_its_dequantized_weight():
    import torch

    from specdec.models.int8 import Int8Linear

    torch.manual_seed(0)
    layer = Int8Linear(torch.nn.Linear(16, 8))
    x = torch.randn(3, 16, requires_grad=True)
    out = layer(x)
    with torch.no_grad():
        assert torch.equal(out, layer(x))  # the same int8 forward with and without autograd
    (out * torch.arange(8.0)).sum().backward()
    expected = torch.arange(8.0).expand(3, 8) @ layer._inner.weight().dequantize()
    torch.testing.assert_close(x.grad, expected, rtol=2e-2, atol=2e-2)  # straight through, bf16 matmul


def test_lora_trained_over_the_int8_draft_fits_the_draft_the_server_runs(tmp_path, tok):
    import torch

    from specdec_finetune.evaluate import as_served
    from specdec_finetune.train import TrainConfig, collate, loss_fn, pad_token_id, train
    from specdec.models.int8 import Int8Linear

    samples = training_samples(tmp_path, tok, files=3, count=8)
    target, draft = tiny.model(seed=1), tiny.model(seed=2)
    before_weights = {k: v.clone() for k, v in draft.state_dict().items()}
    ids, mask = collate(samples, pad_token_id(tok))

    def kl_to_target(model) -> float:
        with torch.no_grad():
            return float(loss_fn(model(input_ids=ids, attention_mask=mask).logits, ids, mask,
                                 target(input_ids=ids, attention_mask=mask).logits, "distill"))

    before = kl_to_target(as_served(draft, "int8"))
    config = TrainConfig(quant="int8", max_steps=15, batch_size=4, learning_rate=1e-2, precision="fp32")
    model, result = train(draft, target, tok, samples, config, tmp_path / "run", progress=False)
    assert result.steps == 15
    assert not any(isinstance(m, Int8Linear) for m in model.modules())  # the caller's fp32 base is back
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base[k], v) for k, v in before_weights.items())
    served = as_served(model, "int8")
    assert any(isinstance(m, Int8Linear) for m in served.modules())
    assert kl_to_target(served) < 0.8 * before  # the int8 draft, as served, moved toward the target
    with pytest.raises(SpecdecError, match="quant must be"):
        TrainConfig(quant="int4")
    with pytest.raises(SpecdecError, match="repo vocabulary"):
        TrainConfig(quant="int8", vocab="repo")
