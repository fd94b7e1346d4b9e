"""The verify cost curve: the fastest round after a warm-up, piecewise-linear, monotone, cached on disk
under the caller's key, a damaged cache measured again, and real passes on a tiny model."""

import json
import math

import pytest

from specdec import paths
from specdec.engine.cost_curve import (
    CACHE_FILE,
    CURVE_CONTEXT,
    CostCurve,
    cached_cost_curve,
    cost_curve_key,
    measure_cost_curve,
    measure_kv_cost_curve,
)


class FakeClock:
    """run_pass advances time by a chosen amount; the clock reads it."""

    def __init__(self, seconds_for):
        self.now, self.seconds_for, self.calls = 0.0, seconds_for, []

    def __call__(self) -> float:
        return self.now

    def run_pass(self, n: int) -> None:
        self.calls.append(n)
        self.now += self.seconds_for(n, len(self.calls))


def test_fastest_of_rounds_after_a_warm_up():
    # the first call is a cold start (100 s); every fourth call is an outlier (+50 s)
    clock = FakeClock(lambda n, call: (100.0 if call == 1 else 0.0) + 0.01 * (1 + 0.1 * n) + (50.0 if call % 4 == 0 else 0))
    curve = measure_cost_curve(clock.run_pass, points=(1, 8, 64), repeats=5, warmup=1, clock=clock)
    assert clock.calls[:2] == [64, 1]  # warm-up: largest first
    assert clock.calls[2:] == [1, 8, 64] * 5  # rounds over every size in turn
    assert curve.tokens == (1, 8, 64)
    assert curve.seconds == pytest.approx([0.01 * 1.1, 0.01 * 1.8, 0.01 * 7.4])


def test_interpolates_linearly_and_extends_the_last_slope():
    curve = CostCurve((1, 4, 8), (1.0, 2.5, 3.0))
    assert curve(1) == 1.0 and curve(0) == 1.0  # below the first point: its value
    assert curve(2) == pytest.approx(1.5) and curve(4) == pytest.approx(2.5) and curve(6) == pytest.approx(2.75)
    assert curve(16) == pytest.approx(4.0)  # past the last: the last segment's slope
    assert CostCurve((1,), (2.0,))(40) == 2.0
    assert curve.relative().seconds == pytest.approx((1.0, 2.5, 3.0))


def test_timing_noise_never_makes_a_bigger_pass_cheaper():
    clock = FakeClock(lambda n, call: {1: 1.0, 2: 1.2, 4: 1.1, 8: 1.5}[n])  # 4 reads faster than 2
    curve = measure_cost_curve(clock.run_pass, points=(1, 2, 4, 8), repeats=1, warmup=0, clock=clock)
    assert curve.seconds == pytest.approx((1.0, 1.2, 1.2, 1.5))
    assert all(curve(n) <= curve(n + 1) for n in range(1, 20))


def test_bad_curves_are_refused():
    with pytest.raises(ValueError, match="increasing"):
        CostCurve((1, 4, 2), (1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="positive"):
        CostCurve((1, 2), (1.0, float("nan")))
    with pytest.raises(ValueError, match="one of each"):
        CostCurve((1, 2), (1.0,))
    with pytest.raises(ValueError, match="repeats"):
        measure_cost_curve(lambda n: None, points=(1, 2), repeats=0)


def counting(curve: CostCurve):
    calls = []

    def measure() -> CostCurve:
        calls.append(1)
        return curve

    return measure, calls


def test_the_cache_measures_once_per_key_and_keeps_the_others():
    first, second = CostCurve((1, 2), (1.0, 2.0)), CostCurve((1, 2), (3.0, 4.0))
    measure_a, calls_a = counting(first)
    measure_b, calls_b = counting(second)
    assert cached_cost_curve("a", measure_a) == first
    assert cached_cost_curve("a", measure_a) == first and len(calls_a) == 1
    assert cached_cost_curve("b", measure_b) == second and len(calls_b) == 1
    stored = json.loads((paths.cache_dir() / CACHE_FILE).read_text())
    assert set(stored) == {"a", "b"} and CostCurve.from_json(stored["a"]) == first
    assert cached_cost_curve("a", measure_b, refresh=True) == second  # refresh measures again


@pytest.mark.parametrize("damage", [b"\x00\xff not json", b"[1, 2, 3]", b'{"a": {"tokens": [], "seconds": []}}',
                                    b'{"a": {"tokens": [1, 2], "seconds": [1.0, -3.0]}}', b'{"a": 7}'])
def test_a_damaged_cache_is_measured_again_and_rewritten(damage):
    path = paths.cache_dir() / CACHE_FILE
    path.write_bytes(damage)
    curve = CostCurve((1, 8), (1.0, 1.5))
    measure, calls = counting(curve)
    assert cached_cost_curve("a", measure) == curve and len(calls) == 1
    assert CostCurve.from_json(json.loads(path.read_text())["a"]) == curve
    assert cached_cost_curve("a", measure) == curve and len(calls) == 1


def test_an_unwritable_cache_is_skipped(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache dir should be")
    curve = CostCurve((1,), (1.0,))
    measure, calls = counting(curve)
    assert cached_cost_curve("a", measure, path=blocker / CACHE_FILE) == curve
    assert cached_cost_curve("a", measure, path=blocker / CACHE_FILE) == curve and len(calls) == 2


def test_the_key_holds_what_changes_a_pass():
    import torch

    key = json.loads(cost_curve_key("Qwen/x", dtype="bfloat16", quantization="int8", device="cuda:0", kv="fp16"))
    assert key == {"model": "Qwen/x", "dtype": "bfloat16", "quantization": "int8", "device": "cuda:0", "kv": "fp16",
                   "torch": torch.__version__, "threads": torch.get_num_threads(), "context": CURVE_CONTEXT}
    assert cost_curve_key("m", dtype="float32") != cost_curve_key("m", dtype="bfloat16")


class CountingKV:
    """A KVModel that counts its passes."""

    def __init__(self, kv):
        self.kv, self.passes = kv, []
        self.device = kv.device

    def extend(self, tokens, keep_logits=None):
        self.passes.append(len(tokens))
        logits = self.kv.extend(tokens, keep_logits)
        assert logits.shape[0] == len(tokens)  # every row's logits, as a verify pass keeps them
        return logits

    def truncate(self, length):
        self.kv.truncate(length)

    def reset(self):
        self.kv.reset()

    @property
    def tokens(self):
        return self.kv.tokens


def test_real_passes_on_a_tiny_model_are_measured_and_cached():
    import tiny

    from specdec.engine.kv import KVModel

    kv = CountingKV(KVModel(tiny.model()))
    key = cost_curve_key("tiny", dtype="float32")
    curve = measure_kv_cost_curve(kv, key, points=(1, 4, 16, 64), repeats=3, prefix=8)
    assert kv.passes == [8] + [64, 1] + [1, 4, 16, 64] * 3  # the prefix, the warm-up, three rounds
    assert kv.tokens == []  # left empty: the session re-syncs
    assert curve.tokens == (1, 4, 16, 64)
    assert all(math.isfinite(s) and 0 < s < 10 for s in curve.seconds)
    assert list(curve.seconds) == sorted(curve.seconds)
    again = measure_kv_cost_curve(kv, key, points=(1, 4, 16, 64), repeats=3, prefix=8)
    assert again == curve and len(kv.passes) == 1 + 2 + 12  # from the cache: no pass ran
    fresh = measure_kv_cost_curve(kv, None, points=(1, 2), repeats=1, warmup=0, prefix=8)
    assert fresh.tokens == (1, 2) and kv.passes[-3:] == [8, 1, 2]
