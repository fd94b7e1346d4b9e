"""A Qwen2 or Llama GGUF read tensor by tensor into the native model's weights, never the whole model in floats.

Q4_K tensors keep their codes and run W4A8 (specdec.models.gguf_codes.q4k_codes -> w4a8.pack); every other
quantized or float matrix (Q6_K, Q8_0, Q5_0, Q5_K, F16, ...) is dequantized one tensor at a time with gguf's own
code and rounded to int8 per output channel for W8A8. Norms and biases stay fp32. The token embedding stays in
the file: a lookup dequantizes the rows it needs from a memory map of that tensor alone, so the page cache
holds it once for every process. Without output.weight the output layer is token_embd (tied embeddings).

`dense=True` keeps every matrix as its fp32 dequantization instead: the reference the tests compare
transformers against (same weights, torch's matmuls).

Tensor names are llama.cpp's (blk.N.attn_q.weight, ...). The two architectures are one decoder (qwen2.py):
Qwen2 has QKV biases, Llama (DeepSeek-Coder, CodeLlama) none. Qwen2's Q/K rows are stored in HF order, RoPE
NeoX-style (halves rotated), as llama.cpp's qwen2 graph computes it. llama.cpp's converter permutes a llama's
Q/K rows (and biases) head by head for its adjacent-pair RoPE; gguf_codes.unpermute puts them back in HF order
as raw rows, before any conversion (each row is whole blocks of its own type, so the codes move unchanged), and
the same NeoX RoPE runs.
RoPE: the GGUF's theta and linear scaling (positions / factor, transformers' "linear" rope); other scalings
(YaRN, llama3's rope_freqs) and mixtures of experts are refused with the reason, and keep transformers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.models import w4a8
from specdec.models.gguf_codes import (PERMUTED_QK, GGUFTensor, Int4Codes, Int8Codes, int4_groups, int8_per_channel,
                                       q4k_codes, unpermute, unpermuted_rows)
from specdec.native.layers import Linear

ARCHITECTURES = ("qwen2", "llama")
CONVERT_ROWS = 4096  # rows dequantized at a time when a matrix is rounded to int8


@dataclass(frozen=True)
class Qwen2Config:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    eps: float
    context_length: int
    rope_scale: float = 1.0  # linear RoPE scaling: angle = position / rope_scale * inv_freq
    architecture: str = "qwen2"


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # f32[d]
    qkv: Concat  # -> q | k | v, before the bias
    qkv_bias: torch.Tensor | None  # f32[(Hq + 2 Hk) D], added with RoPE and the cache write (layers.qkv_rope_cache)
    o: Linear
    ffn_norm: torch.Tensor
    gate_up: Concat  # -> gate | up
    down: Linear


@dataclass
class Qwen2Weights:
    config: Qwen2Config
    embedding: Embedding
    layers: list[LayerWeights]
    output_norm: torch.Tensor
    output: Linear
    source: Path

    def nbytes(self) -> int:
        """Bytes the weights hold in memory (the embedding's map excluded: the page cache holds it)."""
        total = self.output.nbytes() + self.output_norm.numel() * 4
        for layer in self.layers:
            vectors = [layer.attn_norm, layer.ffn_norm] + ([] if layer.qkv_bias is None else [layer.qkv_bias])
            total += (layer.qkv.nbytes() + layer.o.nbytes() + layer.gate_up.nbytes() + layer.down.nbytes()
                      + 4 * sum(v.numel() for v in vectors))
        return total


class Concat:
    """Several Linears over the same input as one, outputs side by side: those of the same kernel packed into
    one matrix (one activation rounding, one call), a kernel change starting another. A column's arithmetic is
    its own in either form, so fusing changes no bit."""

    def __init__(self, parts: list[Linear]):
        self.parts = parts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        outs = [part(x) for part in self.parts]
        return outs[0] if len(outs) == 1 else torch.cat(outs, 1)

    def nbytes(self) -> int:
        return sum(part.nbytes() for part in self.parts)


class Embedding:
    """token_embd kept in the file in its own type; rows dequantized at lookup (f32[n, d]).

    gguf's dequantize costs ~0.2 ms a call whatever the row count (3% of the draft's decode step, 1% of the
    target's), so the rows a process has dequantized are kept (at most ROWS_KEPT of them, the least recently used
    dropped first): a decode step's one token is nearly always one the prompt already had. The values are the same."""

    ROWS_KEPT = 4096  # fp32 rows: 24 MiB at most for a 1.5B (1536 wide), 14 MiB for a 0.5B

    def __init__(self, path: Path, offset: int, qtype: str, rows: int, width: int):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.qtype, self.rows, self.width, self.offset = GGMLQuantizationType[qtype], rows, width, offset
        block, size = GGML_QUANT_SIZES[self.qtype]
        self.data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(rows, width // block * size))
        self._kept: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        index = ids.numpy()
        if index.size and (index.min() < 0 or index.max() >= self.rows):
            raise SpecdecError(f"token id {int(index.max() if index.max() >= self.rows else index.min())} is "
                               f"outside the model's vocabulary of {self.rows}")
        with self._lock:
            found = {i: self._kept.get(i) for i in set(index.tolist())}
            for i, row in found.items():
                if row is not None:
                    self._kept.move_to_end(i)
            missing = sorted(i for i, row in found.items() if row is None)
            if missing:
                for i, row in zip(missing, self.dequantize(np.array(missing))):
                    found[i] = row
                    self._kept[i] = row
                while len(self._kept) > self.ROWS_KEPT:
                    self._kept.popitem(last=False)
        return torch.stack([found[i] for i in index.tolist()]) if index.size else torch.empty(0, self.width)

    def dequantize(self, index: np.ndarray) -> torch.Tensor:
        """The rows `index` straight from the file: f32[len(index), d]."""
        from gguf.quants import dequantize

        rows = dequantize(np.ascontiguousarray(self.data[index]), self.qtype)
        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)).reshape(len(index), self.width)

    def tensor(self) -> GGUFTensor:
        return GGUFTensor(self.qtype.name, self.data, (self.rows, self.width))


def _codes(tensor: GGUFTensor, dense: bool, int4: bool = False) -> Int4Codes | Int8Codes | torch.Tensor:
    """The form a matrix runs in: Q4_K codes as they are, anything else int8 per channel (fp32 when dense; int4
    per group of 32 when int4, a draft's cheaper step: gguf_codes.int4_groups)."""
    if dense:
        return tensor.dequantize()
    if tensor.qtype == "Q4_K" and w4a8.tiles(*tensor.shape):
        return q4k_codes(tensor.data, tensor.shape[1])
    if not w4a8.tiles(*tensor.shape):
        raise SpecdecError(f"a {tensor.shape[0]}x{tensor.shape[1]} matrix does not fit the W4A8/W8A8 tiles "
                           f"(out % {w4a8.TILE_N}, in % {w4a8.GROUP}): the native forward cannot run this model")
    # rows a slice at a time (per channel, so exact): the vocabulary's output layer never sits in memory as floats
    parts = [(int4_groups if int4 else int8_per_channel)(
                 GGUFTensor(tensor.qtype, tensor.data[r : r + CONVERT_ROWS],
                            (min(CONVERT_ROWS, tensor.shape[0] - r), tensor.shape[1])).dequantize())
             for r in range(0, tensor.shape[0], CONVERT_ROWS)]
    if int4:
        return Int4Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "zero")))
    return Int8Codes(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]))


def _linear(codes: Int4Codes | Int8Codes | torch.Tensor, bias: torch.Tensor | None) -> Linear:
    if isinstance(codes, Int4Codes):
        out, inp = codes.codes.shape
        return Linear("w4a8", out, inp, packed=w4a8.pack(codes.codes, codes.scale, codes.zero), bias=bias)
    if isinstance(codes, Int8Codes):
        out, inp = codes.codes.shape
        return Linear("w8a8", out, inp, packed=w4a8.pack8(codes.codes), scale=codes.scale.float().contiguous(),
                      bias=bias)
    return Linear("dense", codes.shape[0], codes.shape[1], weight=codes.float().contiguous(), bias=bias)


def _concat(parts: list[tuple[Int4Codes | Int8Codes | torch.Tensor, torch.Tensor | None]]) -> Concat:
    """Neighbours of one form fused into one Linear (their rows, scales and biases stacked)."""
    groups: list[list] = []
    for codes, bias in parts:
        if groups and type(groups[-1][0][0]) is type(codes):
            groups[-1].append((codes, bias))
        else:
            groups.append([(codes, bias)])
    linears = []
    for group in groups:
        first = group[0][0]
        biases = [b for _, b in group]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b if b is not None else torch.zeros(_rows(c)) for (c, _), b in zip(group, biases)])
        if isinstance(first, Int4Codes):
            codes = Int4Codes(*(torch.cat([getattr(c, f) for c, _ in group]) for f in ("codes", "scale", "zero")))
        elif isinstance(first, Int8Codes):
            codes = Int8Codes(torch.cat([c.codes for c, _ in group]), torch.cat([c.scale for c, _ in group]))
        else:
            codes = torch.cat([c for c, _ in group])
        linears.append(_linear(codes, bias))
    return Concat(linears)


def _rows(codes) -> int:
    return codes.codes.shape[0] if isinstance(codes, (Int4Codes, Int8Codes)) else codes.shape[0]


# Every hyper-parameter the native forward takes from a GGUF, bounded (llama.cpp's key without the architecture:
# low, high). A value outside is a one-line refusal naming the file and the key, never a division by zero in the
# check, an empty model that fails at its first forward, or a table sized by a corrupt number.
LIMITS = {
    "block_count": (1, 1024),
    "embedding_length": (32, 1 << 16),
    "feed_forward_length": (32, 1 << 18),
    "attention.head_count": (1, 1024),
    "attention.head_count_kv": (1, 1024),
    "attention.key_length": (2, 256),  # the attention op's head sizes (even: RoPE rotates halves)
    "attention.value_length": (2, 256),
    "rope.dimension_count": (2, 256),
    "context_length": (1, 1 << 24),  # a bound only: RoPE's table is sized by a cache's capacity (qwen2.Qwen2)
    "expert_count": (0, 1 << 16),
    "rope.freq_base": (1.0, 1e12),
    "attention.layer_norm_rms_epsilon": (1e-12, 0.1),
    "rope.scaling.factor": (0.0, 1024.0),  # 0: unset (the older rope.scale_linear key may hold it)
    "rope.scale_linear": (1e-6, 1024.0),
}


def _name(path) -> str:
    return Path(path).name if path is not None else "the GGUF"


def _field(reader, key: str, default=None, path=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise SpecdecError(f"{_name(path)} lacks {key}: not a model llama.cpp would run")
        return default
    return field.contents()


def _number(reader, arch: str, key: str, default, path=None):
    """The hyper-parameter {arch}.{key}, within LIMITS[key] (default when the file lacks it; None: required)."""
    low, high = LIMITS[key]
    field = reader.fields.get(f"{arch}.{key}")
    if field is None:
        if default is None:
            raise SpecdecError(f"{_name(path)} lacks {arch}.{key}: not a model llama.cpp would run")
        return default
    try:
        value = field.contents()
    except (IndexError, ValueError, UnicodeDecodeError):
        value = None
    kind = float if isinstance(low, float) else int
    number = kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or number != value or not low <= number <= high:  # NaN fails every comparison
        shown = value if isinstance(value, (int, float, str)) else type(value).__name__
        raise SpecdecError(f"{_name(path)}: {arch}.{key} is {shown!r}; the native forward takes {low:g}..{high:g}")
    return number


def _rope_scale(reader, arch: str, path=None) -> float:
    """The linear RoPE factor (1.0 without scaling); any other scaling is a one-line refusal."""
    kind = _field(reader, f"{arch}.rope.scaling.type", "none", path)
    legacy = reader.fields.get(f"{arch}.rope.scale_linear")  # older converters' key for linear scaling
    if kind == "none" and legacy is None:
        return 1.0
    if kind not in ("none", "linear"):
        raise SpecdecError(f"the native forward runs plain or linear RoPE; this GGUF's is {kind}")
    return _number(reader, arch, "rope.scaling.factor", 0.0, path) or _number(reader, arch, "rope.scale_linear", 1.0,
                                                                               path)


def problem(path: Path | str) -> str:
    """Why the GGUF at path is not a model the native forward runs ('' when it is): its architecture, its
    metadata and tensors checked without reading a weight."""
    try:
        reader = _reader(path)
        read_config(reader, path)
    except SpecdecError as exc:
        return str(exc)
    multiplied = "output.weight" if any(t.name == "output.weight" for t in reader.tensors) else "token_embd.weight"
    for t in reader.tensors:  # every matrix the kernels read, by its shape alone (tied: the embedding)
        if len(t.shape) == 2 and (t.name.startswith("blk.") or t.name == multiplied):
            out, inp = int(t.shape[1]), int(t.shape[0])
            if not w4a8.tiles(out, inp):
                return (f"{t.name} ({out}x{inp}) does not fit the W4A8/W8A8 tiles (out % {w4a8.TILE_N}, "
                        f"in % {w4a8.GROUP})")
    return ""


def _reader(path: Path | str):
    """gguf's reader over the file; whatever it raises on a file that is not a GGUF (a 16-byte file is an
    IndexError in its header parser) is one line naming the file."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - a parser of arbitrary bytes: any exception means "not a GGUF"
        text = str(exc).strip()
        raise SpecdecError(f"cannot read {_name(path)} as a GGUF ({type(exc).__name__}: "
                           f"{text.splitlines()[0] if text else 'malformed'})") from None


def read_config(reader, path: Path | str | None = None) -> Qwen2Config:
    """The model's hyper-parameters, each within LIMITS, and every tensor the forward reads present in the shape
    they give (check_shapes): what contradicts them is refused here, not at the kernels' checks."""
    arch = _field(reader, "general.architecture", None, path)
    if arch not in ARCHITECTURES:
        raise SpecdecError(f"the native forward runs {', '.join(ARCHITECTURES)} GGUFs; this one is {arch}")
    hidden = _number(reader, arch, "embedding_length", None, path)
    heads = _number(reader, arch, "attention.head_count", None, path)
    if _number(reader, arch, "expert_count", 0, path) > 0:
        raise SpecdecError(f"the native forward runs dense models; this {arch} GGUF is a mixture of experts")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise SpecdecError("the native forward runs plain or linear RoPE; this GGUF scales RoPE per frequency "
                           "(rope_freqs.weight, llama3-style)")
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None or len(embd.shape) != 2:
        raise SpecdecError(f"{_name(path)} has no token_embd.weight matrix")
    default_head = hidden // heads if hidden % heads == 0 else None  # else key_length must say it
    head_dim = _number(reader, arch, "attention.key_length", default_head, path)
    if _number(reader, arch, "attention.value_length", head_dim, path) != head_dim:
        raise SpecdecError("the native forward needs keys and values of one head size")
    if _number(reader, arch, "rope.dimension_count", head_dim, path) != head_dim:
        raise SpecdecError(f"the native forward rotates whole heads; this GGUF ropes "
                           f"{_field(reader, f'{arch}.rope.dimension_count')} of {head_dim} dimensions")
    if head_dim % 2:
        raise SpecdecError(f"{_name(path)}: the head size {head_dim} is odd; RoPE rotates halves")
    kv_heads = _number(reader, arch, "attention.head_count_kv", heads, path)
    if heads % kv_heads:
        raise SpecdecError(f"{_name(path)}: {arch}.attention.head_count {heads} is not a multiple of "
                           f"{arch}.attention.head_count_kv {kv_heads}")
    config = Qwen2Config(
        vocab=int(embd.shape[1]), hidden=hidden, intermediate=_number(reader, arch, "feed_forward_length", None, path),
        layers=_number(reader, arch, "block_count", None, path), heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        rope_theta=_number(reader, arch, "rope.freq_base", 10000.0, path),
        eps=_number(reader, arch, "attention.layer_norm_rms_epsilon", 1e-6, path),
        context_length=_number(reader, arch, "context_length", 32768, path),
        rope_scale=_rope_scale(reader, arch, path), architecture=arch)
    check_shapes(reader, config, path)
    return config


def check_shapes(reader, config: Qwen2Config, path: Path | str | None = None) -> None:
    """Every tensor the forward reads is in the file, in the shape (out, in) the hyper-parameters give it."""
    c, arch = config, config.architecture
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    head = (f"{arch}.attention.key_length {c.head_dim}" if f"{arch}.attention.key_length" in reader.fields
            else f"head size {c.head_dim}")
    why_q = f"{arch}.attention.head_count {c.heads} x {head}"
    why_kv = f"{arch}.attention.head_count_kv {c.kv_heads} x {head}"
    why_d, why_f = f"{arch}.embedding_length {c.hidden}", f"{arch}.feed_forward_length {c.intermediate}"
    why_v = f"token_embd's {c.vocab} rows"
    expected = {"output_norm.weight": ((c.hidden,), why_d), "output.weight": ((c.vocab, c.hidden), f"{why_v}, {why_d}"),
                "token_embd.weight": ((c.vocab, c.hidden), why_d)}
    required = ["output_norm.weight", "token_embd.weight"]
    for i in range(c.layers):
        b = f"blk.{i}."
        layer = {"attn_norm.weight": ((c.hidden,), why_d), "ffn_norm.weight": ((c.hidden,), why_d),
                 "attn_q.weight": ((q, c.hidden), f"{why_q}, {why_d}"),
                 "attn_k.weight": ((kv, c.hidden), f"{why_kv}, {why_d}"),
                 "attn_v.weight": ((kv, c.hidden), f"{why_kv}, {why_d}"),
                 "attn_output.weight": ((c.hidden, q), f"{why_d}, {why_q}"),
                 "ffn_gate.weight": ((c.intermediate, c.hidden), f"{why_f}, {why_d}"),
                 "ffn_up.weight": ((c.intermediate, c.hidden), f"{why_f}, {why_d}"),
                 "ffn_down.weight": ((c.hidden, c.intermediate), f"{why_d}, {why_f}")}
        required += [b + name for name in layer]
        layer.update({"attn_q.bias": ((q,), why_q), "attn_k.bias": ((kv,), why_kv), "attn_v.bias": ((kv,), why_kv),
                      "attn_output.bias": ((c.hidden,), why_d)})
        expected.update({b + name: shape for name, shape in layer.items()})
    found = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}  # GGUF lists ne0 (in) first
    missing = [name for name in required if name not in found]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise SpecdecError(f"{_name(path)} lacks {', '.join(missing[:3])}{more}")
    for name, (shape, why) in expected.items():
        got = found.get(name)
        if got is not None and got != shape and not (len(shape) == 1 and got == (1, *shape)):
            raise SpecdecError(f"{_name(path)}: {name} is {'x'.join(map(str, got))}; its metadata says "
                               f"{'x'.join(map(str, shape))} ({why})")


def read_qwen2(path: Path | str, dense: bool = False, int4: bool = False) -> Qwen2Weights:
    """The GGUF at path (any of ARCHITECTURES) as the native model's weights (see the module's docstring for
    what becomes what; int4: the matrices that are not Q4_K rounded to int4 per group of 32, not int8 per channel)."""
    path = Path(path)
    reader = _reader(path)
    config = read_config(reader, path)
    raw = {t.name: t for t in reader.tensors}

    def matrix(name: str) -> GGUFTensor:
        t = raw.get(name)
        if t is None:
            raise SpecdecError(f"the GGUF lacks {name}")
        return GGUFTensor(t.tensor_type.name, t.data, (int(t.shape[1]), int(t.shape[0])))

    def vector(name: str, required: bool = True) -> torch.Tensor | None:
        t = raw.get(name)
        if t is None:
            if required:
                raise SpecdecError(f"the GGUF lacks {name}")
            return None
        return GGUFTensor(t.tensor_type.name, t.data, (1, int(t.n_elements))).dequantize()[0]  # memory of its own

    heads = {"q": config.heads, "k": config.kv_heads}
    permuted = config.architecture in PERMUTED_QK

    def projection(name: str, part: str) -> GGUFTensor:
        tensor = matrix(name)
        return unpermute(tensor, heads[part]) if permuted and part in heads else tensor

    def projection_bias(name: str, part: str) -> torch.Tensor | None:
        bias = vector(name, False)
        if bias is None or not (permuted and part in heads):
            return bias
        return bias[torch.from_numpy(unpermuted_rows(len(bias), heads[part]))]

    layers = []
    for i in range(config.layers):
        b = f"blk.{i}."
        qkv = [_codes(projection(f"{b}attn_{x}.weight", x), dense, int4) for x in "qkv"]
        biases = [projection_bias(f"{b}attn_{x}.bias", x) for x in "qkv"]
        bias = None
        if any(v is not None for v in biases):
            bias = torch.cat([v if v is not None else torch.zeros(_rows(c)) for c, v in zip(qkv, biases)])
        layers.append(LayerWeights(
            attn_norm=vector(f"{b}attn_norm.weight"), qkv=_concat([(c, None) for c in qkv]), qkv_bias=bias,
            o=_linear(_codes(matrix(f"{b}attn_output.weight"), dense, int4), vector(f"{b}attn_output.bias", False)),
            ffn_norm=vector(f"{b}ffn_norm.weight"),
            gate_up=_concat([(_codes(matrix(f"{b}ffn_{x}.weight"), dense, int4), None) for x in ("gate", "up")]),
            down=_linear(_codes(matrix(f"{b}ffn_down.weight"), dense, int4), None)))
    embd = raw["token_embd.weight"]
    embedding = Embedding(path, int(embd.data_offset), embd.tensor_type.name, config.vocab, config.hidden)
    output = matrix("output.weight") if "output.weight" in raw else embedding.tensor()
    return Qwen2Weights(config, embedding, layers, vector("output_norm.weight"),
                        _linear(_codes(output, dense, int4), None),
                        path)
