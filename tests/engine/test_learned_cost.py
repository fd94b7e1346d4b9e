"""The planner's cost curve is learnt from the verify passes the engine runs (issue #40 item 2): a curve cached
on a busy machine falls, one too low rises, a few slow outliers move nothing, and the corrected curve is written
back so the next start begins from it. Synthetic timings only: no wall clock."""

import json

import pytest

from specdec.engine.cost_curve import CACHE_FILE, CostCurve, load_cost_curve, store_cost_curve
from specdec.engine.learned_cost import LearnedCostCurve
from specdec.engine.session import GenerationConfig
from specdec.engine.strategies import make_session

QUIET = {1: 0.083, 2: 0.098, 4: 0.108, 8: 0.136}  # the machine, quiet
BUSY = CostCurve((1, 2, 4, 8), (0.080, 0.099, 0.134, 0.157))  # ... and cached beside a compile


def feed(curve: LearnedCostCurve, timings: dict[int, float], rounds: int) -> None:
    for _ in range(rounds):
        for n, seconds in timings.items():
            curve.observe(n, seconds)


def test_a_curve_cached_too_high_falls_after_enough_fast_passes_and_is_written_back(tmp_path):
    path = tmp_path / CACHE_FILE
    store_cost_curve("other", CostCurve((1,), (1.0,)), path=path)  # another model's curve: kept
    store_cost_curve("k", BUSY, path=path)
    start, source = load_cost_curve("k", lambda: pytest.fail("cached: nothing to measure"), path=path)
    curve = LearnedCostCurve(start, source, key="k", path=path, min_passes=8)
    assert curve.report() == {"source": "cached", "ms": {1: 80.0, 2: 99.0, 4: 134.0, 8: 157.0}, "passes": 0}
    feed(curve, QUIET, rounds=7)  # fewer than min_passes per size: the cached curve stands
    assert curve.seconds == BUSY.seconds and curve.source == "cached" and curve.passes == 28
    feed(curve, QUIET, rounds=1)
    assert curve.source == "learned" and curve.passes == 32
    assert curve.seconds == pytest.approx((0.083, 0.098, 0.108, 0.136))
    assert curve(4) == pytest.approx(0.108)  # what the planner reads
    stored = json.loads(path.read_text())
    assert set(stored) == {"other", "k"} and CostCurve.from_json(stored["k"]).seconds == pytest.approx(curve.seconds)
    # the next start begins from the learnt curve
    again, source = load_cost_curve("k", lambda: pytest.fail("cached: nothing to measure"), path=path)
    assert source == "cached" and again.seconds == pytest.approx((0.083, 0.098, 0.108, 0.136))


def test_a_curve_too_low_rises_with_consistently_slower_passes_but_not_with_a_few_outliers(tmp_path):
    path = tmp_path / CACHE_FILE
    low = CostCurve((1, 2, 4, 8), (0.040, 0.050, 0.060, 0.080))
    curve = LearnedCostCurve(low, "measured", key="k", path=path, window=32, min_passes=8, quantile=0.2)
    # a few outliers among passes that agree with the curve: nothing moves, nothing is written
    for i in range(32):
        curve.observe(1, 0.5 if i % 8 == 0 else 0.040)
        curve.observe(8, 0.9 if i % 10 == 0 else 0.080)
    assert curve.seconds == low.seconds and curve.source == "measured" and not path.exists()
    # the machine is slower for good: within a window the low quantile is the new time
    for _ in range(32):
        curve.observe(1, 0.060)
        curve.observe(8, 0.120)
    assert curve.source == "learned" and curve(1) == pytest.approx(0.060) and curve(8) == pytest.approx(0.120)
    # sizes with no passes of their own follow the start curve, scaled by the ratios learnt around them
    assert curve(2) == pytest.approx(0.050 * (1.5 + 0.0 * 1 / 7)) and curve(4) == pytest.approx(0.060 * 1.5)
    assert CostCurve.from_json(json.loads(path.read_text())["k"]).seconds == pytest.approx(curve.seconds)
    # ... and when it is quiet again, it falls back as fast passes fill the window
    for _ in range(32):
        curve.observe(1, 0.040)
        curve.observe(8, 0.080)
    assert curve.seconds == pytest.approx(low.seconds)


def test_learnt_ratios_interpolate_between_sizes_and_the_curve_stays_monotone():
    start = CostCurve((1, 2, 4, 8, 12), (1.0, 1.0, 2.0, 4.0, 6.0))
    curve = LearnedCostCurve(start, "measured", min_passes=1, window=1, tolerance=0.0)
    curve.observe(2, 0.5)  # ratio 0.5 at 2 ...
    curve.observe(8, 4.0)  # ... 1.0 at 8
    assert curve.seconds == pytest.approx((0.5, 0.5, 2.0 * (0.5 + 0.5 * 2 / 6), 4.0, 6.0))
    curve.observe(2, 3.0)  # noise at 2 reads dearer than 4: a bigger pass is never taken as cheaper
    assert all(a <= b for a, b in zip(curve.seconds, curve.seconds[1:]))


def test_a_given_curve_is_held_and_nonsense_timings_are_ignored():
    fixed = LearnedCostCurve(BUSY, "given", learn=False)
    feed(fixed, QUIET, rounds=40)
    assert fixed.seconds == BUSY.seconds and fixed.report()["source"] == "given" and fixed.passes == 160
    curve = LearnedCostCurve(BUSY, "measured", min_passes=1)
    for n, seconds in ((0, 0.01), (1, 0.0), (1, -1.0), (1, float("nan")), (1, float("inf"))):
        curve.observe(n, seconds)
    assert curve.passes == 0 and curve.seconds == BUSY.seconds
    with pytest.raises(ValueError):
        LearnedCostCurve(BUSY, "guessed")
    with pytest.raises(ValueError):
        LearnedCostCurve(BUSY, "measured", window=4, min_passes=8)


def test_a_session_feeds_every_verify_pass_to_its_curve_and_the_next_start_reads_it(target, unrelated_draft, tok,
                                                                                     tmp_path):
    first = make_session(target, tok, "tree", unrelated_draft, cost_key="tiny")
    curve = first.cost_curve
    assert isinstance(curve, LearnedCostCurve) and curve.report()["source"] == "measured"
    assert first.drafter.planner.cost is curve  # the planner reads the curve the session corrects
    out = first.generate(tok.encode("def add(a, b):\n    return"), GenerationConfig(max_new_tokens=12))
    assert curve.passes == out.stats.target_passes - 1  # every pass after the prefill
    second = make_session(target, tok, "tree", unrelated_draft, cost_key="tiny")
    assert second.cost_curve.report()["source"] == "cached"
    stored = json.loads((tmp_path / "cache" / CACHE_FILE).read_text())
    assert CostCurve.from_json(stored["tiny"]).seconds == pytest.approx(curve.seconds)
    given = make_session(target, tok, "tree", unrelated_draft, cost_curve=BUSY)
    given.generate(tok.encode("x = 1"), GenerationConfig(max_new_tokens=4))
    assert given.cost_curve.report()["source"] == "given" and given.cost_curve.seconds == BUSY.seconds
