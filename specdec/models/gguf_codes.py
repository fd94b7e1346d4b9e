"""A GGUF's quantized weights as the codes, scales and zeros PyTorch's int4/int8 CPU kernels take.

A Q4_K super-block holds 256 weights as 8 sub-blocks of 32, each weight
w = d*sc*q - dmin*m with q a 4-bit code, sc and m 6-bit ints and d, dmin fp16 per super-block.
PyTorch's int4 kernels compute w = (q - 8)*scale + zero per group, so one sub-block is one
group of 32 with the code unchanged, scale = d*sc and zero = 8*d*sc - dmin*m: the int4 target
is the published Q4_K_M model itself, not a second rounding of it. Every other tensor type
(Q6_K, Q5_0, Q8_0, ...) is dequantized with gguf's own code and rounded again, to int8 per
output channel.

For a model that does not come from a GGUF (a hub checkpoint, the tests' tiny models),
`quantize_q4k` makes Q4_K blocks in-process, so both take the same path through `q4k_codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

QK_K = 256  # weights per Q4_K super-block
GROUP = 32  # weights per Q4_K sub-block = per int4 group
Q4K_BYTES = 144  # 2 (d) + 2 (dmin) + 12 (6-bit scales and mins) + 128 (codes)

# GGUF tensor name (without "blk.N." and ".weight") -> HF Qwen2/Llama module path (without "model.layers.N.").
# Qwen2's rows are stored in HF order (checked against the dequantized cache in tests/test_int4.py); a llama's
# Q/K rows are permuted in the file (PERMUTED_QK) and read_qwen2_linears puts them back, as transformers does.
QWEN2_LINEARS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


# architectures whose Q/K rows llama.cpp's converter permuted for its adjacent-pair RoPE (`unpermute`)
PERMUTED_QK = ("llama",)


@dataclass
class Int4Codes:
    """Group-wise asymmetric int4: w[o, i] = (codes[o, i] - 8) * scale[o, i // 32] + zero[o, i // 32]."""

    codes: torch.Tensor  # uint8 [out, in], values 0..15
    scale: torch.Tensor  # fp32 [out, in // 32]
    zero: torch.Tensor  # fp32 [out, in // 32]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight through the given scale/zero dtype (bf16: what the ATen kernel sees)."""
        scale = self.scale.to(dtype).float().repeat_interleave(GROUP, 1)
        zero = self.zero.to(dtype).float().repeat_interleave(GROUP, 1)
        return (self.codes.float() - 8) * scale + zero


@dataclass
class Int8Codes:
    """Symmetric int8 per output channel: w[o, i] = codes[o, i] * scale[o]."""

    codes: torch.Tensor  # int8 [out, in]
    scale: torch.Tensor  # fp32 [out]

    def dequantize(self) -> torch.Tensor:
        return self.codes.float() * self.scale[:, None]


def _scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12 bytes of 6-bit (scale, min) pairs of each super-block (as gguf.quants.Q4_K)."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def q4k_codes(blocks: np.ndarray, in_features: int) -> Int4Codes:
    """Raw Q4_K bytes [out, in/256*144] -> exact int4 codes with per-32 scale and zero (fp32)."""
    out = blocks.shape[0]
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, Q4K_BYTES)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)  # [nb, 1]
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = _scale_min(b[:, 4:16])  # [nb, 8] each
    qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    codes = (qs & 0x0F).reshape(out, in_features)
    scale = d * sc.astype(np.float32)  # exact: an fp16 times a 6-bit int fits fp32's mantissa
    zero = 8 * scale - dmin * mn.astype(np.float32)
    groups = in_features // GROUP
    return Int4Codes(torch.from_numpy(codes.astype(np.uint8)), torch.from_numpy(scale.reshape(out, groups)),
                     torch.from_numpy(zero.reshape(out, groups)))


def pack_q4k(codes: np.ndarray, d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The inverse of q4k_codes' unpacking: codes [nb, 256] (0..15), d/dmin [nb] (fp16), sc/mn [nb, 8]
    (0..63) -> raw Q4_K blocks [nb, 144], byte for byte as llama.cpp lays them out."""
    nb = codes.shape[0]
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    scales = np.empty((nb, 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    q = codes.astype(np.uint8).reshape(nb, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)
    return np.concatenate([d.astype(np.float16).reshape(nb, 1).view(np.uint8),
                           dmin.astype(np.float16).reshape(nb, 1).view(np.uint8), scales, qs], axis=1)


def quantize_q4k(weight: torch.Tensor) -> np.ndarray:
    """A float weight [out, in] (in divisible by 256) -> raw Q4_K blocks [out, in/256*144].

    A plain min/max rounding, not llama.cpp's search for the best scales: it exists so that a
    model without a GGUF (the tests' tiny models, a hub checkpoint) goes through the very
    same byte layout and conversion as a published Q4_K_M file.
    """
    out, in_features = weight.shape
    if in_features % QK_K:
        raise ValueError(f"Q4_K needs in_features divisible by {QK_K}, got {in_features}")
    w = weight.detach().float().reshape(-1, 8, GROUP)  # [nb, 8 sub-blocks, 32]
    lo = w.amin(-1).clamp(max=0)  # w = s*q - mn with mn = -lo >= 0
    hi = w.amax(-1)
    sub_scale = ((hi - lo) / 15).clamp(min=1e-12)
    sub_min = -lo
    d = (sub_scale.amax(-1) / 63).to(torch.float16).float().clamp(min=2 ** -24)
    dmin = (sub_min.amax(-1) / 63).to(torch.float16).float()
    sc = (sub_scale / d[:, None]).round().clamp(1, 63)
    mn = torch.where(dmin[:, None] > 0, (sub_min / dmin.clamp(min=2 ** -24)[:, None]).round(), 0).clamp(0, 63)
    s = (d[:, None] * sc)[..., None]
    q = ((w + (dmin[:, None] * mn)[..., None]) / s).round().clamp(0, 15)
    blocks = pack_q4k(q.reshape(-1, QK_K).to(torch.uint8).numpy(), d.numpy(), dmin.numpy(),
                      sc.to(torch.uint8).numpy(), mn.to(torch.uint8).numpy())
    return blocks.reshape(out, -1)


INT4_SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)  # group ranges tried by int4_groups, the least squared error kept


def int4_groups(weight: torch.Tensor) -> Int4Codes:
    """A float weight [out, in] (in % 32 == 0) -> asymmetric int4 per group of 32, W4A8's form: per group the
    range [lo, hi] shrunk towards its middle by each INT4_SHRINK factor, the one of least squared error kept (a
    clipped outlier costs less than a coarser step for the other 31), scale and zero rounded to bf16 first as
    w4a8.pack stores them, so the codes are rounded against what the kernel reads."""
    out, in_features = weight.shape
    w = weight.detach().float().reshape(out, in_features // GROUP, GROUP)
    lo, hi = w.amin(-1), w.amax(-1)
    middle, half = (hi + lo) / 2, (hi - lo) / 2
    best = None
    for shrink in INT4_SHRINK:
        scale = (2 * half * shrink / 15).clamp(min=1e-12).to(torch.bfloat16).float()
        zero = (middle - half * shrink + 8 * scale).to(torch.bfloat16).float()  # w = (code - 8) * scale + zero
        codes = ((w - zero[..., None]) / scale[..., None] + 8).round().clamp(0, 15)
        error = ((codes - 8) * scale[..., None] + zero[..., None] - w).pow(2).sum(-1)
        if best is None:
            best = [codes, scale, zero, error]
        else:
            better = error < best[3]
            best = [torch.where(better[..., None], codes, best[0]), torch.where(better, scale, best[1]),
                    torch.where(better, zero, best[2]), torch.minimum(error, best[3])]
    return Int4Codes(best[0].to(torch.uint8).reshape(out, in_features), best[1], best[2])


def int8_per_channel(weight: torch.Tensor) -> Int8Codes:
    """Symmetric round-to-nearest int8 per output channel."""
    w = weight.detach().float()
    scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
    codes = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return Int8Codes(codes, scale)


@dataclass
class GGUFTensor:
    qtype: str  # gguf.GGMLQuantizationType name: "Q4_K", "Q6_K", ...
    data: np.ndarray  # raw rows as stored (a memory map into the file)
    shape: tuple[int, int]  # (out, in), as the HF Linear's weight

    def dequantize(self) -> torch.Tensor:
        """fp32 weight through gguf's own dequantization, in memory of its own: an F32 tensor dequantizes to a view
        of the file's read-only map, which a weight must not keep (and torch will not wrap without a warning)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        out = np.ascontiguousarray(dequantize(self.data, GGMLQuantizationType[self.qtype]), dtype=np.float32)
        if not out.flags.writeable or np.may_share_memory(out, self.data):
            out = out.copy()
        return torch.from_numpy(out).reshape(self.shape)


def unpermuted_rows(rows: int, heads: int) -> np.ndarray:
    """HF row r of a llama Q or K projection (heads: its own head count) is stored as row order[r]. The inverse of
    convert_hf_to_gguf.py's LlamaModel.permute, reshape(heads, 2, D/2, ...).swapaxes(1, 2), which stores a
    head's row j < D/2 at 2j and row D/2 + j at 2j + 1 (transformers' GGUF loader undoes it the same way)."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(rows)


def unpermute(tensor: GGUFTensor, heads: int) -> GGUFTensor:
    """A permuted Q or K tensor's raw rows in HF order: a row is whole blocks of its type, so codes move as is."""
    order = unpermuted_rows(tensor.shape[0], heads)
    return GGUFTensor(tensor.qtype, np.ascontiguousarray(tensor.data[order]), tensor.shape)


def read_qwen2_linears(path: Path | str) -> dict[str, GGUFTensor]:
    """HF module path ("model.layers.3.mlp.down_proj", "lm_head", "model.embed_tokens") -> its GGUF tensor;
    a llama's Q/K rows back in HF order (unpermute), as transformers' loader reads them."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch_field = reader.fields.get("general.architecture")
    arch = arch_field.contents() if arch_field is not None else ""
    heads = {}
    if arch in PERMUTED_QK:
        q_heads = int(reader.fields[f"{arch}.attention.head_count"].contents())
        kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
        heads = {"attn_q": q_heads, "attn_k": int(kv_field.contents()) if kv_field is not None else q_heads}
    found = {}
    for t in reader.tensors:
        if not t.name.endswith(".weight"):
            continue
        stem = t.name[: -len(".weight")]
        if stem == "output":
            hf = "lm_head"
        elif stem == "token_embd":
            hf = "model.embed_tokens"
        elif stem.startswith("blk."):
            _, layer, part = stem.split(".", 2)
            if part not in QWEN2_LINEARS:
                continue
            hf = f"model.layers.{layer}.{QWEN2_LINEARS[part]}"
        else:
            continue
        shape = (int(t.shape[1]), int(t.shape[0]))  # GGUF lists ne0 (the input dim) first
        found[hf] = GGUFTensor(t.tensor_type.name, t.data, shape)
        if stem.startswith("blk.") and part in heads:
            found[hf] = unpermute(found[hf], heads[part])
    return found
