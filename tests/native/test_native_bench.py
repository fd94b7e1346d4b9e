"""`python -m specdec.native.bench --prefill N`: the cold prefill's figure is the engine's own chunked sync from an
empty cache, and the cache is left empty for the figures after it."""

import torch

from native_models import kernels_or_skip, native_model


def test_a_cold_prefill_starts_from_an_empty_cache_each_round(monkeypatch):
    kernels_or_skip()
    from specdec.native.bench import prefill_times

    lm = native_model(seed=3).new_cached_lm()
    ids = list(range(8, 72))
    lm.sync(ids[:40])  # a warm cache the figure must not reuse
    synced, real_sync = [], lm.sync

    def spy(tokens, *args, **kwargs):
        synced.append(list(lm.tokens))
        return real_sync(tokens, *args, **kwargs)

    monkeypatch.setattr(lm, "sync", spy)
    times = prefill_times(lm, ids, rounds=3)
    assert synced == [[], [], []]  # every round started cold
    assert len(times) == 3 and times == sorted(times) and times[0] > 0
    assert list(lm.tokens) == []
    fresh = native_model(seed=3).new_cached_lm()
    fresh.sync(ids[:-1])
    real_sync(ids[:-1])
    torch.testing.assert_close(lm.extend([ids[-1]]), fresh.extend([ids[-1]]), rtol=0, atol=0)


def test_the_prefill_figure_reads_as_the_issue_spells_it():
    from specdec.native.bench import prefill_line

    assert prefill_line(512, 2.0) == "prefill of 512 tokens: 2000.0 ms (256.0 tok/s)"
