"""`specdec bench`: plain greedy vs HF assisted generation vs our strategies on one workload.

Baselines (`hf-plain`, `hf-assisted`, `hf-lookup`) are HF `generate` calls, cold, as a
completion request without a server would run. Our strategies run as the language
server runs them: the session already served the previous keystroke (same file, cursor
one character earlier), so only the changed tail of the prompt is prefilled; `--cold`
resets the session before every request instead. All requests are greedy, so every
output can be compared token for token with `hf-plain`.

Each row also shows the weight bandwidth it achieved (gpt-fast's figure: weight bytes x tokens/s;
specdec_bench.bandwidth) beside this machine's memory bandwidth, measured at the start of the
run, and the peak RSS: of this process, or of llama-server for the llama.cpp rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import statistics
import time
from pathlib import Path

from specdec.engine.strategies import STRATEGIES

HF = ("hf-plain", "hf-assisted", "hf-lookup")
OURS = STRATEGIES  # every engine strategy
REPACK_OFF_ENV = "LLAMA_ARG_REPACK=0"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _AssistantsOwnDeprecation(logging.Filter):
    """transformers' assisted generation calls the assistant's `generate` with a generation_config and generation
    arguments together, then logs that very call as deprecated (transformers 5.24): no argument of ours avoids it,
    so the hf-assisted row drops that one line and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "together with generation-related" not in record.getMessage()


@contextlib.contextmanager
def _quiet_assistant():
    logger, quiet = logging.getLogger("transformers.generation.utils"), _AssistantsOwnDeprecation()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def hf_generate(strategy: str, target, draft, prompt: list[int], max_new: int, stops: set[int]):
    import torch

    ids = torch.tensor([prompt])
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                  eos_token_id=sorted(stops), pad_token_id=sorted(stops)[0])
    if strategy == "hf-assisted":
        kwargs["assistant_model"] = draft
    elif strategy == "hf-lookup":
        kwargs["prompt_lookup_num_tokens"] = 10
    quiet = _quiet_assistant() if strategy == "hf-assisted" else contextlib.nullcontext()
    start = time.perf_counter()
    with torch.inference_mode(), quiet:
        out = target.generate(ids, **kwargs)[0, len(prompt):].tolist()
    seconds = time.perf_counter() - start
    for i, token in enumerate(out):
        if token in stops:
            out = out[:i]
            break
    return out, seconds


def start_llama(strategies: list[str], args, stack, skipped: dict[str, str]) -> dict:
    """A started LlamaAnchor per llama.cpp strategy asked for, on the same GGUFs. One that cannot run (llama.cpp
    not installed, no GGUF, a server that dies even with repacking off) goes into `skipped` with the reason,
    said once here: the other rows run without it."""
    from specdec_bench import llama
    from specdec.backends import llama_server
    from specdec.models.store import target_gguf

    asked = [s for s in strategies if s in llama.STRATEGIES]
    if not asked:
        return {}
    binary = llama_server.find_server()
    if binary is None:
        print(f"llama.cpp is not installed: skipping {', '.join(asked)}. Install it with:\n  "
              f"{llama_server.INSTALL_HINT}")
        skipped.update({s: "llama.cpp is not installed" for s in asked})
        return {}
    target = target_gguf(args.target)
    draft = target_gguf(args.draft) if "llama-draft" in asked else None
    if target is None:
        print(f"no GGUF for {args.target}: skipping {', '.join(asked)}")
        skipped.update({s: f"no GGUF for {args.target}" for s in asked})
        return {}
    anchors = {}
    for s in asked:
        try:
            extra = llama.server_args(s, draft)
        except ValueError as exc:
            skipped[s] = str(exc)
            print(f"skipping {s}: {skipped[s]}", flush=True)
            continue
        anchor = llama.LlamaAnchor(binary, target, extra)
        stack.callback(anchor.close)
        if anchor.start():
            anchors[s] = anchor
            if anchor.note:
                print(f"{s}: {anchor.repack_failure}; running with {anchor.note} ({REPACK_OFF_ENV})", flush=True)
        else:
            skipped[s] = anchor.failed
            print(f"skipping {s}: {anchor.failed}", flush=True)
    return anchors


def run_bench(args) -> int:
    import contextlib

    from specdec_bench import llama
    from specdec.errors import SpecdecError

    from specdec_bench.engine_rows import start_engines

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    engines = start_engines(args)  # --engine: remote engines' rows beside ours
    strategies += [name for name in engines if name not in strategies]
    known = [*HF, *OURS, *llama.STRATEGIES, *engines]
    unknown = [s for s in strategies if s not in known]
    if unknown:
        raise SpecdecError(f"unknown strategies {unknown}; known: {', '.join(known)}")
    skipped: dict[str, str] = {}  # strategy -> why its rows are missing
    with contextlib.ExitStack() as stack:
        anchors = start_llama(strategies, args, stack, skipped)
        strategies = [s for s in strategies if s not in skipped]
        if not strategies:
            print("nothing left to run: every strategy asked for was skipped", flush=True)
            return 1
        return _run(args, strategies, anchors, skipped, engines)


def _run(args, strategies: list[str], anchors: dict, skipped: dict[str, str], engines: dict | None = None) -> int:
    from specdec_bench.engine_rows import label as engine_label, run_engine

    engines = engines or {}
    from specdec_bench.workload import SOURCES, load_workload, local_sources
    from specdec.backends.local import LoadSpec, build
    from specdec.engine.session import GenerationConfig
    from specdec.models.int4 import int4_kernel_in_use
    from specdec.engine.cost_curve import cost_curve_key
    from specdec.engine.drafters.draft_view import DRAFT_SUFFIX_TOKENS
    from specdec.engine.strategies import make_drafter, needs_cost_curve, needs_draft_model, target_cost_curve
    from specdec.prompts import fim

    languages = [x.strip() for x in args.languages.split(",") if x.strip()] or None
    sources = local_sources(args.files) if args.files else SOURCES
    holes = load_workload(languages, args.holes or 2, sources)
    needs_draft = any(s == "hf-assisted" or needs_draft_model(s) for s in strategies)
    forward = getattr(args, "forward", "auto")
    hf = [s for s in strategies if s in HF]
    if hf and forward == "native":
        from specdec.errors import SpecdecError

        raise SpecdecError(f"{', '.join(hf)} run transformers' generate, which the native forward lacks: drop them "
                           f"or use --forward transformers")
    if hf and forward == "auto":  # the baselines and our strategies on one target, as they always were
        forward = "transformers"
        print(f"{', '.join(hf)} asked for: the target runs on transformers (--forward native without them)", flush=True)
    # one target and KV cache for every strategy: built plain, each strategy a Session derived over it (run_ours)
    built = build(LoadSpec(args.target, args.draft if needs_draft else "", "plain", args.dtype, args.draft_quant,
                           args.target_quant, args.int4_kernel, forward, device=args.device, adapter=args.adapter,
                           max_draft=args.max_draft, max_prefix_tokens=args.max_prefix_tokens,
                           max_suffix_tokens=args.max_suffix_tokens, load_draft=needs_draft))
    pair = built.pair
    target, tokenizer = pair.target.model, pair.target.tokenizer
    # what --int4-kernel resolved to ("" without int4 layers; "native" on the native forward)
    int4_kernel = getattr(target, "kernels", "") or int4_kernel_in_use(target)
    draft = pair.draft.model if pair.draft else None
    from specdec_bench.bandwidth import file_bytes, machine_bandwidth, weight_bytes

    machine = machine_bandwidth()
    weights = {s: file_bytes(anchors[s].model) if s in anchors else weight_bytes(target) for s in strategies}
    print(f"machine memory bandwidth (best of {machine['repeats']}, {machine['megabytes']} MB, "
          f"{machine['threads']} threads): read {machine['read_gbps']:.1f} GB/s, copy {machine['copy_gbps']:.1f} GB/s; "
          f"target weights read per token {weight_bytes(target) / 1e9:.2f} GB", flush=True)
    completer = built.completer
    session = completer.session
    stops = set(session.stop_token_ids)
    curve = None
    if any(needs_cost_curve(s, draft is not None) for s in strategies):
        curve = target_cost_curve(session.target, cost_curve_key(**pair.target_identity()))
        print(curve_line(curve), flush=True)
    repo = RepoRows(tokenizer) if "repo" in strategies else None
    markers = fim.markers(tokenizer, completer.template)  # the draft model's view of the prompt; the repo rows' index
    drafters = {s: make_drafter(s, draft, max_draft=args.max_draft, cost_curve=curve, prompt_markers=markers,
                                draft_suffix_tokens=getattr(args, "draft_suffix_tokens", DRAFT_SUFFIX_TOKENS),
                                **(repo.drafter_options() if s == "repo" else {})) for s in strategies if s in OURS}
    # per strategy, a session over the one target and its cache (the warm-cache behaviour measured: a strategy's
    # request follows its previous keystroke's on the same cache), the curve learnt from every timed pass from here
    # on, as in the server
    ours = {s: session.derive(drafter=drafter, strategy=s, cost_curve=curve) for s, drafter in drafters.items()}
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, max_draft=args.max_draft)

    session.generate(tokenizer.encode("def warm_up():\n    return"), GenerationConfig(4))  # threads, allocator
    session.reset()
    rows = []
    target_dtype = str(target.dtype).removeprefix("torch.")  # what `--dtype auto` resolved to
    print(f"{len(holes)} holes, strategies: {', '.join(strategies)}; target {args.target} ({target_dtype}), "
          f"target quant {pair.target_quant}{f' ({int4_kernel} kernel)' if int4_kernel else ''}, "
          f"draft {args.draft if needs_draft else '-'} ({args.draft_quant})",
          flush=True)
    for hole in holes:
        if repo is not None:
            repo.index_for(hole)
        prompt = completer.prompt(hole.prefix, hole.suffix).ids
        previous = completer.prompt(hole.prefix[:-1], hole.suffix).ids
        reference = None
        for strategy in list(strategies):
            row = {"hole": hole.name, "language": hole.language, "strategy": strategy, "prompt_tokens": len(prompt)}
            if strategy in HF:
                tokens, seconds = hf_generate(strategy, target, draft, prompt, args.max_new_tokens, stops)
                row.update(seconds=seconds, new_tokens=len(tokens), mode="cold")
            elif strategy in anchors:
                anchor = anchors[strategy]
                # the previous keystroke, untimed: its prompt cache then holds what ours does
                warmed = args.cold or anchor.complete(previous, 1, stops) is not None
                result = anchor.complete(prompt, args.max_new_tokens, stops) if warmed else None
                if result is None:  # died for good: the configuration goes, its rows so far with it
                    skipped[strategy] = anchor.failed
                    strategies.remove(strategy)
                    rows = [r for r in rows if r["strategy"] != strategy]
                    print(f"  skipping {strategy}: {anchor.failed}", flush=True)
                    continue
                row["llama_repack"] = anchor.repack
                tokens = result.tokens
                row.update(seconds=result.seconds, new_tokens=len(tokens), mode="cold" if args.cold else "warm",
                           drafted=result.drafted, accepted=result.accepted,
                           acceptance_rate=result.accepted / result.drafted if result.drafted else 0.0,
                           prefill_computed=result.prompt_tokens, prefill_seconds=result.prompt_ms / 1000)
            elif strategy in engines:
                tokens = run_engine(engines[strategy], hole, args, row, tokenizer)
            else:
                tokens = run_ours(ours[strategy], prompt, previous, config, args.cold, row)
            if reference is None:
                reference = tokens
            row["tokens_per_second"] = row["new_tokens"] / row["seconds"] if row["seconds"] else 0.0
            row["weight_bytes"] = weights[strategy]
            row["bandwidth_gbps"] = weights[strategy] * row["tokens_per_second"] / 1e9
            row["equals_plain"] = tokens == reference
            server_rss = anchors[strategy].peak_rss_mb() if strategy in anchors else None
            row["peak_rss_mb"] = round(server_rss if server_rss is not None else peak_rss_mb())
            row["text"] = tokenizer.decode(tokens)
            rows.append(row)
            name = engine_label(engines[strategy]) if strategy in engines else label(strategy, anchors)
            print(f"  {hole.name:28} {name:12} {row['new_tokens']:3d} tok {row['seconds']:6.2f}s "
                  f"{row['tokens_per_second']:5.2f} tok/s equal={row['equals_plain']}{tree_note(row)}", flush=True)

    if curve is not None:
        print(curve_line(curve), flush=True)  # what the planner ended with
    if not strategies:
        print("nothing left to run: every strategy was skipped", flush=True)
        return 1
    summary = summarize(rows, strategies)
    summary["machine_read_gbps"] = machine["read_gbps"]
    print_tables(summary, strategies, {s: engine_label(engines[s]) if s in engines else label(s, anchors)
                                       for s in strategies})
    print_llama_notes(anchors, skipped)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "config": {k: v for k, v in vars(args).items() if k not in ("func", "bench_runners")},
        "target_dtype": target_dtype,
        "target_quant": pair.target_quant,
        "int4_kernel": int4_kernel,
        "sources": [{"language": s.language, "package": s.package, "registry": s.registry, "file": s.member,
                     "license": s.license, "project": s.project} for s in sources],
        "peak_rss_mb": round(peak_rss_mb()),
        "machine_bandwidth": machine,
        "cost_curve": curve.report() if curve is not None else None,
        "llama": {s: {"repack": a.repack, "repack_failure": a.repack_failure} for s, a in anchors.items()
                  if s in strategies},
        "skipped": skipped,
        "summary": summary,
        "rows": rows,
    }, indent=2))
    print(f"\nwrote {out}; peak RSS {peak_rss_mb():.0f} MB")
    return 0


def label(strategy: str, anchors: dict) -> str:
    """A row's name in the tables: a llama.cpp row that runs without weight repacking says so."""
    anchor = anchors.get(strategy)
    return f"{strategy} ({anchor.note})" if anchor is not None and anchor.note else strategy


def print_llama_notes(anchors: dict, skipped: dict[str, str]) -> None:
    """Under the tables: how each llama.cpp row ran, and what was skipped and why."""
    for s, anchor in anchors.items():
        if anchor.note and s not in skipped:
            print(f"{s}: llama-server ran with weight repacking off ({REPACK_OFF_ENV}); with it on, "
                  f"{anchor.repack_failure.removeprefix('llama-server ')}")
    for s, reason in skipped.items():
        print(f"skipped {s}: {reason}")


def curve_line(curve) -> str:
    """Which verify cost curve the planner uses: its source (measured, cached, learned) and ms per pass size."""
    report = curve.report()
    learnt = f", {report['passes']} passes observed" if report["passes"] else ""
    return (f"target verify cost ({report['source']}{learnt}; ms per pass of n tokens): "
            + ", ".join(f"{n}: {ms:.0f}" for n, ms in report["ms"].items()))


class RepoRows:
    """The `repo` rows' repository index: per hole, the other files of the hole's own package with its suffix
    (workload.neighbours), as the workspace a user editing that file would have indexed; one index, refilled when
    the holes move to another source file."""

    def __init__(self, tokenizer):
        from specdec.engine.drafters.repo_index import RepoIndex

        self.tokenizer = tokenizer
        self.index = RepoIndex()
        self.source = None

    def drafter_options(self) -> dict:
        return {"repo_index": self.index}

    def index_for(self, hole) -> None:
        from specdec_bench.workload import neighbours

        if hole.source == self.source:
            return
        self.source = hole.source
        files = neighbours(hole.source)
        self.index.clear()
        self.index.add_many((name, self.tokenizer.encode(text)) for name, text in files)
        stats = self.index.stats()
        print(f"  repository index for {hole.source.name}: {len(files)} other {Path(hole.source.member).suffix} "
              f"files of {hole.source.package}, {stats.tokens} tokens", flush=True)


def run_ours(session, prompt: list[int], previous: list[int], config, cold: bool, row: dict,
             request=None) -> list[int]:
    """One request as the language server runs it (after the previous keystroke's, unless cold) on a strategy's
    session (one derived per strategy over the one target and its cache): its tokens; its time and speculation
    counters go into `row`. request: what the drafters read of it (drafters.base.RequestContext), both times."""
    from specdec.engine.session import GenerationConfig

    if cold:
        session.reset()
    else:  # the previous keystroke's request, untimed, leaves the caches as a server would
        session.generate(previous, GenerationConfig(max_new_tokens=1), request=request)
    result = session.generate(prompt, config, request=request)
    row.update(stats_row(result.stats), new_tokens=len(result.tokens), mode="cold" if cold else "warm")
    return result.tokens


def stats_row(s) -> dict:
    """A row's fields from one of our strategies' GenerationStats."""
    return dict(seconds=s.seconds, produced=s.produced, target_passes=s.target_passes, drafted=s.drafted,
                accepted=s.accepted, acceptance_rate=s.acceptance_rate, tokens_per_pass=s.tokens_per_pass,
                prefill_reused=s.prefill_reused, prefill_computed=s.prefill_computed,
                draft_prefill_computed=s.draft_prefill_computed, prefill_seconds=s.prefill_seconds,
                draft_seconds=s.draft_seconds, verify_seconds=s.verify_seconds,
                drafted_by=s.drafted_by, accepted_by=s.accepted_by, drafted_depth=s.drafted_depth,
                tree_passes=s.tree_passes)


def tree_note(row: dict) -> str:
    """What the drafts of one of our strategies looked like (`tree`, and `auto`, whose planner picks chains or
    trees): nodes and depth per drafting pass, and how many passes branched. Empty for other rows."""
    if row.get("tree_passes") is None or row.get("target_passes", 0) <= 1 or row.get("strategy") == "plain":
        return ""  # not ours, a single pass, or no drafter at all
    drafting = row["target_passes"] - 1  # the prefill pass drafts nothing
    return (f" tree: {row['drafted'] / drafting:.1f} nodes, {row['drafted_depth'] / drafting:.1f} deep "
            f"per pass, {row['tree_passes']}/{drafting} branched")


def summarize(rows: list[dict], strategies: list[str]) -> dict:
    baseline = strategies[0]
    base = {r["hole"]: r["tokens_per_second"] for r in rows if r["strategy"] == baseline}
    assisted = {r["hole"]: r["tokens_per_second"] for r in rows if r["strategy"] == "hf-assisted"}
    for r in rows:
        r["speedup"] = r["tokens_per_second"] / base[r["hole"]] if base.get(r["hole"]) else None
        r["vs_hf_assisted"] = r["tokens_per_second"] / assisted[r["hole"]] if assisted.get(r["hole"]) else None

    def aggregate(subset: list[dict]) -> dict:
        speedups = [r["speedup"] for r in subset if r["speedup"]]
        vs_assisted = [r["vs_hf_assisted"] for r in subset if r["vs_hf_assisted"]]
        drafted = sum(r.get("drafted", 0) for r in subset)
        passes = sum(r.get("target_passes", 0) for r in subset)
        return {
            "holes": len(subset),
            "tokens_per_second_median": statistics.median(r["tokens_per_second"] for r in subset),
            "bandwidth_gbps_median": statistics.median(r.get("bandwidth_gbps", 0.0) for r in subset),
            "seconds_median": statistics.median(r["seconds"] for r in subset),
            "speedup_median": statistics.median(speedups) if speedups else None,
            "speedup_min": min(speedups) if speedups else None,
            "vs_hf_assisted_median": statistics.median(vs_assisted) if vs_assisted else None,
            "acceptance_rate": sum(r.get("accepted", 0) for r in subset) / drafted if drafted else None,
            "tokens_per_pass": sum(r.get("produced", 0) for r in subset) / passes if passes else None,
            "equal_to_plain": sum(r["equals_plain"] for r in subset) / len(subset),
            "prefill_reused": sum(r.get("prefill_reused", 0) for r in subset),
            "prefill_computed": sum(r.get("prefill_computed", 0) for r in subset),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in subset),
        }

    languages = sorted({r["language"] for r in rows})
    return {
        "baseline": baseline,
        "overall": {s: aggregate([r for r in rows if r["strategy"] == s]) for s in strategies},
        "per_language": {lang: {s: aggregate([r for r in rows if r["strategy"] == s and r["language"] == lang])
                                for s in strategies} for lang in languages},
    }


def _fmt(value, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def print_tables(summary: dict, strategies: list[str], labels: dict[str, str] | None = None) -> None:
    labels = labels or {}
    width = max([12, *(len(labels.get(s, s)) for s in strategies)])
    machine = summary.get("machine_read_gbps")
    print(f"\nOverall (speedup vs {summary['baseline']}, per-hole tokens/s ratios; GB/s: weight bytes x tok/s, "
          f"as gpt-fast prints it{f', of {machine:.1f} GB/s this machine reads' if machine else ''})")
    print(f"{'strategy':{width}} {'tok/s':>6} {'speedup':>8} {'min':>6} {'vs-assist':>9} {'accept':>7} {'tok/pass':>8} "
          f"{'=plain':>7} {'reused':>7} {'GB/s':>6} {'RSS MB':>7}")
    for s in strategies:
        a = summary["overall"][s]
        reused = a["prefill_reused"] / (a["prefill_reused"] + a["prefill_computed"]) \
            if a["prefill_reused"] + a["prefill_computed"] else None
        print(f"{labels.get(s, s):{width}} {a['tokens_per_second_median']:6.2f} {_fmt(a['speedup_median'], '8.2f')} "
              f"{_fmt(a['speedup_min'], '6.2f')} {_fmt(a['vs_hf_assisted_median'], '9.2f')} "
              f"{_fmt(a['acceptance_rate'], '7.2f')} {_fmt(a['tokens_per_pass'], '8.2f')} "
              f"{a['equal_to_plain']:7.0%} {_fmt(reused, '7.0%')} {a['bandwidth_gbps_median']:6.1f} "
              f"{a['peak_rss_mb']:7d}")
    print("\nPer language: median speedup (acceptance)")
    print(f"{'language':12} " + " ".join(f"{labels.get(s, s):>14}" for s in strategies))
    for lang, per in summary["per_language"].items():
        cells = []
        for s in strategies:
            a = per[s]
            acc = f"({a['acceptance_rate']:.2f})" if a["acceptance_rate"] is not None else ""
            cells.append(f"{_fmt(a['speedup_median'], '.2f') + acc:>14}")
        print(f"{lang:12} " + " ".join(cells))
