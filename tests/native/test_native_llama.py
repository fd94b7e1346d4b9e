"""The Llama architecture (DeepSeek-Coder, CodeLlama) on the native forward: a llama GGUF, Q/K permuted in the
file as llama.cpp's converter permutes them, computes what transformers' LlamaForCausalLM loaded from the same
GGUF computes (fp32 reference: to float rounding; its own kernels: as close as today's int4 target); what it
cannot serve is refused in one line; its tokenizer comes from the file with DeepSeek-Coder's FIM tokens; and a
llama GGUF spec completes through the engine, greedy output equal to plain greedy. (The bitwise exactness of
a row across passes runs for the llama config in test_native_exact.py.)"""

from pathlib import Path

import numpy as np
import pytest
import torch
from native_models import (LLAMA_SCALE, VOCAB, _cached_gguf, hf_llama_model, kernels_or_skip, native_model,
                           plain_greedy, write)

import tiny
from gguf_files import llama_permute
from specdec.errors import SpecdecError

TOKENS = [5, 17, 99, 250, 3, 3, 42, 380, 7, 120, 64, 200, 11, 13, 300, 301, 2, 9, 77, 150] * 3  # 60 tokens
DEEPSEEK_SPECIALS = ("<｜end▁of▁sentence｜>", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>",
                     "<｜begin▁of▁sentence｜>")


def transformers_from_gguf(rope_scale: float | None, tied: bool = False):
    """LlamaForCausalLM as transformers loads the GGUF (gguf_file=: dequantized, Q/K unpermuted by its own code).
    Its GGUF loader reads no llama RoPE scaling, so a scaled file's weights go into a model configured as the
    file says (linear, the factor)."""
    from transformers import AutoModelForCausalLM

    path = Path(_cached_gguf(0, 2, tied, "llama", rope_scale))
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model = hf_llama_model(0, 2, rope_scale)
    state = loaded.state_dict()
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)
    return model.eval()


def test_unpermuting_inverts_llama_cpps_permute():
    from specdec.models.gguf_codes import unpermuted_rows

    for heads, rows in ((4, 256), (2, 128), (32, 4096)):
        original = torch.arange(rows * 3).reshape(rows, 3)
        assert torch.equal(llama_permute(original, heads)[torch.from_numpy(unpermuted_rows(rows, heads))], original)


@pytest.mark.parametrize("ops", ["compiled", "torch-reference"])
@pytest.mark.parametrize("rope_scale,tied", [(None, False), (LLAMA_SCALE, False), (LLAMA_SCALE, True)])
def test_dense_reference_equals_transformers_loaded_from_the_gguf(rope_scale, tied, ops, monkeypatch):
    """Same dequantized weights in fp32: the Q/K rows put back in HF order (Q4_K, Q8_0 and F16 rows), no QKV
    bias, NeoX RoPE with the file's theta and linear factor, GQA, the output layer (token_embd when tied)."""
    from specdec.native import layers

    if ops == "torch-reference":
        monkeypatch.setattr(layers, "_ops", lambda: None)
    elif not layers.ops_available():
        pytest.skip(f"the native ops cannot run here: {layers.ops_unavailable_reason()}")
    expected = transformers_from_gguf(rope_scale, tied)(torch.tensor([TOKENS])).logits[0]
    lm = native_model(tied=tied, dense=True, cache_dtype=torch.float32, arch="llama",
                      rope_scale=rope_scale).new_cached_lm()
    assert lm.model.config.architecture == "llama" and lm.model.config.rope_scale == (rope_scale or 1.0)
    assert all(layer.qkv_bias is None for layer in lm.model.weights.layers)
    got = torch.cat([lm.extend(TOKENS[:37]), lm.extend(TOKENS[37:])])  # a prefix then more: positions carry on
    assert got.shape == (len(TOKENS), VOCAB)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-4 * expected.abs().max().item())


@pytest.mark.parametrize("rope_scale", [None, LLAMA_SCALE])
def test_kernels_compute_what_the_int4_target_computes_on_a_llama_gguf(rope_scale):
    """On W4A8/W8A8 the native forward is today's int4 target (transformers with specdec.models.int4's layers
    over the same GGUF codes, which read_qwen2_linears unpermutes too) up to float order, which may move an
    activation across an int8 rounding boundary now and then: every row within cosine 0.99, 0.999 on average
    (a wrong row order in any Q/K matrix puts rows near 0.9, as far as the float model is)."""
    kernels_or_skip()
    from specdec.models.int4 import TargetQuantConfig, quantize_target

    reference = transformers_from_gguf(rope_scale)
    quantize_target(reference, TargetQuantConfig("int4", dense_rows=0, kernel="w4a8"),
                    _cached_gguf(0, 2, False, "llama", rope_scale), torch.float32)
    expected = reference(torch.tensor([TOKENS])).logits[0]
    got = native_model(cache_dtype=torch.float32, arch="llama", rope_scale=rope_scale).new_cached_lm().extend(TOKENS)
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
    assert cosine.min() > 0.99 and cosine.mean() > 0.999, cosine
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


def test_the_older_linear_scaling_key_is_read(tmp_path):
    from gguf import GGUFReader

    from specdec.native.gguf_weights import read_config

    path = write(tmp_path / "legacy.gguf", arch="llama", layers=1, legacy_scale_key=True)
    assert read_config(GGUFReader(str(path))).rope_scale == LLAMA_SCALE


@pytest.mark.parametrize("extra,message", [
    (lambda w: w.add_string("llama.rope.scaling.type", "yarn"), "plain or linear RoPE; this GGUF's is yarn"),
    (lambda w: w.add_tensor("rope_freqs.weight", np.ones(32, dtype=np.float32)), "rope_freqs.weight"),
    (lambda w: w.add_uint32("llama.expert_count", 8), "mixture of experts"),
    (lambda w: w.add_uint32("llama.rope.dimension_count", 32), "ropes 32 of 64 dimensions"),
    (lambda w: w.add_tensor("blk.0.ffn_extra.weight", np.ones((24, 256), dtype=np.float32)),
     "blk.0.ffn_extra.weight (24x256) does not fit the W4A8/W8A8 tiles"),
])
def test_what_the_native_forward_cannot_serve_is_refused_in_one_line(tmp_path, extra, message):
    from specdec.native.loading import choose, why_not_native

    path = write(tmp_path / "odd.gguf", arch="llama", layers=1, extra=extra)
    reason, gguf = why_not_native(str(path))
    assert message in reason and "\n" not in reason and gguf is None
    assert choose("auto", str(path)) is None  # transformers serves it
    with pytest.raises(SpecdecError, match="--forward native cannot run"):
        choose("native", str(path))


@pytest.fixture(scope="module")
def deepseek_gguf(tmp_path_factory):
    """A tiny llama GGUF whose tokenizer holds DeepSeek-Coder's specials (and no Qwen FIM tokens)."""
    tokenizer = tiny.tokenizer(VOCAB, specials=DEEPSEEK_SPECIALS)
    return write(tmp_path_factory.mktemp("deepseek") / "tiny-deepseek.gguf", arch="llama", tokenizer=tokenizer)


def test_the_tokenizer_from_the_gguf_keeps_deepseeks_fim_tokens(deepseek_gguf):
    """transformers spells a byte-level file's `<｜...｜>` control tokens in bytes; gguf_tokenizer gives them back
    their text at their ids, so FIM detection finds DeepSeek-Coder's template and a prompt encodes as the
    model's own tokenizer encodes it."""
    from specdec.models.gguf_tokenizer import from_gguf
    from specdec.prompts import fim

    original = tiny.tokenizer(VOCAB, specials=DEEPSEEK_SPECIALS)
    restored = from_gguf(deepseek_gguf)
    vocab = restored.get_vocab()
    assert all(vocab.get(token) == i for token, i in original.get_vocab().items())
    assert fim.detect(restored).family == "deepseek"
    text = "<｜fim▁begin｜>def add(a, b):\n    return a<｜fim▁hole｜>\n<｜fim▁end｜>"
    assert restored.encode(text, add_special_tokens=False) == original.encode(text, add_special_tokens=False)
    assert restored.eos_token == "<｜end▁of▁sentence｜>" and restored.eos_token_id == 0


@pytest.mark.parametrize("strategy", ["lookup", "tree"])
def test_a_llama_gguf_completes_end_to_end(deepseek_gguf, strategy, tmp_path):
    """`specdec complete`'s path (backends.local.build): the llama GGUF loads natively with its own tokenizer,
    the DeepSeek-Coder FIM prompt is built, and the speculative session's greedy output is plain greedy's
    (`tree`: with another llama GGUF as the draft model)."""
    kernels_or_skip()
    from specdec.backends.local import LoadSpec, build
    from specdec.engine.session import GenerationConfig
    from specdec.native.lm import NativeModel
    from specdec.prompts import fim

    draft = ""
    if strategy == "tree":
        draft = str(write(tmp_path / "draft.gguf", seed=1, layers=1, arch="llama",
                          tokenizer=tiny.tokenizer(VOCAB, specials=DEEPSEEK_SPECIALS)))
    built = build(LoadSpec(str(deepseek_gguf), draft, strategy, forward="native"))
    model, tokenizer = built.pair.target.model, built.pair.target.tokenizer
    assert isinstance(model, NativeModel) and model.model.config.architecture == "llama"
    template = fim.detect(tokenizer)
    assert template.family == "deepseek"
    prefix, suffix = "for i in range(10):\n    print(i)\nfor i in range(10):\n    ", "\n"
    prompt = built.completer.prompt(prefix, suffix, "m.py").ids
    vocab = tokenizer.get_vocab()
    assert prompt[0] == vocab["<｜fim▁begin｜>"] and prompt[-1] == vocab["<｜fim▁end｜>"]
    out = built.completer.complete(prefix, suffix, GenerationConfig(max_new_tokens=24), "m.py")
    assert out.tokens == plain_greedy(model, prompt, 24, fim.stop_token_ids(tokenizer, template))
    assert out.stop_reason in ("eos", "max_tokens")
