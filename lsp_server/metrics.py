"""Per-language (and per-workspace) acceptance metrics, persisted as JSON lines.

Every served request appends one record to `<state dir>/metrics.jsonl`; suggestions the
user accepts append an `accepted` event, and each online adaptation refresh an `online` one. `specdec stats` and the `specdec/stats` request
aggregate the same records, so the editor and the command line always agree.
"""

from __future__ import annotations

import bisect
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lsp_server import source_metrics
from specdec.paths import state_dir


@dataclass
class RequestRecord:
    time: float
    language: str
    workspace: str
    source: str  # "model" | "cache" | "typeahead"
    latency_ms: float  # request received -> suggestion ready
    new_tokens: int = 0
    produced: int = 0  # new tokens plus the stop token that ended generation, if any (see GenerationStats)
    drafted: int = 0
    accepted: int = 0
    target_passes: int = 0
    decode_seconds: float = 0.0
    prefill_reused: int = 0
    prefill_computed: int = 0
    shown: bool = False
    adapter: str = ""
    kind: str = "request"
    engine: str = "local"  # where it was computed: local, llama-server, vllm, sglang
    # how drafted/accepted/target_passes were known: "reported" (the engine's own counts for this request),
    # "prometheus" (a remote engine's server-wide counter deltas), "not reported" (they are 0 here and count
    # toward no acceptance or tokens per pass: a missing field is never zero acceptance)
    speculation: str = "reported"
    # per drafter source: {source: {"drafted": n, "accepted": n, "passes": n}} (source_metrics.py)
    by_source: dict[str, dict[str, int]] = field(default_factory=dict)
    # where a model answer's time went: queue (request received -> the model's worker began: debounce and the wait
    # for the model), then prefill and decode; early: answered with its first lines before the generation ended
    # (latency_ms is then the answer's, and the stats the whole generation's)
    queue_ms: float = 0.0
    prefill_seconds: float = 0.0
    early: bool = False


NOT_REPORTED = "not reported"
ONLINE_NUMBERS = ("steps", "seconds", "cpu_seconds", "heldout", "accepted_samples", "edited_samples")
ONLINE_KEPT = 50  # the newest online refresh records specdec/stats reports
_NUMBERS = ("time", "latency_ms", "drafted", "accepted", "target_passes", "decode_seconds", "prefill_reused",
            "prefill_computed", "new_tokens")


def usable(row) -> bool:
    """Whether a record has the shape aggregation reads: the file is appended to by any version, and may be
    edited by hand, so a line that is not an object or lacks a field is skipped, not fatal."""
    if not isinstance(row, dict) or not isinstance(row.get("language"), str):
        return False
    if not all(isinstance(row.get(f, ""), str) for f in ("workspace", "adapter", "engine", "speculation")):
        return False
    if not isinstance(row.get("time"), (int, float)):
        return False
    if row.get("kind") == "accepted":
        return True
    if row.get("kind") == "online":  # an online adaptation refresh (lsp_server/online.py)
        rates = (row.get("acceptance_before"), row.get("acceptance_after"))
        return isinstance(row.get("kept"), bool) and all(isinstance(row.get(f), (int, float)) for f in ONLINE_NUMBERS) \
            and all(r is None or isinstance(r, (int, float)) for r in rates)
    if row.get("kind") != "request" or not isinstance(row.get("source"), str) or "shown" not in row:
        return False
    return all(isinstance(row.get(f), (int, float)) for f in _NUMBERS) and \
        isinstance(row.get("produced", 0), (int, float))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def aggregate(records: list[dict]) -> dict:
    requests = [r for r in records if r.get("kind") == "request"]
    model = [r for r in requests if r["source"] == "model"]
    counted = [r for r in model if r.get("speculation", "reported") != NOT_REPORTED]  # speculation known
    drafted = sum(r["drafted"] for r in counted)
    passes = sum(r["target_passes"] for r in counted)
    decode = sum(r["decode_seconds"] for r in model)
    reused = sum(r["prefill_reused"] for r in model)
    computed = sum(r["prefill_computed"] for r in model)
    shown = sum(1 for r in requests if r["shown"])
    accepted_events = sum(1 for r in records if r.get("kind") == "accepted")
    return {
        "requests": len(requests),
        "model_requests": len(model),
        "cache_hits": sum(1 for r in requests if r["source"] == "cache"),
        "typeahead_hits": sum(1 for r in requests if r["source"] == "typeahead"),
        "acceptance_rate": sum(r["accepted"] for r in counted) / drafted if drafted else None,
        "tokens_per_pass": sum(r.get("produced", r["new_tokens"]) for r in counted if r["target_passes"]) / passes
        if passes else None,
        "speculation_not_reported": len(model) - len(counted),
        "tokens_per_second": sum(r["new_tokens"] for r in model) / decode if decode else None,
        "latency_p50_ms": percentile([r["latency_ms"] for r in requests], 0.5),
        "latency_p95_ms": percentile([r["latency_ms"] for r in requests], 0.95),
        "hit_latency_p50_ms": percentile([r["latency_ms"] for r in requests if r["source"] != "model"], 0.5),
        "hit_latency_p95_ms": percentile([r["latency_ms"] for r in requests if r["source"] != "model"], 0.95),
        "model_latency_p50_ms": percentile([r["latency_ms"] for r in model], 0.5),
        "model_latency_p95_ms": percentile([r["latency_ms"] for r in model], 0.95),
        "prefill_reused": reused,
        "prefill_computed": computed,
        "prefill_reuse_rate": reused / (reused + computed) if reused + computed else None,
        "shown": shown,
        "accepted": accepted_events,
        "user_accept_rate": accepted_events / shown if shown else None,
    }


def timeline(records: list[dict], window: int = 20, points: int = 60) -> dict[str, list[dict]]:
    """Per language, at up to `points` times: acceptance, tokens/pass and latency over the last `window` model
    requests, and the user's accept rate (accepted / shown suggestions, any source) over the same span of time."""
    by_language: dict[str, list[dict]] = {}
    shown: dict[str, list[float]] = {}
    taken: dict[str, list[float]] = {}
    for r in records:
        if r.get("kind") == "request" and r.get("source") == "model":
            by_language.setdefault(r["language"], []).append(r)
        if r.get("kind") == "request" and r.get("shown"):
            shown.setdefault(r["language"], []).append(r["time"])
        if r.get("kind") == "accepted":
            taken.setdefault(r["language"], []).append(r["time"])

    def count(times: list[float], start: float, end: float) -> int:
        return bisect.bisect_right(times, end) - bisect.bisect_left(times, start)

    out = {}
    for language, rows in by_language.items():
        step = max(1, len(rows) // points)
        series = []
        shown_times, taken_times = sorted(shown.get(language, [])), sorted(taken.get(language, []))
        for i in range(step - 1, len(rows), step):
            recent = rows[max(0, i - window + 1) : i + 1]
            agg = aggregate(recent)
            # a suggestion is accepted after it was shown: the span runs to the next point (or on, for the last)
            end = rows[i + step]["time"] if i + step < len(rows) else float("inf")
            n_shown = count(shown_times, recent[0]["time"], rows[i]["time"])
            series.append({"time": rows[i]["time"], "acceptance_rate": agg["acceptance_rate"],
                           "tokens_per_pass": agg["tokens_per_pass"], "latency_p50_ms": agg["latency_p50_ms"],
                           "user_accept_rate": min(1.0, count(taken_times, recent[0]["time"], end) / n_shown)
                           if n_shown else None})
        out[language] = series
    return out


def summarize(records: list[dict]) -> dict:
    """Totals, per language, per workspace, per (workspace, adapter version), per drafter source, and the
    online adaptation refreshes (newest last).

    Workspaces and adapters are lists of records rather than objects keyed by path, which
    some JSON-RPC clients cannot represent.
    """

    skipped = sum(1 for r in records if not usable(r))
    records = [r for r in records if usable(r)] if skipped else records
    refreshes = [r for r in records if r.get("kind") == "online"]
    records = [r for r in records if r.get("kind") != "online"] if refreshes else records

    def group(*fields: str) -> dict[tuple, dict]:
        groups: dict[tuple, list[dict]] = {}
        for r in records:
            groups.setdefault(tuple(r.get(f) or "" for f in fields), []).append(r)
        return {k: aggregate(v) for k, v in sorted(groups.items())}

    sources, skipped_sources = source_metrics.summarize(records)
    return {
        "total": aggregate(records),
        "languages": {k[0]: v for k, v in group("language").items()},
        "workspaces": [{"workspace": k[0], **v} for k, v in group("workspace").items()],
        "engines": [{"engine": k[0] or "local", "language": "(all)", **v} for k, v in group("engine").items()]
        + [{"engine": k[0] or "local", "language": k[1], **v} for k, v in group("engine", "language").items()],
        "adapters": [{"workspace": k[0], "adapter": k[1] or "base", **v}
                     for k, v in group("workspace", "adapter").items()],
        "timeline": timeline(records),
        "skipped_records": skipped,
        "sources": sources,
        "skipped_source_entries": skipped_sources,
        "online": refreshes[-ONLINE_KEPT:],
    }


HISTORY = 5_000  # the newest records a server keeps in memory, earlier sessions' included (the file keeps all)


@dataclass
class MetricsStore:
    path: Path = field(default_factory=lambda: state_dir() / "metrics.jsonl")
    records: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._prometheus = None
        self.index_stats = None  # the server's repository index stats (WorkspaceIndexer.stats), None while it is off
        self._summary: tuple[int, dict] | None = None  # (records added when computed, summary)
        self._added = 0
        self.skipped = 0  # malformed lines of the file, reported by summary()
        if not self.records and self.path.is_file():  # history survives a restart: stats and charts go on
            self.records, self.skipped = read_records(self.path)
            self.records = self.records[-HISTORY:]

    def add(self, record: RequestRecord | dict) -> None:
        row = asdict(record) if isinstance(record, RequestRecord) else record
        with self._lock:
            self.records.append(row)
            self._added += 1
            if len(self.records) > HISTORY:
                del self.records[: len(self.records) - HISTORY]
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
        if self._prometheus:
            self._prometheus.observe(row)

    def accepted(self, language: str, workspace: str, adapter: str = "") -> None:
        self.add({"kind": "accepted", "time": time.time(), "language": language, "workspace": workspace,
                  "adapter": adapter})

    def summary(self) -> dict:
        """Recomputed only after new records: editors poll `specdec/stats` every few seconds on the event loop."""
        with self._lock:
            if self._summary is None or self._summary[0] != self._added:
                summary = summarize(list(self.records))
                summary["skipped_records"] += self.skipped
                self._summary = (self._added, summary)
            return self._summary[1]

    def serve_prometheus(self, port: int, host: str = "127.0.0.1") -> None:
        self._prometheus = PrometheusExporter(port, host, lambda: self.index_stats() if self.index_stats else None)


def load_records(path: Path | None = None) -> list[dict]:
    return read_records(path)[0]


def read_records(path: Path | None = None) -> tuple[list[dict], int]:
    """(usable records, lines skipped): a torn last line after a crash, or a malformed one, loses itself only."""
    path = path or state_dir() / "metrics.jsonl"
    if not path.is_file():
        return [], 0
    rows, skipped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if usable(row):
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped


class RepoIndexCollector:
    """The repository index's gauges, read from the server's indexer at each scrape (0 while the index is off)."""

    GAUGES = (("specdec_repo_index_files", "files", "files in the repository index (its builds)"),
              ("specdec_repo_index_tokens", "tokens", "token ids in the repository index"),
              ("specdec_repo_index_bytes", "bytes", "memory of the repository index's arrays"),
              ("specdec_repo_index_last_build_seconds", "last_build_seconds",
               "seconds the latest build of a workspace folder took"))

    def __init__(self, stats):
        self.stats = stats

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        try:
            stats = self.stats() or {}
        except Exception:  # noqa: BLE001 - a scrape reports zeros rather than fail while the index changes hands
            stats = {}
        for name, key, doc in self.GAUGES:
            value = stats.get(key, 0)
            yield GaugeMetricFamily(name, doc, value=float(value) if isinstance(value, (int, float)) else 0.0)


class PrometheusExporter:
    """Counters and a latency histogram on 127.0.0.1, labelled by language (and drafter source, on the
    `_by_source` counters: the existing ones keep their labels); the repository index's gauges when
    `index_stats` (a callable answering WorkspaceIndexer.stats() or None) is given."""

    def __init__(self, port: int, host: str = "127.0.0.1", index_stats=None):
        from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

        self.registry = CollectorRegistry()
        if index_stats is not None:
            self.registry.register(RepoIndexCollector(index_stats))
        labels = ["language"]
        self.requests = Counter("specdec_requests", "completion requests", labels + ["source"], registry=self.registry)
        self.drafted = Counter("specdec_drafted_tokens", "drafted tokens", labels, registry=self.registry)
        self.accepted = Counter("specdec_accepted_tokens", "accepted drafted tokens", labels, registry=self.registry)
        self.suggestions_accepted = Counter("specdec_suggestions_accepted", "suggestions the user accepted", labels,
                                            registry=self.registry)
        by_source = labels + ["source"]
        self.drafted_by_source = Counter("specdec_drafted_tokens_by_source", "drafted tokens per drafter source",
                                         by_source, registry=self.registry)
        self.accepted_by_source = Counter("specdec_accepted_tokens_by_source",
                                          "accepted drafted tokens per drafter source", by_source,
                                          registry=self.registry)
        self.passes_by_source = Counter("specdec_target_passes_by_source",
                                        "target passes that verified a draft, per drafter source", by_source,
                                        registry=self.registry)
        by_engine = ["engine", "language"]  # acceptance and tokens per pass per engine, where the engine reports them
        self.engine_drafted = Counter("specdec_engine_drafted_tokens", "drafted tokens the engine reported",
                                      by_engine, registry=self.registry)
        self.engine_accepted = Counter("specdec_engine_accepted_tokens", "accepted drafted tokens the engine "
                                       "reported", by_engine, registry=self.registry)
        self.engine_tokens = Counter("specdec_engine_tokens", "tokens of requests whose speculation was reported",
                                     by_engine, registry=self.registry)
        self.engine_passes = Counter("specdec_engine_target_passes", "target passes the engine reported",
                                     by_engine, registry=self.registry)
        self.engine_unreported = Counter("specdec_engine_speculation_not_reported", "model requests whose engine "
                                         "did not report its speculation", by_engine, registry=self.registry)
        self.online_refreshes = Counter("specdec_online_refreshes", "online adaptation refreshes, by outcome",
                                        ["outcome"], registry=self.registry)
        self.latency = Histogram("specdec_latency_seconds", "time to suggestion", labels, registry=self.registry,
                                 buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
        start_http_server(port, addr=host, registry=self.registry)

    def observe(self, row: dict) -> None:
        lang = row.get("language", "")
        if row.get("kind") == "accepted":
            self.suggestions_accepted.labels(lang).inc()
            return
        if row.get("kind") == "online":
            outcome = "failed" if row.get("error") else "kept" if row.get("kept") else "discarded"
            self.online_refreshes.labels(outcome).inc()
            return
        self.requests.labels(lang, row["source"]).inc()
        if row["source"] == "model":
            engine = row.get("engine") or "local"
            if row.get("speculation", "reported") == NOT_REPORTED:
                self.engine_unreported.labels(engine, lang).inc()
            else:
                self.engine_drafted.labels(engine, lang).inc(row["drafted"])
                self.engine_accepted.labels(engine, lang).inc(row["accepted"])
                if row["target_passes"]:
                    self.engine_tokens.labels(engine, lang).inc(row.get("produced", row["new_tokens"]))
                    self.engine_passes.labels(engine, lang).inc(row["target_passes"])
        self.drafted.labels(lang).inc(row["drafted"])
        self.accepted.labels(lang).inc(row["accepted"])
        for source, counters in source_metrics.entries(row)[0].items():
            self.drafted_by_source.labels(lang, source).inc(counters["drafted"])
            self.accepted_by_source.labels(lang, source).inc(counters["accepted"])
            self.passes_by_source.labels(lang, source).inc(counters["passes"])
        self.latency.labels(lang).observe(row["latency_ms"] / 1000)
