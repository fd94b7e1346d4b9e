"""`specdec finetune`'s one clock and its memory figure: `--max-minutes` bounds the whole command.

The budget starts when the command does (the interpreter's start included where the process can say when that
was) and every phase is timed against it: loading the models, building the samples, the evaluation before,
training, the evaluation after and registering. Training gets what is left once the evaluation after it is
reserved (about what the evaluation before took: the same holes), so the command ends by its deadline unless a
fixed cost (loading, one evaluation hole, one step) alone outruns it; the report then says where the time went.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PHASES = ("startup", "load", "dataset", "before_eval", "train", "after_eval", "register")
EVAL_SHARE = 0.2  # of the time left after loading: the most the evaluation before training may take
AFTER_EVAL_SLACK = 1.25  # the evaluation after training, reserved as this multiple of the one before (an adapter
# adds side matmuls to each draft step) ...
REGISTER_RESERVE_S = 5.0  # ... plus saving the adapter and registering it


class Budget:
    """seconds from a start (clock() at creation, less `spent`: time the command took before the budget was made),
    and the seconds each phase took (`phase`)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic, spent: float = 0.0):
        self.seconds, self.clock = float(seconds), clock
        self.started = clock() - spent
        self.split: dict[str, float] = {"startup": spent} if spent > 0 else {}
        self.peaks: dict[str, int] = {}  # the process's peak RSS at the end of each phase (bytes)

    @property
    def deadline(self) -> float:
        """The clock's value the command should end by."""
        return self.started + self.seconds

    def left(self) -> float:
        return self.deadline - self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        begun = self.clock()
        try:
            yield
        finally:
            self.split[name] = self.split.get(name, 0.0) + self.clock() - begun
            self.peaks[name] = peak_rss_bytes()

    def peak_phase(self) -> str | None:
        """The phase in which the process's peak RSS was reached (the first whose end saw it)."""
        top = max(self.peaks.values(), default=0)
        return next((name for name, peak in self.peaks.items() if peak == top), None)

    def eval_deadline(self) -> float:
        """When the evaluation before training should stop starting holes: EVAL_SHARE of the time left."""
        return self.clock() + EVAL_SHARE * max(0.0, self.left())

    def train_deadline(self, eval_seconds: float) -> float:
        """When training should stop, so the evaluation after it (the same holes as the one that took
        eval_seconds) and registering still end by the deadline."""
        return self.deadline - AFTER_EVAL_SLACK * eval_seconds - REGISTER_RESERVE_S

    def summary(self) -> dict:
        """The time split (seconds per phase, in PHASES' order), the total and the budget."""
        split = {name: round(self.split[name], 2) for name in PHASES if name in self.split}
        split.update({name: round(s, 2) for name, s in self.split.items() if name not in PHASES})
        return {**split, "total": round(self.elapsed(), 2), "budget": round(self.seconds, 2)}

    def line(self) -> str:
        """The time split for people: `time: load 41 s, ..., total 236 s of a 240 s budget`."""
        parts = [f"{name.replace('_', '-')} {seconds:.0f} s" for name, seconds in self.summary().items()
                 if name not in ("total", "budget")]
        total = self.elapsed()
        over = f" ({total - self.seconds:.0f} s over)" if total > self.seconds + 0.5 else ""
        return f"time: {', '.join(parts)}; total {total:.0f} s of a {self.seconds:.0f} s budget{over}"


def process_age() -> float:
    """Seconds since this process started (the interpreter's start, imports, the CLI's parser): the part of the
    command that ran before finetune_repo made its budget. 0 where the process cannot say."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - psutil absent or the platform cannot say: the budget starts now
        return 0.0


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (ru_maxrss: kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_rss_line(peak: int, phase: str | None = None) -> str:
    return f"peak RSS {peak / 1e9:.1f} GB" + (f" (in {phase.replace('_', '-')})" if phase else "")


MMAP_THRESHOLD = 1 << 20  # bytes: larger allocations (every activation of a training step) get pages of their own


def return_large_frees() -> None:
    """Have glibc serve allocations over MMAP_THRESHOLD from pages of their own, given back the moment they are
    freed. By default the threshold follows the largest block freed so far (up to 32 MB), so a training step's
    activations come from the heap and its freed pages stay in the RSS: 1.2 GB more per step in the measurement
    of docs/benchmarks.md. Process-wide; nothing where the C library is not glibc."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def release_freed_memory() -> None:
    """Collect what only cycles still hold, then hand the heap's freed pages back to the system (glibc's
    malloc_trim): dequantizing the draft frees ~1 GB of temporaries that the allocator would otherwise keep,
    counted in the RSS until the process ends."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
