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
