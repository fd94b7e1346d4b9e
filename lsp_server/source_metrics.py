"""Acceptance and tokens per pass per drafter source (prompt lookup, draft model, repository index, ...).

`auto` picks a drafter per target pass, so a request's totals cannot say which drafter earns its
keep: each model request's record carries `by_source`, {source: {"drafted", "accepted", "passes"}},
from the engine's per-source counters. Source names are open-ended strings (the engine's
`Draft.source`): a new drafter shows up in every table without a change here.

Everything returned is a list of records, never an object keyed by source name, as for
workspaces in metrics.py: a JSON-RPC client may not represent arbitrary keys ("draft-tree").
"""

from __future__ import annotations

import math

COUNTERS = ("drafted", "accepted", "passes")


def from_stats(stats: dict) -> dict[str, dict[str, int]]:
    """A record's `by_source` from a backend result's stats (the engine's GenerationStats fields drafted_by,
    accepted_by, passes_by; absent for a backend that does not count per source)."""
    drafted, accepted, passes = (stats.get(key) or {} for key in ("drafted_by", "accepted_by", "passes_by"))
    return {source: {"drafted": drafted.get(source, 0), "accepted": accepted.get(source, 0),
                     "passes": passes.get(source, 0)}
            for source in sorted(set(drafted) | set(passes))}


def _valid(source, counters) -> bool:
    if not isinstance(source, str) or not source or not isinstance(counters, dict):
        return False
    values = [counters.get(name) for name in COUNTERS]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in values):
        return False
    drafted, accepted, passes = values
    # every pass of a source verified at least one of its drafted tokens
    return accepted <= drafted and passes <= drafted and (passes == 0) == (drafted == 0)


def entries(row: dict) -> tuple[dict[str, dict], int]:
    """(the well-formed entries of a record's `by_source`, how many were not).

    Records written before the field existed have none and lose nothing; the metrics file may be
    edited by hand, so a malformed entry is skipped and counted, and the record's own totals still count.
    """
    by_source = row.get("by_source")
    if by_source is None:
        return {}, 0
    if not isinstance(by_source, dict):
        return {}, 1
    good = {source: counters for source, counters in by_source.items() if _valid(source, counters)}
    return good, len(by_source) - len(good)


def _model_requests(records: list[dict]) -> list[dict]:
    """Model requests that recorded their sources (the denominator of each source's share of passes)."""
    return [r for r in records if r.get("kind") == "request" and r.get("source") == "model"
            and isinstance(r.get("by_source"), dict)]


def _rates(drafted: float, accepted: float, passes: float, all_passes: float) -> dict:
    return {"drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else None,
            "passes": passes,
            # a pass yields the draft's accepted tokens plus the one the target picks itself
            "tokens_per_pass": (accepted + passes) / passes if passes else None,
            "share_of_passes": passes / all_passes if all_passes else None}


def aggregate(records: list[dict]) -> list[dict]:
    """Per source over these records: drafted, accepted, acceptance rate, passes, tokens per pass, and the share
    of all target passes (undrafted ones included: the prefill's, and those where no drafter proposed) it drafted."""
    totals: dict[str, list[float]] = {}
    all_passes = 0
    for r in _model_requests(records):
        all_passes += r["target_passes"]
        for source, counters in entries(r)[0].items():
            sums = totals.setdefault(source, [0, 0, 0])
            for i, name in enumerate(COUNTERS):
                sums[i] += counters[name]
    return [{"source": source, **_rates(*sums, all_passes)} for source, sums in sorted(totals.items())]


def timeline(records: list[dict], window: int = 20, points: int = 60) -> list[dict]:
    """Per source, at up to `points` times: acceptance and tokens per pass over the last `window` model requests in
    which that source drafted."""
    by_source: dict[str, list[tuple[float, dict]]] = {}
    for r in _model_requests(records):
        for source, counters in entries(r)[0].items():
            if counters["passes"]:
                by_source.setdefault(source, []).append((r["time"], counters))
    out = []
    for source, rows in sorted(by_source.items()):
        step = max(1, len(rows) // points)
        series = []
        for i in range(step - 1, len(rows), step):
            recent = [c for _, c in rows[max(0, i - window + 1) : i + 1]]
            drafted, accepted, passes = (sum(c[name] for c in recent) for name in COUNTERS)
            rates = _rates(drafted, accepted, passes, 0)
            series.append({"time": rows[i][0], "acceptance_rate": rates["acceptance_rate"],
                           "tokens_per_pass": rates["tokens_per_pass"]})
        out.append({"source": source, "points": series})
    return out


def summarize(records: list[dict]) -> tuple[dict, int]:
    """(per source in total, per source x language, per source x workspace, and the timeline; entries skipped)."""

    def grouped(field: str) -> list[dict]:
        groups: dict[str, list[dict]] = {}
        for r in records:
            groups.setdefault(r.get(field) or "", []).append(r)
        return [{field: key, **row} for key, rows in sorted(groups.items()) for row in aggregate(rows)]

    skipped = sum(entries(r)[1] for r in records if r.get("kind") == "request")
    return {"total": aggregate(records), "languages": grouped("language"), "workspaces": grouped("workspace"),
            "timeline": timeline(records)}, skipped
