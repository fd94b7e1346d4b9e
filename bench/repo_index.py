"""`python -m specdec_bench.repo_index [PKG ...]`: the repository index over a ~10k-file workspace.

The workspace is made of pinned PyPI sdists (fetched once, cached, as the engine benchmark's
workload is), tokenized with the target's real tokenizer. A few held-out files are not
indexed: contexts cut from them are what a user typing a new file sends. Printed: files,
tokens, build seconds (select / tokenize / index), index bytes and peak RSS, lookup latency,
and how much of the held-out files' real next tokens the index's chain predicts (a ceiling
on its acceptance: a target that wrote exactly the file), with prompt lookup over the same
file's preceding text beside it. `--compare` measures the index's structure against an
n-gram hash index and a suffix automaton (suffix_structures.py). Not a timed test: numbers
go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from specdec.paths import cache_dir

PACKAGES = ("Django==5.1.4", "ansible-core==2.18.1", "transformers==4.46.3", "sympy==1.13.3", "Twisted==24.11.0")
HELD_OUT = 100  # files kept out of the index; contexts are cut from them
CONTEXT = 1024  # tokens before the cursor a query sees (prompt lookup searches all of them; the index its last 32)
K = 8  # drafted tokens per query


def fetch(packages: tuple[str, ...]) -> Path:
    """The sdists unpacked side by side in one folder (the workspace), each once."""
    from specdec_bench.workload import fetch_sdist

    root = cache_dir() / "repo-index-bench"
    workspace = root / "workspace"
    for package in packages:
        fetch_sdist(package, workspace, root / "archives")
    return workspace


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak so far, KiB on Linux


def agreement(proposed: list[int], actual: list[int]) -> int:
    """How many proposed tokens a target that wrote `actual` would accept."""
    n = 0
    while n < min(len(proposed), len(actual)) and proposed[n] == actual[n]:
        n += 1
    return n


def evaluate(index, samples: list[tuple[list[int], list[int]]]) -> dict:
    """Lookup latency (wall and this thread's CPU: the machine is shared) and how much of the real next tokens the
    index's chain, and prompt lookup over the same context, predict."""
    from specdec.engine.drafters.prompt_lookup import PromptLookup

    lookup = PromptLookup(max_continuation=K)
    wall, cpu, hits, repo_ok, repo_drafted, lookup_ok, lookup_drafted = [], [], 0, [], 0, [], 0
    for context, actual in samples:
        t0, c0 = time.perf_counter(), time.thread_time()
        found = index.query(context, min_match=2, horizon=K)
        chain = found.chain(K, 0.2)[0] if found else []
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
        hits += bool(chain)
        repo_ok.append(agreement(chain, actual))
        repo_drafted += len(chain)
        guess = lookup.propose(context, K).tokens
        lookup_ok.append(agreement(guess, actual))
        lookup_drafted += len(guess)
    wall.sort()
    cpu.sort()
    return {"count": len(samples), "wall_us_p50": 1e6 * wall[len(wall) // 2], "cpu_us_mean": 1e6 * statistics.mean(cpu),
            "cpu_us_p50": 1e6 * cpu[len(cpu) // 2], "cpu_us_p99": 1e6 * cpu[int(len(cpu) * 0.99)],
            "repo_drafts_at": hits / len(samples), "repo_accepted_per_query": statistics.mean(repo_ok),
            "repo_acceptance": sum(repo_ok) / repo_drafted if repo_drafted else None,
            "prompt_lookup_accepted_per_query": statistics.mean(lookup_ok),
            "prompt_lookup_acceptance": sum(lookup_ok) / lookup_drafted if lookup_drafted else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_bench.repo_index", description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES), help="pinned PyPI sdists (name==version)")
    parser.add_argument("--target", default=None, help="model whose tokenizer is used (default: the catalog target)")
    parser.add_argument("--max-tokens", default="", help="the index's cap, or several comma-separated (one build each, "
                        "the selection shared; default: the server's)")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--compare", type=int, default=0, metavar="TOKENS",
                        help="also compare the structures over the first TOKENS indexed tokens")
    parser.add_argument("--automaton-tokens", type=int, default=300_000)
    parser.add_argument("--output", default="", help="write the results as JSON here too")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from specdec.engine.drafters.repo_index import DEFAULT_MAX_TOKENS, RepoIndex
    from specdec.models.catalog import DEFAULT_TARGET
    from specdec.models.store import resolve
    from specdec.repository.build import build_index, tokenize
    from specdec.repository.files import select

    workspace = fetch(tuple(args.packages))
    tokenizer = AutoTokenizer.from_pretrained(str(resolve(args.target or DEFAULT_TARGET)))
    rss_before = rss_mb()
    started = time.perf_counter()
    selection = select(workspace)
    rng = random.Random(0)
    held = set(rng.sample(range(len(selection.files)), min(HELD_OUT, len(selection.files) // 10)))
    held_out = [selection.files[i] for i in sorted(held)]
    selection.files = [f for i, f in enumerate(selection.files) if i not in held]
    select_seconds = time.perf_counter() - started
    texts = [(workspace / f).read_text(encoding="utf-8", errors="replace") for f in held_out]
    documents = [ids for ids in tokenize(tokenizer, texts) if len(ids) > 2 * K]
    samples = []
    for _ in range(args.queries):
        ids = rng.choice(documents)
        cut = rng.randrange(1, len(ids) - K)
        samples.append((ids[max(0, cut - CONTEXT) : cut], ids[cut : cut + K]))
    result = {"packages": args.packages, "files_selected": len(selection.files) + len(held_out),
              "files_skipped": len(selection.skipped), "held_out_files": len(held_out), "select_seconds": select_seconds,
              "rss_before_mb": rss_before, "builds": []}
    caps = [int(c) for c in args.max_tokens.split(",") if c.strip()] or [DEFAULT_MAX_TOKENS]
    for cap in caps:
        index = RepoIndex(cap)
        report = build_index(workspace, tokenizer, index, selection=selection)
        report.select_seconds = select_seconds
        report.seconds += select_seconds
        result["builds"].append({"max_tokens": cap, "build": report.as_dict(), "index": index.stats().as_dict(),
                                 "rss_peak_mb": rss_mb(), "queries": evaluate(index, samples)})
        print(json.dumps(result["builds"][-1], indent=2), file=sys.stderr)
    if args.compare:
        from specdec_bench.suffix_structures import compare

        parts, total = [np.array([-1], np.int32)], 0
        for doc in index.keys():
            ids = np.asarray(tokenize(tokenizer, [Path(doc).read_text(encoding="utf-8", errors="replace")])[0],
                             np.int32)
            parts += [ids, np.array([-1], np.int32)]
            total += len(ids) + 1
            if total >= args.compare:
                break
        stream = np.concatenate(parts)[: args.compare]
        contexts = [context for context, _ in samples[:500]]
        result["structures"] = compare(stream, contexts, args.automaton_tokens)

    print(json.dumps(result, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
