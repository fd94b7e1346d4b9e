"""`specdec stats`: the server's persisted metrics as a table per language, and a chart."""

from __future__ import annotations

import json

import sys

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


def plot(records: list[dict], path: str, window: int = 20) -> None:
    """Running acceptance rate (over the last `window` model requests) per language, against time."""
    import datetime

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    series = {lang: [p for p in points if p["acceptance_rate"] is not None]
              for lang, points in timeline(records, window, points=500).items()}
    series = {lang: points for lang, points in series.items() if points}
    for language, points in sorted(series.items()):
        ax.plot([datetime.datetime.fromtimestamp(p["time"]) for p in points], [p["acceptance_rate"] for p in points],
                marker=".", label=language)
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"acceptance rate (last {window} requests)")
    ax.set_title("specdec: speculative acceptance per language")
    ax.grid(alpha=0.3)
    if series:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no model requests recorded yet", ha="center", transform=ax.transAxes)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args) -> int:
    records, skipped = read_records()
    summary = summarize(records)
    summary["skipped_records"] += skipped
    if skipped:
        print(f"skipped {skipped} malformed line{'s' * (skipped != 1)} of the metrics file", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not records:
        print("no metrics yet: they appear once the server has answered completion requests")
    else:
        print_table(summary)
    if args.plot:
        plot(records, args.plot)
        print(f"wrote {args.plot}")
    return 0
