"""`specdec bench --next-edit`: next edits on cases cut from real repositories' histories (issue #51 item 5).

Each case (specdec_bench.next_edit_cases: a commit's hunk, the file before it, the commit's earlier hunks as the
recent edits, the cursor on its first changed line) is asked as `specdec next-edit` asks it: NextEditor's prompt
(prompts/next_edit.py), greedy, --max-new-tokens 512 and --max-draft 16 unless given, every strategy on one loaded
pair and target cache, the cache emptied before each request (a cold request: the whole prompt prefilled, as the
server's next-edit prompt replaces the completion's cache). The edit it answers is applied to the file and compared
with the file after the hunk.

Per configuration: exact match (the edited file equals the expected one), "changed nothing" (no edit: the window came
back unchanged or did not end at its marker; `cut` counts the latter), the same place (the edit starts on the
hunk's first changed line), tokens per target pass, tokens/s, latency p50/p95 (the request's seconds: prompt,
prefill and generation) and =plain (the updated window equal to plain's, case by case; greedy, so 100% is the
engine's promise). Beside them, the "no edit" baseline: how often the expected edit is empty, so how often
predicting nothing would be exact (never, by construction: every case is a change).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from specdec.errors import SpecdecError

DEFAULT_OUTPUT = "bench-results/next-edit.json"
DEFAULT_STRATEGIES = ["plain", "edit"]
BENCH_MAX_NEW_TOKENS = 48  # the bench parser's default: a next edit's own is DEFAULT_MAX_NEW_TOKENS
BENCH_MAX_DRAFT = 8
NEXT_EDIT_MAX_DRAFT = 16  # `specdec next-edit`'s default


def register(parser):
    """`specdec bench --next-edit` and its flags; the runner answers None unless --next-edit was given. --limit is
    the bench's (humaneval_bench registers it): here the first N cases, round-robin across repositories."""
    parser.add_argument("--next-edit", action="store_true",
                        help="next-edit benchmark instead: cases cut from real repositories' histories "
                             "(--strategies default plain,edit; --limit N cases)")
    parser.add_argument("--next-edit-data", metavar="JSONL",
                        help="--next-edit: a cases file (default: the shipped bench/data/next_edit_cases.jsonl)")
    engine_default = parser.get_default("strategies")
    return lambda args: run(args, engine_default) if args.next_edit else None


# ---------------------------------------------------------------------------------------------- one case


def apply_edit(text: str, edit) -> str:
    """The document after an Edit (prompts.next_edit.Edit; None: unchanged)."""
    if edit is None:
        return text
    from specdec.prompts.next_edit import document_lines

    lines = document_lines(text)

    def offset(line: int, character: int) -> int:
        return sum(len(x) for x in lines[:line]) + character

    return text[:offset(edit.start_line, edit.start_character)] + edit.text + \
        text[offset(edit.end_line, edit.end_character):]


def score(case, result) -> dict:
    """What a NextEditResult made of a case: exact, changed nothing, cut, the same place, and its edit."""
    edit = result.edit
    return {"exact": apply_edit(case.text, edit) == case.expected, "changed_nothing": edit is None,
            "cut": result.generation.stop_reason != "eos", "same_place": edit is not None and edit.start_line ==
            case.line, "edit": edit.as_json() if edit else None}


def run_case(editor, case, config, strategy: str) -> dict:
    """One request from an empty cache, its row."""
    from specdec.prompts.next_edit import Hunk

    editor.session.reset()
    history = [Hunk(h["path"], h["original"], h["updated"]) for h in case.history]
    started = time.perf_counter()
    result = editor.predict(case.text, case.line, config, case.path, history)
    latency = time.perf_counter() - started
    s = result.generation.stats
    return {"case": case.id, "strategy": strategy, **score(case, result), "window": result.updated,
            "stop_reason": result.generation.stop_reason, "prompt_tokens": len(result.prompt.ids),
            "hunks": result.prompt.hunks, "new_tokens": s.new_tokens, "target_passes": s.target_passes,
            "drafted": s.drafted, "accepted": s.accepted, "seconds": s.seconds,
            "prefill_seconds": s.prefill_seconds, "latency": latency}


# ---------------------------------------------------------------------------------------------- the summary


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the nearest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    low, high = math.floor(at), math.ceil(at)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _mean(values: list) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(rows: list[dict], strategies: list[str], cases: list) -> dict:
    """Per strategy: cases, exact match, changed nothing, cut, same place, tokens per target pass (all its tokens over
    all its passes), tokens/s (all its tokens over all its seconds), latency p50/p95 and mean, and =plain (its
    windows equal to plain's on the cases both ran; None without a plain row). Beside them the "no edit" baseline:
    the share of cases whose expected edit is empty (what predicting nothing would get exact)."""
    plain = {r["case"]: r["window"] for r in rows if r["strategy"] == "plain"}
    summary = {}
    for strategy in strategies:
        mine = [r for r in rows if r["strategy"] == strategy]
        tokens, passes = sum(r["new_tokens"] for r in mine), sum(r["target_passes"] for r in mine)
        seconds = sum(r["seconds"] for r in mine)
        latencies = [r["latency"] for r in mine]
        compared = [r["window"] == plain[r["case"]] for r in mine if r["case"] in plain]
        summary[strategy] = {
            "cases": len(mine),
            "exact_match": _mean([r["exact"] for r in mine]),
            "changed_nothing": _mean([r["changed_nothing"] for r in mine]),
            "cut": _mean([r["cut"] for r in mine]),
            "same_place": _mean([r["same_place"] for r in mine]),
            "new_tokens": tokens,
            "target_passes": passes,
            "tokens_per_pass": tokens / passes if passes else None,
            "tokens_per_second": tokens / seconds if seconds else None,
            "latency_p50": percentile(latencies, 50),
            "latency_p95": percentile(latencies, 95),
            "latency_mean": _mean(latencies),
            "equal_plain": _mean(compared),
        }
    summary["no-edit baseline"] = {"cases": len(cases),
                                   "exact_match": _mean([c.expected == c.text for c in cases]),
                                   "changed_nothing": 1.0 if cases else None}
    return summary


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(summary: dict) -> str:
    """The summary as a Markdown table (what docs/next-edit.md shows)."""
    head = ("| configuration | cases | exact | changed nothing | cut | same place | tokens / pass | tokens / s | "
            "latency p50 (s) | latency p95 (s) | =plain |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['cases']} | {_fmt(s['exact_match'], '.1%')} | "
                     f"{_fmt(s['changed_nothing'], '.1%')} | {_fmt(s.get('cut'), '.1%')} | "
                     f"{_fmt(s.get('same_place'), '.1%')} | {_fmt(s.get('tokens_per_pass'), '.2f')} | "
                     f"{_fmt(s.get('tokens_per_second'), '.2f')} | {_fmt(s.get('latency_p50'), '.1f')} | "
                     f"{_fmt(s.get('latency_p95'), '.1f')} | {_fmt(s.get('equal_plain'), '.0%')} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the run


def strategies_of(args, engine_default: str) -> list[str]:
    from specdec.engine.strategies import NEXT_EDIT_STRATEGIES

    if args.strategies == engine_default:
        return list(DEFAULT_STRATEGIES)  # the engine benchmark's list holds HF baselines
    strategies = list(dict.fromkeys(s.strip() for s in args.strategies.split(",") if s.strip()))
    unknown = [s for s in strategies if s not in NEXT_EDIT_STRATEGIES]
    if unknown or not strategies:
        raise SpecdecError(f"--next-edit runs the next-edit strategies ({', '.join(NEXT_EDIT_STRATEGIES)}), "
                           f"not {unknown or 'none'}")
    return strategies


def editors(args, strategies: list[str], max_draft: int):
    """(tokenizer, {strategy: NextEditor}, what loaded): one pair loaded, each strategy's session derived over its
    target and cache, built as `specdec next-edit --strategy S` builds its own."""
    from specdec.backends.local import LoadSpec, build
    from specdec.engine.cost_curve import cost_curve_key
    from specdec.engine.strategies import make_drafter, needs_cost_curve, needs_draft_model, next_edit_base, \
        target_cost_curve
    from specdec.prompts import fim
    from specdec.prompts.next_edit import NextEditor

    with_draft = bool(args.draft)
    bases = {s: next_edit_base(s, with_draft) for s in strategies}
    needs_draft = with_draft and any(needs_draft_model(b) for b in bases.values())
    built = build(LoadSpec(args.target, args.draft if needs_draft else "", "plain", args.dtype, args.draft_quant,
                           getattr(args, "target_quant", "auto"), getattr(args, "int4_kernel", "auto"),
                           getattr(args, "forward", "auto"), device=getattr(args, "device", None),
                           adapter=getattr(args, "adapter", None), max_draft=max_draft, load_draft=needs_draft))
    session, pair = built.completer.session, built.pair
    draft = built.draft_model
    curve = None
    if any(needs_cost_curve(b, draft is not None) for b in bases.values()):
        curve = target_cost_curve(session.target, cost_curve_key(**pair.target_identity()))
    markers = fim.markers(session.tokenizer, built.completer.template)
    result = {}
    for strategy, base in bases.items():
        drafter = make_drafter(base, draft, max_draft=max_draft, cost_curve=curve, prompt_markers=markers)
        derived = session.derive(drafter=drafter, strategy=base, cost_curve=curve)
        result[strategy] = NextEditor.for_session(derived, strategy, max_draft=max_draft)
    loaded = {"target": args.target, "draft": args.draft if needs_draft else "", "target_quant": pair.target_quant,
              "draft_quant": args.draft_quant if needs_draft else ""}
    return session.tokenizer, result, loaded


def run(args, engine_default: str = "") -> int:
    from specdec.engine.sampling import SamplingConfig
    from specdec.engine.session import GenerationConfig
    from specdec.prompts.next_edit import DEFAULT_MAX_NEW_TOKENS
    from specdec_bench import next_edit_cases

    strategies = strategies_of(args, engine_default)
    data = Path(args.next_edit_data) if args.next_edit_data else next_edit_cases.DATA
    try:
        all_cases = next_edit_cases.load(data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecdecError(f"--next-edit-data: cannot read {data} ({exc})") from None
    cases = all_cases[:args.limit] if args.limit else all_cases
    max_new = DEFAULT_MAX_NEW_TOKENS if args.max_new_tokens == BENCH_MAX_NEW_TOKENS else args.max_new_tokens
    max_draft = NEXT_EDIT_MAX_DRAFT if args.max_draft == BENCH_MAX_DRAFT else args.max_draft
    repos = sorted({c.repo for c in cases})
    print(f"next edits: {len(cases)} of {len(all_cases)} cases from {', '.join(repos)}; strategies "
          f"{', '.join(strategies)}; --max-new-tokens {max_new}, --max-draft {max_draft}", flush=True)
    started = time.perf_counter()
    tokenizer, editors_by, loaded = editors(args, strategies, max_draft)
    load_seconds = time.perf_counter() - started
    print(f"models loaded in {load_seconds:.1f} s: target {loaded['target']} ({loaded['target_quant']}), draft "
          f"{loaded['draft'] or '-'}", flush=True)
    config = GenerationConfig(max_new, SamplingConfig(0.0), max_draft)
    first = next(iter(editors_by.values()))
    first.session.generate(tokenizer.encode("def warm_up():\n    return"), GenerationConfig(4))  # threads, allocator
    out = Path(args.output if args.output != "bench-results/bench.json" else DEFAULT_OUTPUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with out.with_name(out.name + ".rows.jsonl").open("w") as rows_file:
        for case in cases:
            for strategy in strategies:  # case by case, so a stopped run has every strategy's rows for its cases
                row = run_case(editors_by[strategy], case, config, strategy)
                rows.append(row)
                rows_file.write(json.dumps(row) + "\n")
                rows_file.flush()
                print(f"  {strategy:6} {case.id[:64]:64} exact={row['exact']!s:5} edit={row['edit'] is not None!s:5} "
                      f"{row['new_tokens']:3d} tok {row['target_passes']:3d} passes {row['latency']:6.1f} s",
                      flush=True)
    summary = summarize(rows, strategies, cases)
    print("\n" + table(summary))
    wall = time.perf_counter() - started
    out.write_text(json.dumps({
        "data": str(data), "cases": [c.id for c in cases], "cases_total": len(all_cases), "strategies": strategies,
        "models": loaded, "max_new_tokens": max_new, "max_draft": max_draft, "load_seconds": load_seconds,
        "wall_seconds": wall, "summary": summary, "rows": rows}, indent=2))
    print(f"\nwrote {out} ({wall:.0f} s)")
    return 0
