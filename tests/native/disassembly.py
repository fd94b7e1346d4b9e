"""The built C++ libraries read back as instructions, for the tests that check which functions use AVX512 (the AVX2
path and the dispatch code must run on a CPU without it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest


def instructions(library: str) -> Iterator[tuple[str, bool, str]]:
    """(function, avx512, operands) for every instruction of `library` (objdump -d -C; skips where there is no
    objdump). avx512: an EVEX encoding (first opcode byte 0x62, an invalid instruction in 64-bit mode otherwise) or
    a zmm or mask register."""
    if shutil.which("objdump") is None:
        pytest.skip("no objdump to read the library with")
    listing = subprocess.run(["objdump", "-d", "-C", library], capture_output=True, text=True, check=True).stdout
    function = ""
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            continue
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        yield function, parts[1].strip().startswith("62 ") or bool(re.search(r"%zmm|%k[0-7]", parts[2])), parts[2]
