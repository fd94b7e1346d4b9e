"""The cost curve the planner uses, corrected by the verify passes the engine runs anyway.

A curve measured once at load (cost_curve.py) is only as good as that moment: measured beside a
compile it stays too high for good, and the planner, thinking width dear, drafts 1.2 tokens a pass.
But every verify pass is timed (Session._generate), so the curve can be learnt from real passes:
each pass size keeps a window of its recent timings, and its value is a low quantile of them
(another process only ever adds time: a few slow passes do not move a low quantile, a machine that
is slower for good moves it within a window). A size with enough passes sets its own value; the
curve's other sizes follow the start curve scaled by the ratio learnt at the nearest sizes. The
correction goes both ways, and a corrected curve is written back under the start curve's cache key
so the next start begins from it.

Republished only when some point moves by more than `tolerance`: the planner's dynamic program
caches its answers by the curve's values (tree_shape._best), and a cache write costs a file write.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

from specdec.engine.cost_curve import CostCurve, store_cost_curve

SOURCES = ("measured", "cached", "given", "learned")


class LearnedCostCurve:
    """cost(n): seconds of one target pass over n tokens, as the latest learnt curve says.

    start: the curve at load; source: where it came from ("measured" at this start, "cached" from
    disk, "given" by the caller); key / path: where to persist corrections (no key: not persisted);
    learn: False holds the start curve (a caller's fixed curve), passes are still counted.
    window: timings kept per pass size; min_passes: timings a size needs before it counts;
    quantile: the low quantile taken of a size's window.
    """

    def __init__(self, start: CostCurve, source: str = "given", *, key: str | None = None, path: Path | None = None,
                 learn: bool = True, window: int = 32, min_passes: int = 8, quantile: float = 0.2,
                 tolerance: float = 0.03):
        if source not in SOURCES:
            raise ValueError(f"source {source!r}: use one of {', '.join(SOURCES)}")
        if not (1 <= min_passes <= window and 0.0 <= quantile <= 1.0 and tolerance >= 0.0):
            raise ValueError(f"need 1 <= min_passes ({min_passes}) <= window ({window}), 0 <= quantile ({quantile})"
                             f" <= 1 and tolerance ({tolerance}) >= 0")
        self.start, self.curve, self.source = start, start, source
        self.key, self.path, self.learn = key, path, learn
        self.window, self.min_passes, self.quantile, self.tolerance = window, min_passes, quantile, tolerance
        self.passes = 0  # verify passes observed
        self._timings: dict[int, deque[float]] = {}
        self._low: dict[int, float] = {}  # pass size -> the low quantile of its window, once it has min_passes

    # the CostCurve interface the planner and reports use: the current curve's
    def __call__(self, n: float) -> float:
        return self.curve(n)

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.curve.tokens

    @property
    def seconds(self) -> tuple[float, ...]:
        return self.curve.seconds

    def to_json(self) -> dict:
        return self.curve.to_json()

    def observe(self, n_tokens: int, seconds: float) -> None:
        """One verify pass over n_tokens took seconds (the root included: a plain step is one token)."""
        if n_tokens < 1 or not (seconds > 0 and math.isfinite(seconds)):
            return  # a clock that read 0, or nothing was verified: no information
        self.passes += 1
        if not self.learn:
            return
        timings = self._timings.setdefault(int(n_tokens), deque(maxlen=self.window))
        timings.append(float(seconds))
        if len(timings) < self.min_passes:
            return
        self._low[int(n_tokens)] = _quantile(timings, self.quantile)
        candidate = self._fit()
        if any(abs(new - old) > self.tolerance * old for new, old in zip(candidate.seconds, self.curve.seconds)):
            self.curve, self.source = candidate, "learned"
            if self.key is not None:
                store_cost_curve(self.key, candidate, path=self.path)

    def report(self) -> dict:
        """For specdec/stats and the bench: which curve the planner uses, in ms per pass of n tokens."""
        return {"source": self.source, "ms": {n: round(1000 * s, 2) for n, s in zip(self.tokens, self.seconds)},
                "passes": self.passes}

    def _fit(self) -> CostCurve:
        """The start curve's sizes, each scaled by the learnt ratio (low quantile / start) interpolated between
        the nearest learnt sizes and held past the outermost; made monotone."""
        sizes = sorted(self._low)
        ratios = [self._low[n] / self.start(n) for n in sizes]
        seconds = []
        for p, base in zip(self.start.tokens, self.start.seconds):
            if p <= sizes[0]:
                ratio = ratios[0]
            elif p >= sizes[-1]:
                ratio = ratios[-1]
            else:
                i = next(i for i, n in enumerate(sizes) if n >= p)
                n0, n1 = sizes[i - 1], sizes[i]
                ratio = ratios[i - 1] + (ratios[i] - ratios[i - 1]) * (p - n0) / (n1 - n0)
            seconds.append(base * ratio)
        return CostCurve(self.start.tokens, tuple(seconds)).monotone()


def _quantile(values, q: float) -> float:
    """The q-quantile of values (the lower of two neighbours: a low quantile stays a real timing)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]
