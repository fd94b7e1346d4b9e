"""`specdec stats`: the server's persisted metrics as a table per language and one per drafter source, and a chart."""

from __future__ import annotations

import json

import sys

from lsp_server import source_metrics
from lsp_server.metrics import read_records, summarize, timeline


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(summary: dict) -> None:
    cols = ("requests", "accept", "tok/pass", "tok/s", "p50 ms", "p95 ms", "reused", "shown", "taken")
    print(f"{'language':14} " + " ".join(f"{c:>9}" for c in cols))
    rows = list(summary["languages"].items()) + [("(all)", summary["total"])]
    for name, a in rows:
        cells = [str(a["requests"]), _fmt(a["acceptance_rate"], ".2f"), _fmt(a["tokens_per_pass"], ".2f"),
                 _fmt(a["tokens_per_second"], ".1f"), _fmt(a["latency_p50_ms"], ".0f"), _fmt(a["latency_p95_ms"], ".0f"),
                 _fmt(a["prefill_reuse_rate"], ".0%"), str(a["shown"]), _fmt(a["user_accept_rate"], ".0%")]
        print(f"{name[:14]:14} " + " ".join(f"{c:>9}" for c in cells))


def print_engine_table(summary: dict) -> None:
    """Per engine and language: the engine's own speculation (a remote engine's reported counts)."""
    cols = ("requests", "accept", "tok/pass", "p50 ms", "unreported")
    print(f"\n{'engine':14} {'language':14} " + " ".join(f"{c:>10}" for c in cols))
    for a in summary["engines"]:
        cells = [str(a["model_requests"]), _fmt(a["acceptance_rate"], ".2f"), _fmt(a["tokens_per_pass"], ".2f"),
                 _fmt(a["model_latency_p50_ms"], ".0f"), str(a["speculation_not_reported"])]
        print(f"{a['engine'][:14]:14} {a['language'][:14]:14} " + " ".join(f"{c:>10}" for c in cells))


def print_source_table(summary: dict) -> None:
    """Per drafter source, per language then per repository: which drafter earns its keep where."""
    cols = ("drafted", "accept", "passes", "tok/pass", "share")
    sources = summary["sources"]
    for title, key in (("language", "language"), ("repository", "workspace")):
        print(f"\n{'source':12} {title:24} " + " ".join(f"{c:>9}" for c in cols))
        for row in sources[key + "s"] + [{key: "(all)", **row} for row in sources["total"]]:
            cells = [f"{row['drafted']:.0f}", _fmt(row["acceptance_rate"], ".2f"), f"{row['passes']:.0f}",
                     _fmt(row["tokens_per_pass"], ".2f"), _fmt(row["share_of_passes"], ".0%")]
            print(f"{row['source'][:12]:12} {_tail(row[key], 24):24} " + " ".join(f"{c:>9}" for c in cells))


def _tail(text: str, width: int) -> str:
    """A repository path keeps its end, the part that names it."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


def figure(records: list[dict], window: int = 20):
    """Running acceptance rate (over the last `window` model requests) per language, and per drafter source
    (over the last `window` requests it drafted in), against time."""
    import datetime

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_language, by_source) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    panels = ((by_language, timeline(records, window, points=500), "language", f"last {window} requests",
               "no model requests recorded yet"),
              (by_source, {s["source"]: s["points"] for s in source_metrics.timeline(records, window, points=500)},
               "drafter source", f"its last {window} requests", "no drafted passes recorded yet"))
    for ax, lines, what, span, empty in panels:
        series = {name: [p for p in points if p["acceptance_rate"] is not None] for name, points in lines.items()}
        series = {name: points for name, points in series.items() if points}
        for name, points in sorted(series.items()):
            ax.plot([datetime.datetime.fromtimestamp(p["time"]) for p in points],
                    [p["acceptance_rate"] for p in points], marker=".", label=name)
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"acceptance rate ({span})")
        ax.set_title(f"specdec: speculative acceptance per {what}")
        ax.grid(alpha=0.3)
        if series:
            ax.legend()
        else:
            ax.text(0.5, 0.5, empty, ha="center", transform=ax.transAxes)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def plot(records: list[dict], path: str, window: int = 20) -> None:
    import matplotlib.pyplot as plt

    fig = figure(records, window)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> int:
    records, skipped = read_records()
    summary = summarize(records)
    summary["skipped_records"] += skipped
    if skipped:
        print(f"skipped {skipped} malformed line{'s' * (skipped != 1)} of the metrics file", file=sys.stderr)
    if summary["skipped_source_entries"]:
        n = summary["skipped_source_entries"]
        print(f"skipped {n} malformed per-source entr{'ies' if n != 1 else 'y'} of the metrics file", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not records:
        print("no metrics yet: they appear once the server has answered completion requests")
    else:
        print_table(summary)
        if any(row["engine"] != "local" for row in summary["engines"]):
            print_engine_table(summary)
        if summary["sources"]["total"]:
            print_source_table(summary)
    if args.plot:
        plot(records, args.plot)
        print(f"wrote {args.plot}")
    return 0
