"""The on-disk registry of per-repository LoRA adapters for the draft model.

Layout, under the user data dir:  adapters/<repo-key>/<version>/{adapter files, meta.json}.
A repository's key is a slug of its folder name ("repo" when nothing of it is usable) plus a
hash of its identity (git remote if any, plus the root path), so two clones of one project on
different paths stay apart.
Every write goes to a temporary folder beside its destination and is renamed into
place: an interrupted write leaves the registry as it was.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from specdec.errors import SpecdecError
from specdec.paths import data_dir

META = "meta.json"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_VERSION = re.compile(r"v[0-9]+")
MAX_UNPACKED = 256 * 1024 * 1024  # an adapter of the 0.5B draft at rank 64 is about 70 MB


@dataclass
class AdapterMeta:
    repo_key: str
    version: str
    repo_root: str
    git_remote: str
    git_commit: str
    base_draft: str
    base_draft_hash: str
    target: str
    created: float = field(default_factory=time.time)
    dataset: dict = field(default_factory=dict)
    metrics_before: dict = field(default_factory=dict)
    metrics_after: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.repo_key}@{self.version}"


def sanitize(name: str) -> str:
    cleaned = _SAFE.sub("-", name).strip(".-")
    if not cleaned:
        raise SpecdecError(f"{name!r} is not a usable adapter name")
    return cleaned[:64]


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def repo_identity(root: Path) -> tuple[str, str, str]:
    """(key, git remote, git commit) of the repository at root."""
    root = root.resolve()
    remote = _git(root, "config", "--get", "remote.origin.url")
    commit = _git(root, "rev-parse", "HEAD")
    digest = hashlib.sha256(f"{remote}\n{root}".encode()).hexdigest()[:12]
    return f"{slug(root.name)}-{digest}", remote, commit


def slug(name: str) -> str:
    """The readable part of a repository key: any folder name gives one (`проект`, `/`), since the hash beside it
    is what tells repositories apart; short enough that sanitize() never cuts into that hash."""
    return _SAFE.sub("-", name).strip(".-")[:40].rstrip(".-") or "repo"


class Registry:
    def __init__(self, root: Path | None = None):
        self.root = root or data_dir() / "adapters"
        self.root.mkdir(parents=True, exist_ok=True)
        self.problems: list[str] = []  # one line per entry versions() skipped (unreadable meta.json, bad version)

    def _entry(self, repo_key: str, version: str | None = None) -> Path:
        folder = self.root / sanitize(repo_key)
        return folder / sanitize(version) if version else folder

    def versions(self, repo_key: str) -> list[AdapterMeta]:
        """The repository's usable versions, oldest first. An entry whose meta.json does not read or whose
        version is not its folder's v<number> is skipped, and said in self.problems: one hand-edited or
        damaged entry must not take the repository's other versions (or its completions) with it."""
        folder = self._entry(repo_key)
        metas = []
        if folder.is_dir():
            for entry in sorted(folder.iterdir()):
                if (entry / META).is_file() and not entry.name.startswith("."):
                    try:
                        metas.append(self._read(entry, in_registry=True))
                    except SpecdecError as exc:
                        problem = f"{exc} (remove it with `specdec adapters remove {folder.name}@{entry.name}`)"
                        if problem not in self.problems:
                            self.problems.append(problem)
        return sorted(metas, key=lambda m: int(m.version[1:]))

    def list(self) -> list[AdapterMeta]:
        return [m for key in sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))
                for m in self.versions(key)]

    def latest(self, repo_key: str) -> AdapterMeta | None:
        versions = self.versions(repo_key)
        return versions[-1] if versions else None

    def get(self, repo_key: str, version: str | None = None) -> AdapterMeta:
        meta = self.latest(repo_key) if version is None else None
        if version is not None and (self._entry(repo_key, version) / META).is_file():
            meta = self._read(self._entry(repo_key, version), in_registry=True)
        if meta is None:
            raise SpecdecError(f"no adapter {repo_key}{'@' + version if version else ''} in the registry")
        return meta

    def path(self, meta: AdapterMeta) -> Path:
        return self._entry(meta.repo_key, meta.version)

    def _read(self, entry: Path, in_registry: bool = False) -> AdapterMeta:
        """An entry's meta.json; in_registry: its version must also be v<number>, the name of its folder."""
        try:
            meta = AdapterMeta(**json.loads((entry / META).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise SpecdecError(f"corrupt adapter metadata in {entry}: {str(exc).splitlines()[0]}") from None
        text = ("repo_key", "version", "repo_root", "git_remote", "git_commit", "base_draft", "base_draft_hash")
        if not all(isinstance(getattr(meta, f), str) for f in text):
            raise SpecdecError(f"corrupt adapter metadata in {entry}: a name field is not a string")
        if in_registry and not (_VERSION.fullmatch(meta.version) and meta.version == entry.name):
            raise SpecdecError(f"corrupt adapter metadata in {entry}: version {meta.version!r} is not its "
                               f"folder's v<number>")
        return meta

    def register(self, adapter_dir: Path, meta: AdapterMeta) -> AdapterMeta:
        """Copy a trained adapter in as the repository's next version, atomically."""
        _check_adapter_files(adapter_dir)
        folder = self._entry(meta.repo_key)
        folder.mkdir(parents=True, exist_ok=True)
        taken = [int(e.name[1:]) for e in folder.iterdir() if _VERSION.fullmatch(e.name)]  # broken ones too
        meta.version = f"v{max(taken, default=0) + 1}"
        tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=folder))
        try:
            for name in ADAPTER_FILES:
                shutil.copy2(adapter_dir / name, tmp / name)
            (tmp / META).write_text(json.dumps(asdict(meta), indent=2))
            os.replace(tmp, folder / meta.version)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return meta

    def remove(self, repo_key: str, version: str | None = None) -> list[str]:
        """Remove one version or all of a repository's, broken entries (unreadable meta.json) included."""
        folder = self._entry(repo_key)
        entries = [e for e in (folder.iterdir() if folder.is_dir() else ()) if e.is_dir() and
                   not e.name.startswith(".") and (version is None or e.name == sanitize(version))]
        if not entries:
            raise SpecdecError(f"no adapter {repo_key}{'@' + version if version else ''} in the registry")
        entries.sort(key=lambda e: (not _VERSION.fullmatch(e.name), int(e.name[1:]) if _VERSION.fullmatch(e.name)
                                    else 0, e.name))
        for entry in entries:
            trash = entry.with_name(f".removing-{entry.name}")
            os.replace(entry, trash)
            shutil.rmtree(trash)
        folder = self._entry(repo_key)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        return [f"{folder.name}@{entry.name}" for entry in entries]

    def export(self, repo_key: str, version: str | None, archive: Path) -> Path:
        """Write the adapter as a .tar.gz. A missing destination folder is an error, not created: a mistyped
        path should not quietly make folders."""
        meta = self.get(repo_key, version)
        if not archive.parent.is_dir():
            raise SpecdecError(f"cannot write {archive}: no such directory {archive.parent}")
        tmp = archive.with_name(archive.name + ".partial")
        try:
            with tarfile.open(tmp, "w:gz") as tf:
                for name in (*ADAPTER_FILES, META):
                    tf.add(self.path(meta) / name, arcname=f"{meta.repo_key}-{meta.version}/{name}")
            os.replace(tmp, archive)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise SpecdecError(f"cannot write {archive}: {exc.strerror or exc}") from None
        return archive

    def import_archive(self, archive: Path, expected_base_hash: str | None = None) -> AdapterMeta:
        """Validate an exported archive (members, size, metadata, weights, base draft) and register it as a new
        version. Read as a stream with the unpacked bytes counted, so a gzip bomb stops at MAX_UNPACKED."""
        if not archive.is_file():
            raise SpecdecError(f"no such archive: {archive}")
        wanted = (*ADAPTER_FILES, META)
        try:
            with tempfile.TemporaryDirectory() as tmp, gzip.open(archive) as unzipped, \
                    tarfile.open(fileobj=_Capped(unzipped, MAX_UNPACKED, archive), mode="r|") as tf:
                seen: set[str] = set()
                for m in tf:
                    path = PurePosixPath(m.name)
                    if path.is_absolute() or ".." in path.parts or not (m.isfile() or m.isdir()):
                        raise SpecdecError(f"refusing archive member {m.name!r}: unsafe path or type")
                    if m.isdir():
                        continue
                    if path.name not in wanted:
                        raise SpecdecError(f"refusing archive member {m.name!r}: not part of an adapter")
                    if m.size > MAX_UNPACKED:  # declared too big: refused before a byte is unpacked
                        raise SpecdecError(f"refusing archive {archive}: it unpacks to more than "
                                           f"{MAX_UNPACKED // 2**20} MB")
                    if path.name in seen:  # tar lets a later copy silently replace the one that was checked
                        raise SpecdecError(f"refusing archive {archive}: {path.name} appears twice")
                    seen.add(path.name)
                    with tf.extractfile(m) as src, open(Path(tmp) / path.name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                missing = [n for n in wanted if n not in seen]
                if missing:
                    raise SpecdecError(f"not an adapter archive: missing {', '.join(missing)}")
                meta = self._read(Path(tmp))
                check_base(meta, expected_base_hash)
                meta.repo_key = sanitize(meta.repo_key)
                return self.register(Path(tmp), meta)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise SpecdecError(f"cannot read adapter archive {archive}: {exc}") from None


class _Capped:
    """A reader that raises once more than `limit` bytes came through it."""

    def __init__(self, raw, limit: int, archive: Path):
        self.raw, self.limit, self.archive, self.count = raw, limit, archive, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(self.limit + 1 - self.count if size is None or size < 0 else size)
        self.count += len(data)
        if self.count > self.limit:
            raise SpecdecError(f"refusing archive {self.archive}: it unpacks to more than "
                               f"{self.limit // 2**20} MB")
        return data


def check_base(meta: AdapterMeta, base_hash: str | None) -> None:
    if base_hash and meta.base_draft_hash != base_hash:
        raise SpecdecError(f"adapter {meta.name} was trained for another base draft ({meta.base_draft}, weights "
                           f"{meta.base_draft_hash}); the loaded draft's weights are {base_hash}")


def _check_adapter_files(folder: Path) -> None:
    """The files are there and the weights are LoRA factors of a sane shape, all finite (specdec.models.lora)."""
    from specdec.models.lora import check_adapter

    missing = [n for n in ADAPTER_FILES if not (folder / n).is_file()]
    if missing:
        raise SpecdecError(f"{folder} is not a LoRA adapter: missing {', '.join(missing)}")
    check_adapter(folder)
