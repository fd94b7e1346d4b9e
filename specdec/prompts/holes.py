"""Holes cut from a source file, as a user writing new code there leaves them: the benchmarks' workload and the
fine-tune's held-out measure both use them.

A hole removes the rest of a line and up to three following lines; holes are chosen by a generator seeded with
the file's identity, so every run cuts the same ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    language: str
    registry: str  # "pypi" (sdist), "npm" (tarball) or "deb" (Debian package)
    package: str  # pinned: name==version, name@version, name=version
    member: str  # path inside the archive
    license: str
    project: str

    @property
    def name(self) -> str:
        return f"{self.language}:{Path(self.member).name}"


@dataclass(frozen=True)
class Hole:
    source: SourceFile
    index: int
    prefix: str
    suffix: str
    middle: str  # what the original file had there (reference only; losslessness is checked against plain)
    line: int

    @property
    def language(self) -> str:
        return self.source.language

    @property
    def name(self) -> str:
        return f"{self.source.name}#{self.index}"


def cut_holes(source: SourceFile, text: str, count: int, seed: int = 0) -> list[Hole]:
    """`count` holes: alternately at a line's first non-blank character and mid-line after a token."""
    lines = text.split("\n")
    comment = ("#", "//", "/*", "*", '"""', "'''")
    candidates = [
        i for i, line in enumerate(lines)
        if len(lines) * 0.25 <= i < len(lines) - 4 and len(line.strip()) >= 16
        and not line.strip().startswith(comment)
    ]
    rng = random.Random(f"{source.package}:{source.member}:{seed}")
    holes = []
    for n, i in enumerate(sorted(rng.sample(candidates, min(count, len(candidates))))):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        col = indent
        if n % 2 == 1:  # mid-line: after the first word-like token
            rest = line[indent:]
            j = next((k for k, ch in enumerate(rest) if not (ch.isalnum() or ch == "_")), len(rest))
            col = indent + max(1, j)
        end_line = min(len(lines) - 1, i + rng.randint(0, 3))
        start = sum(len(l) + 1 for l in lines[:i]) + col
        end = sum(len(l) + 1 for l in lines[: end_line + 1]) - 1  # the removed span ends before a newline
        holes.append(Hole(source, n, text[:start], text[end:], text[start:end], i + 1))
    return holes
