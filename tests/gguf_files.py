"""A GGUF written from a tiny model, laid out as a published Q4_K_M file lays out its tensors."""

import torch

from specdec.models.gguf_codes import quantize_q4k


def write_tiny_gguf(model, path):
    """A GGUF of the tiny model's Linear layers as a Q4_K_M file holds them: Q4_K blocks, with
    lm_head in another type (Q8_0 here) so the int8 route through gguf's dequantizer runs too."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    names = {v: k for k, v in {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                               "ffn_down": "mlp.down_proj"}.items()}
    writer = GGUFWriter(str(path), "qwen2")
    for full, module in model.named_modules():
        if type(module) is not torch.nn.Linear:
            continue
        if full == "lm_head":
            data = quantize(module.weight.detach().float().numpy(), GGMLQuantizationType.Q8_0)
            writer.add_tensor("output.weight", data, raw_dtype=GGMLQuantizationType.Q8_0)
            continue
        _, _, layer, part = full.split(".", 3)
        writer.add_tensor(f"blk.{layer}.{names[part]}.weight", quantize_q4k(module.weight),
                          raw_dtype=GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


QWEN2_PARTS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}


def write_qwen2_gguf(model, path, types=None, embedding="Q8_0", output="Q8_0", tied=False, tokenizer=None,
                     extra=None):
    """A whole Qwen2 GGUF of a transformers Qwen2 model, as llama.cpp names and lays it out: the metadata the
    native forward reads, token_embd, norms and biases in F32, each Linear in the type `types` gives it
    ({"blk.1.attn_v": "Q5_0", ...}; Q4_K by default), output.weight unless tied (then token_embd serves).
    tokenizer: a PreTrainedTokenizerFast (byte-level BPE) whose vocabulary and merges go in as llama.cpp's
    tokenizer.ggml.* keys, so transformers can build the tokenizer from the file. extra(writer) as in
    write_llama_gguf (a key added again replaces the first)."""
    _write_gguf("qwen2", model, path, types, embedding, output, tied, tokenizer, extra=extra)


def write_llama_gguf(model, path, types=None, embedding="Q8_0", output="Q8_0", tied=False, tokenizer=None,
                     rope_scale: float | None = None, legacy_scale_key: bool = False, extra=None):
    """A llama GGUF of a transformers LlamaForCausalLM, as llama.cpp's convert_hf_to_gguf.py writes one: Q/K
    weights (and biases) permuted for its adjacent-pair RoPE (`llama_permute`), rope.dimension_count, the
    vocabulary size, linear RoPE scaling as rope.scaling.type/factor (or the older rope.scale_linear key);
    a DeepSeek-Coder-style byte-level tokenizer; extra(writer), when given, adds keys or tensors of its own
    before the model's tensors. The rest as write_qwen2_gguf."""
    _write_gguf("llama", model, path, types, embedding, output, tied, tokenizer, rope_scale, legacy_scale_key, extra)


def llama_permute(weights, n_head: int, n_head_kv: int | None = None):
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows from HF's halves order to interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _write_gguf(arch, model, path, types, embedding, output, tied, tokenizer, rope_scale=None,
                legacy_scale_key=False, extra=None):
    from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType
    from gguf.quants import quantize

    types = types or {}
    config = model.config

    def add(writer, name, weight, qtype):
        w = weight.detach().float()
        if qtype == "Q4_K":
            writer.add_tensor(name, quantize_q4k(w), raw_dtype=GGMLQuantizationType.Q4_K)
        elif qtype == "F32":
            writer.add_tensor(name, w.numpy())
        else:
            kind = GGMLQuantizationType[qtype]
            writer.add_tensor(name, quantize(w.numpy(), kind), raw_dtype=kind)

    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"] if hasattr(config, "rope_parameters")
                                    else config.rope_theta))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch == "llama":
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
        writer.add_vocab_size(config.vocab_size)
        if rope_scale is not None and legacy_scale_key:
            writer.add_float32(f"{arch}.rope.scale_linear", rope_scale)
        elif rope_scale is not None:
            writer.add_rope_scaling_type(RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope_scale)
    if tokenizer is not None:
        _add_tokenizer(writer, tokenizer, "deepseek-coder" if arch == "llama" else "qwen2")
    if extra is not None:
        extra(writer)
    state = model.state_dict()
    if arch == "llama":
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        for i in range(config.num_hidden_layers):
            for end in ("weight", "bias"):
                q, k = f"model.layers.{i}.self_attn.q_proj.{end}", f"model.layers.{i}.self_attn.k_proj.{end}"
                if q in state:
                    state[q] = llama_permute(state[q], heads, heads)
                    state[k] = llama_permute(state[k], heads, kv_heads)
    add(writer, "token_embd.weight", state["model.embed_tokens.weight"], embedding)
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        add(writer, f"blk.{i}.attn_norm.weight", state[prefix + "input_layernorm.weight"], "F32")
        add(writer, f"blk.{i}.ffn_norm.weight", state[prefix + "post_attention_layernorm.weight"], "F32")
        for part, module in QWEN2_PARTS.items():
            add(writer, f"blk.{i}.{part}.weight", state[prefix + module + ".weight"],
                types.get(f"blk.{i}.{part}", "Q4_K"))
            if prefix + module + ".bias" in state:
                add(writer, f"blk.{i}.{part}.bias", state[prefix + module + ".bias"], "F32")
    add(writer, "output_norm.weight", state["model.norm.weight"], "F32")
    if not tied:
        add(writer, "output.weight", state["lm_head.weight"], output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_tokenizer(writer, tokenizer, pre: str = "qwen2") -> None:
    """llama.cpp's gpt2-style BPE keys from a byte-level BPE PreTrainedTokenizerFast."""
    import json

    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(tokenizer.all_special_tokens) | {t.content for t in tokenizer.added_tokens_decoder.values()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control, 1: normal
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_bos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)


def gguf_tokenizer():
    """The tiny tokenizer padded to 384 ids: the models' rows, so transformers reads the GGUF's vocabulary size as
    the model's (and 384 is a multiple of the native output layer's 16-column tiles)."""
    import tiny

    return tiny.tokenizer(extra_specials=tuple(f"<|pad_{i}|>" for i in range(12)))


def gguf_pair_models():
    """The transformers models gguf_pair writes: (target, draft), different random weights, 256 wide (the narrowest
    Q4_K's super-blocks fit), 2 layers, the padded tokenizer's vocabulary."""
    import tiny

    return tuple(tiny.model(seed=seed, vocab_size=len(gguf_tokenizer()), hidden=256, layers=2) for seed in (1, 2))


def gguf_pair(folder):
    """[target.gguf, draft.gguf] under `folder`: gguf_pair_models written as Qwen2 GGUFs, the tokenizer in each
    file, as a catalog pull keeps them (the native forward runs both)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, model in zip(("target", "draft"), gguf_pair_models()):
        write_qwen2_gguf(model, folder / f"{name}.gguf", tokenizer=gguf_tokenizer())
        paths.append(folder / f"{name}.gguf")
    assert len(gguf_tokenizer()) == 384
    return paths
