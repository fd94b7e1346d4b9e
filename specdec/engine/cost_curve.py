"""The verify cost curve: seconds of one target pass over n tokens, measured on this machine.

The tree planner (tree_shape.py) trades expected accepted tokens against what a wider
pass costs, and that price is the hardware's: on a GPU a pass over 16 tokens costs about
what a pass over one does, on a CPU every token adds matmul work. So the curve is
measured, not assumed: a handful of sizes, the fastest of a few repeats after a warm-up,
piecewise linear in between. Measuring takes seconds, so curves are cached on disk under
a key the caller builds from everything that changes the answer (model, dtype,
quantization, device, torch version, threads); a cache file that cannot be read is
measured again and rewritten. A measurement is one moment: learned_cost.py corrects the curve from
the verify passes the engine runs, and writes the corrected curve back under the same key.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec import paths

DEFAULT_POINTS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
CACHE_FILE = "cost_curves.json"
# Passes are timed after this many context tokens, about what the server's default prompt holds (512 before
# the cursor, up to 128 after): after 32, a 1.5B int4 target's one-token pass measured 52 ms where a real
# decode step took 71-75 ms, and the planner, thinking the target cheap against the draft, stopped drafting.
CURVE_CONTEXT = 512


@dataclass(frozen=True)
class CostCurve:
    """Measured (tokens, seconds) points; cost(n) interpolates linearly between them, holds the
    first value below the first point and extends the last segment's slope past the last."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(n) for n in self.tokens))
        object.__setattr__(self, "seconds", tuple(float(s) for s in self.seconds))
        if not self.tokens or len(self.tokens) != len(self.seconds):
            raise ValueError(f"{len(self.tokens)} sizes and {len(self.seconds)} timings: need one of each, at least one")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:])) or self.tokens[0] < 1:
            raise ValueError(f"sizes {list(self.tokens)} must be >= 1 and strictly increasing")
        if any(not (s > 0 and s < float("inf")) for s in self.seconds):
            raise ValueError(f"timings {list(self.seconds)} must be positive and finite")

    def __call__(self, n: float) -> float:
        xs, ys = self.tokens, self.seconds
        if n <= xs[0] or len(xs) == 1:
            return ys[0] if n <= xs[0] else ys[-1]
        i = min(bisect.bisect_left(xs, n), len(xs) - 1)  # the segment (xs[i-1], xs[i]] holds n, or the last one
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)

    def monotone(self) -> CostCurve:
        """The running maximum: a pass over more tokens is never taken as cheaper (timing noise
        would otherwise make the planner chase dips)."""
        out, top = [], 0.0
        for s in self.seconds:
            top = max(top, s)
            out.append(top)
        return CostCurve(self.tokens, tuple(out))

    def relative(self) -> CostCurve:
        """In units of a one-token pass: comparable across machines, handy in reports."""
        base = self(1)
        return CostCurve(self.tokens, tuple(s / base for s in self.seconds))

    def to_json(self) -> dict:
        return {"tokens": list(self.tokens), "seconds": list(self.seconds)}

    @classmethod
    def from_json(cls, data: dict) -> CostCurve:
        return cls(tuple(data["tokens"]), tuple(data["seconds"]))


def measure_cost_curve(run_pass: Callable[[int], None], points: Sequence[int] = DEFAULT_POINTS, repeats: int = 3,
                       warmup: int = 1, clock: Callable[[], float] = time.perf_counter) -> CostCurve:
    """Time run_pass(n) (one verify pass over n tokens, synchronised) at each size in points.

    Rounds go over all sizes in turn, so drift (thermal, another process) spreads over every
    size instead of biasing the last; each size keeps the fastest of its rounds (another process
    only ever adds time, and a burst landing on one size would bend the curve). The result
    is made monotone (CostCurve.monotone).
    """
    points = sorted({int(n) for n in points})
    if not points or points[0] < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"points {points} must be >= 1, repeats ({repeats}) >= 1, warmup ({warmup}) >= 0")
    for _ in range(warmup):
        for n in (points[-1], points[0]):  # the largest first: allocators and kernel caches settle
            run_pass(n)
    timings: dict[int, list[float]] = {n: [] for n in points}
    for _ in range(repeats):
        for n in points:
            start = clock()
            run_pass(n)
            timings[n].append(clock() - start)
    seconds = tuple(max(min(timings[n]), 1e-9) for n in points)  # a coarse clock can read 0
    return CostCurve(tuple(points), seconds).monotone()


def cost_curve_key(model: str, *, dtype: str, quantization: str = "none", device: str = "cpu", **extra) -> str:
    """The cache key: everything that changes a pass's cost, plus torch's version, thread count and the context
    the passes are timed after."""
    import torch

    fields = {"model": model, "dtype": dtype, "quantization": quantization, "device": device,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "context": CURVE_CONTEXT, **extra}
    return json.dumps(fields, sort_keys=True, default=str)


def cached_cost_curve(key: str, measure: Callable[[], CostCurve], *, refresh: bool = False,
                      path: Path | None = None) -> CostCurve:
    """The curve stored under key, or measure() stored there. Unreadable files or entries are
    measured again and rewritten, never an error: the cache only saves time."""
    return load_cost_curve(key, measure, refresh=refresh, path=path)[0]


def load_cost_curve(key: str, measure: Callable[[], CostCurve], *, refresh: bool = False,
                    path: Path | None = None) -> tuple[CostCurve, str]:
    """cached_cost_curve's curve and where it came from: "cached" (read) or "measured" (and stored)."""
    stored = _read(path or paths.cache_dir() / CACHE_FILE)
    if not refresh and key in stored:
        try:
            return CostCurve.from_json(stored[key]), "cached"
        except (KeyError, TypeError, ValueError):
            pass  # a damaged entry: measure again
    curve = measure()
    store_cost_curve(key, curve, path=path)
    return curve, "measured"


def store_cost_curve(key: str, curve: CostCurve, *, path: Path | None = None) -> None:
    """Store curve under key, keeping every other key's (another process may have added its own meanwhile);
    a cache that cannot be written is skipped."""
    path = path or paths.cache_dir() / CACHE_FILE
    stored = _read(path)
    stored[key] = curve.to_json()
    _write(path, stored)


def measure_kv_cost_curve(kv_model, key: str | None = None, *, points: Sequence[int] = DEFAULT_POINTS,
                          repeats: int = 3, warmup: int = 1, prefix: int = CURVE_CONTEXT, token: int = 0,
                          refresh: bool = False, path: Path | None = None) -> CostCurve:
    """The cost curve of a KVModel-like object (extend(tokens) -> logits of every token,
    truncate(length), reset(), device): after a prefix of `prefix` tokens, each pass extends
    n dummy tokens, keeping every row's logits as a verify pass does, and truncates back.
    Cached under key when one is given. Leaves the model's cache empty (reset).

    The passes are causal; a tree's pass differs only in its attention mask.
    """
    import torch

    def synchronize() -> None:
        backend = getattr(torch, kv_model.device.type, None)
        sync = getattr(backend, "synchronize", None)
        if sync is not None and kv_model.device.type != "cpu":
            sync()

    def run_pass(n: int) -> None:
        kv_model.truncate(prefix)
        kv_model.extend([token] * n)
        synchronize()

    def measure() -> CostCurve:
        kv_model.reset()
        try:
            kv_model.extend([token] * prefix)
            return measure_cost_curve(run_pass, points, repeats, warmup)
        finally:
            kv_model.reset()

    if prefix < 1:
        raise ValueError(f"prefix must be >= 1 token, got {prefix}")
    if key is None:
        return measure()
    return cached_cost_curve(key, measure, refresh=refresh, path=path)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    """Atomically (a reader never sees half a file); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
