"""A model spec loaded as (model, tokenizer), and the target/draft pair the engine runs.

The draft is checked against the target's tokenizer, gets its adapter folded in, then is
quantized; the target is quantized per `--target-quant`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError
from specdec.hardware import torch_device, torch_dtype
from specdec.models.choices import KEPT_FP32
from specdec.models.lora import apply_adapter
from specdec.models.quantize import quantize_draft, quantize_target
from specdec.models.store import resolve


@dataclass
class LoadedModel:
    spec: str
    path: Path
    model: Any
    tokenizer: Any

    @property
    def weight_hash(self) -> str:
        """A cheap identity of the weights: hash of the files' names, sizes and first megabyte. A model made from a
        GGUF is its GGUF (the file a native model reads, the one a bf16 conversion names), so an adapter trained
        over the conversion (fine-tuning runs transformers) is found for the same draft on the native forward."""
        digest = hashlib.sha256()
        source = self.path if self.path.is_file() else _gguf_source(self.path)
        for f in [source] if source is not None else sorted(self.path.glob("*.safetensors")):
            digest.update(f.name.encode())
            digest.update(str(f.stat().st_size).encode())
            with open(f, "rb") as fh:
                digest.update(fh.read(1 << 20))
        return digest.hexdigest()[:16]


def _gguf_source(directory: Path) -> Path | None:
    """The GGUF a bf16 conversion was made from, if it is still there: its provenance file names it (a catalog
    model's conversions of older releases by file name only: the catalog's GGUF)."""
    import json

    from specdec.models.catalog import KNOWN_MODELS
    from specdec.models.store import PROVENANCE, catalog_gguf

    try:
        provenance = json.loads((directory / PROVENANCE).read_text())
        source = Path(provenance["gguf"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not source.is_absolute() and provenance.get("model_id") in KNOWN_MODELS:
        source = catalog_gguf(provenance["model_id"])
    return source if source.is_absolute() and source.is_file() else None


def load(spec: str, dtype: str = "auto", device: str | None = None) -> LoadedModel:
    """device: a `--device` value (None or auto: CUDA if there is one, else the CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = resolve(spec)
    device = torch_device(device)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a local load takes seconds: the user's terminal shows specdec's lines only
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype, device)).to(device)
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"cannot load model {spec}: {str(exc).splitlines()[0]}") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
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


@dataclass
class ModelPair:
    target: LoadedModel
    draft: LoadedModel | None
    target_quant: str = "none"

    def target_identity(self) -> dict:
        """What changes what a target pass costs (engine.cost_curve.cost_curve_key's fields): a quantized
        target's kernels too, since W4A8/W8A8 and ATen's price extra rows very differently."""
        from specdec.models.int4 import kernels_in_use

        model = self.target.model
        kernel = getattr(model, "kernels", None) or (kernels_in_use(model) if self.target_quant != "none" else "")
        return {"model": f"{self.target.spec}@{self.target.weight_hash}", "dtype": str(model.dtype),
                "quantization": f"{self.target_quant}:{kernel}" if kernel else self.target_quant,
                "device": str(model.device)}


def load_pair(target_spec: str, draft_spec: str | None, dtype: str = "auto", draft_quant: str = "int8",
              device: str | None = None, adapter: str | None = None, target_quant: str = "none",
              int4_kernel: str = "auto", forward: str = "auto", switchable: bool = False) -> ModelPair:
    """Target as asked (quantized per target_quant, one of TARGET_QUANT; int4 layers on int4_kernel, one of
    INT4_KERNELS; on the forward `forward` picks, one of FORWARDS: specdec.native.loading.choose); draft checked
    against the target's tokenizer, its adapter applied, then quantized, on the same forward where it can
    (load_draft). The pair's target_quant is the mode applied (auto resolved; a native target serves the GGUF's
    codes: int4). switchable: the draft will take per-request adapters (load_draft)."""
    from specdec.native.loading import choose, load_native

    gguf = choose(forward, target_spec, torch_device(device), target_quant)
    if gguf is not None:
        model, tokenizer = load_native(target_spec, gguf)
        target, target_quant = LoadedModel(spec=target_spec, path=gguf, model=model, tokenizer=tokenizer), "int4"
    else:
        target = load(target_spec, dtype, device)
        target_quant = quantize_target(target, target_quant, dtype, int4_kernel)
    if not draft_spec:
        return ModelPair(target, None, target_quant)
    draft = load_draft(draft_spec, target, dtype, draft_quant, device, adapter, forward, switchable)
    return ModelPair(target, draft, target_quant)


def load_draft(draft_spec: str, target: LoadedModel, dtype: str = "auto", draft_quant: str = "int8",
               device: str | None = None, adapter: str | None = None, forward: str = "auto",
               switchable: bool = False, native_form: str | None = None) -> LoadedModel:
    """The draft as the engine runs it beside `target`, checked against its tokenizer. On the native forward
    (specdec.native.loading.choose_draft: a Qwen2 GGUF, draft_quant int8) its GGUF's codes as they are, an adapter
    beside them (specdec.native.lora); on transformers the adapter folded in, then quantized (a benchmark loads
    several of these beside one target). switchable: per-request adapters will be switched on it
    (specdec.backends.local.build), so a transformers draft is left unquantized for SwitchableDraft to wrap.
    native_form: the native draft's weights, one of NATIVE_DRAFT_FORMS (None: NATIVE_DRAFT_FORM; a benchmark's
    other form)."""
    from specdec.native.loading import NATIVE_DRAFT_FORM, NATIVE_DRAFT_FORMS, choose_draft, load_native
    from specdec.native.shortlist import draft_shortlist

    if (native_form or NATIVE_DRAFT_FORM) not in NATIVE_DRAFT_FORMS:
        raise SpecdecError(f"unknown native draft form {native_form!r}; use one of {', '.join(NATIVE_DRAFT_FORMS)}")
    gguf = choose_draft(forward, draft_spec, torch_device(device), draft_quant)
    if gguf is not None:
        model, tokenizer = load_native(draft_spec, gguf, int4=(native_form or NATIVE_DRAFT_FORM) == "int4")
        check_same_tokenizer(target.tokenizer, tokenizer, target.spec, draft_spec)
        model.shortlist = draft_shortlist(model.model.weights.output, tokenizer)
        if adapter:
            from specdec.native.lora import NativeAdapters

            NativeAdapters(model).activate(Path(adapter).name or "adapter", Path(adapter))
        return LoadedModel(spec=draft_spec, path=gguf, model=model, tokenizer=tokenizer)
    quant = "none" if switchable else draft_quant
    draft = load(draft_spec, "fp32" if quant in KEPT_FP32 else dtype, device)
    check_same_tokenizer(target.tokenizer, draft.tokenizer, target.spec, draft_spec)
    if adapter:
        draft.model = apply_adapter(draft.model, adapter)
    draft.model = quantize_draft(draft.model, quant)
    return draft
