"""`specdec bench --repo PKG`: what the repository index, a LoRA adapter, both, and online adaptation buy on a
file the index has never seen.

Each package is a pinned PyPI sdist (`name==version`, fetched once and cached as the engine benchmark's sources
are) or a local folder. Its files are split as `specdec finetune` splits them (specdec.repository.files.
split_heldout); the repository index is built over the training files only, a LoRA adapter is fine-tuned on the
same files (a small step budget, cached per package and settings), and FIM holes are cut from the held-out files:
a user typing in a file the index has not seen. Configurations, run hole by hole (so a noisy moment of a shared
machine hits them all alike), every request warm after the previous keystroke's as the server runs it:

  base     the `draft` strategy, the base draft
  +lora    the `draft` strategy, the adapter folded in
  +index   `auto` with the index, the base draft
  +both    `auto` with the index and the adapter
  +online  `auto` with the index and the adapter after one online refresh (finetune/online.py) from replaying
           the held-out files: their text minus the holes' lines as the edited documents, and the target's
           completions at other points of that text as the accepted ones. No hole's answer is trained on: its
           lines, and every line containing one of them, are cut, and a completion that contains one is dropped.

Greedy and lossless: every configuration's output is compared with base's (`=base`). Printed per package:
acceptance, tokens per target pass, median tokens/s over the holes, and its change against base.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.online_job import OnlineJob
from specdec_bench.finetune import _finetune_args

REPO_OUTPUT = "bench-results/repo.json"
ONLINE_ACCEPTED = 20  # accepted completions replayed: what the server gathers before a refresh (onlineEveryAccepted)
ANSWER_CHARS = 8  # a hole's answer line at least this long is kept out of training wherever it occurs


@dataclass(frozen=True)
class Config:
    name: str
    strategy: str
    adapter: str  # "" (base draft) | "lora" | "online"
    index: bool

    @property
    def label(self) -> str:
        return self.name if self.name == "base" else f"+{self.name}"


CONFIGS = {c.name: c for c in (Config("base", "draft", "", False), Config("lora", "draft", "lora", False),
                               Config("index", "auto", "", True), Config("both", "auto", "lora", True),
                               Config("online", "auto", "online", True))}


def parse_configs(text: str) -> list[Config]:
    names = [n.strip().lstrip("+") for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise SpecdecError(f"--repo-configs: unknown {', '.join(unknown) or '(none given)'}; "
                           f"choose from {','.join(CONFIGS)}")
    return [c for name, c in CONFIGS.items() if name in names]  # in the table's order


def parse_packages(values: list[str]) -> list[str]:
    """--repo, repeated or comma-separated, in order, each once."""
    return list(dict.fromkeys(p.strip() for v in values for p in v.split(",") if p.strip()))


# -- the held-out replay: what online adaptation may train on -------------------------------------------------
def hole_lines(hole) -> range:
    """Indexes of the lines a hole touches (it runs from its cursor to the end of a line)."""
    return range(hole.line - 1, hole.line + hole.middle.count("\n"))


def scrub(text: str, holes) -> tuple[str, set[str]]:
    """(the text without the holes' lines and any line that holds one of their answers, the answers)."""
    lines = text.split("\n")
    drop = {i for hole in holes for i in hole_lines(hole)}
    found = {piece.strip() for hole in holes for piece in hole.middle.split("\n")}
    found |= {lines[i].strip() for i in drop if i < len(lines)}
    found = {a for a in found if len(a) >= ANSWER_CHARS}
    kept = [line for i, line in enumerate(lines) if i not in drop and not any(a in line for a in found)]
    return "\n".join(kept), found


def replay_job(args, root: Path, heldout, holes, completer, drafter, draft_hash: str, seed: int = 0,
               report=print) -> OnlineJob:
    """The OnlineJob the server would send after the user typed the held-out files: the edited documents
    (text minus the holes' answers) and ONLINE_ACCEPTED completions of the target at other points of them."""
    from specdec_bench.workload import SourceFile, cut_holes
    from specdec.engine.session import GenerationConfig

    session = completer.session
    edited, scrubbed, found = [], {}, set()
    for f in heldout:
        text, answers_here = scrub(f.text, [h for h in holes if h.source.member == f.path])
        scrubbed[f.path], found = text, found | answers_here
        edited.append({"path": f.path, "language": f.language, "text": text})
    per_file = math.ceil(ONLINE_ACCEPTED / max(1, len(heldout)))
    accepted, dropped = [], 0
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, max_draft=args.max_draft)
    session = session.derive(drafter=drafter, strategy="draft")  # the completer's target and cache
    for f in heldout:
        source = SourceFile(f.language, "local", f"replay:{f.path}", f.path, "", "")
        for point in cut_holes(source, scrubbed[f.path], per_file, seed):
            tokens = session.generate(completer.prompt(point.prefix, point.suffix).ids, config).tokens
            text = completer.session.tokenizer.decode(tokens)
            if any(a in text for a in found):
                dropped += 1  # the target wrote a hole's answer here: never trained on
                continue
            if len(tokens) >= 2:
                accepted.append({"path": f.path, "language": f.language, "prefix": point.prefix,
                                 "suffix": point.suffix, "tokens": tokens, "text": text})
    accepted = accepted[:ONLINE_ACCEPTED]
    report(f"  replay: {len(edited)} edited files, {len(accepted)} accepted completions "
           f"({dropped} dropped for holding a hole's answer)")
    return OnlineJob(str(root), args.draft, args.target, draft_hash, args.dtype, args.draft_quant, accepted=accepted,
                     edited=edited, forward=getattr(args, "forward", "auto"))  # the target labels as the server's


# -- the adapter: trained once per package and settings ----------------------------------------------------------
def adapter_folder(name: str, ft_args, config, split, target_hash: str, draft_hash: str) -> Path:
    from specdec.paths import cache_dir
    from specdec_adapters.registry import slug

    digest = hashlib.sha256(json.dumps({"target": ft_args.target, "target_hash": target_hash, "draft": ft_args.draft,
                                        "draft_hash": draft_hash, "dtype": ft_args.dtype, "train": asdict(config),
                                        "holdout": ft_args.holdout, "seed": ft_args.seed},
                                       sort_keys=True, default=list).encode())
    for f in split.train:  # the training text itself: a changed local folder trains again
        digest.update(f"{f.path}\0{f.text}\0".encode())
    return cache_dir() / "repo-bench" / "adapters" / f"{slug(name)}-{digest.hexdigest()[:16]}"


def trained_adapter(ft_args, target, split, folder: Path, report=print) -> dict:
    """The LoRA adapter of `specdec finetune`'s training over the split's training files, from the cache or trained
    now (against the bench's own loaded target); returns what the training recorded."""
    from specdec.models.loading import check_same_tokenizer, load
    from specdec.prompts import fim
    from specdec_finetune.dataset import SampleBuilder
    from specdec_finetune.run import MAX_SAMPLES, train_config
    from specdec_finetune.train import train

    if (folder / "training.json").is_file():
        report(f"  adapter: cached {folder.name}")
        return {**json.loads((folder / "training.json").read_text()), "cached": True}
    config = train_config(ft_args)
    tokenizer = target.tokenizer
    samples = SampleBuilder(tokenizer, fim.detect(tokenizer), config.seq_len).samples(
        split.train, min(config.max_steps * config.batch_size, MAX_SAMPLES), ft_args.seed)
    draft = load(ft_args.draft, "fp32")
    check_same_tokenizer(tokenizer, draft.tokenizer, ft_args.target, ft_args.draft)
    report(f"  adapter: training {config.max_steps} steps at most ({config.max_minutes:g} min) on {len(samples)} "
           f"samples of {len(split.train)} files")
    with tempfile.TemporaryDirectory() as work:
        model, result = train(draft.model, target.model if config.objective != "lm" else None, tokenizer, samples,
                              config, Path(work) / "run", progress=not getattr(ft_args, "quiet", False))
        out = Path(work) / "adapter"
        model.save_pretrained(out)
        training = {**asdict(result), **asdict(config), "samples": len(samples), "losses": result.losses[-20:]}
        (out / "training.json").write_text(json.dumps(training, default=list))
        folder.parent.mkdir(parents=True, exist_ok=True)
        incoming = folder.with_name(folder.name + ".incoming")
        shutil.rmtree(incoming, ignore_errors=True)
        shutil.copytree(out, incoming)
        os.replace(incoming, folder)  # whole or absent: an interrupted run trains again
    del model, draft
    return {**training, "cached": False}


def online_adapter(job: OnlineJob, root: Path, lora: Path, draft_hash: str, args, work: Path, report=print) -> tuple:
    """(adapter folder, refresh outcome): the LoRA adapter continued by one refresh, in a private registry (the
    user's is never touched); the LoRA adapter itself when the refresh did not keep its result."""
    from specdec_adapters.registry import AdapterMeta, Registry, repo_identity
    from specdec_finetune.online import refresh

    registry = Registry(work / "registry")
    key, remote, commit = repo_identity(root)
    registry.register(lora, AdapterMeta(repo_key=key, version="", repo_root=str(root), git_remote=remote,
                                        git_commit=commit, base_draft=args.draft, base_draft_hash=draft_hash,
                                        target=args.target, training={"bench": "repo"}))
    outcome = refresh(job, lambda message: report(f"  online: {message}"), registry=registry)
    if outcome.get("adapter"):
        return registry.path(registry.get(*outcome["adapter"].split("@"))), outcome
    return lora, outcome


# -- the measurement -------------------------------------------------------------------------------------------
def summarize(rows: list[dict], configs: list[Config]) -> dict:
    base_rows = [r for r in rows if r["config"] == "base"]
    base = {r["hole"]: r["tokens_per_second"] for r in base_rows}
    base_median = statistics.median(base.values()) if base else None
    out = {}
    for c in configs:
        mine = [r for r in rows if r["config"] == c.label]
        if not mine:
            continue
        drafted, passes = sum(r["drafted"] for r in mine), sum(r["target_passes"] for r in mine)
        median = statistics.median(r["tokens_per_second"] for r in mine)
        ratios = [r["tokens_per_second"] / base[r["hole"]] for r in mine if base.get(r["hole"])]
        equal = [r["equals_base"] for r in mine if r["equals_base"] is not None]
        out[c.label] = {
            "holes": len(mine),
            "acceptance_rate": sum(r["accepted"] for r in mine) / drafted if drafted else None,
            "tokens_per_pass": sum(r["produced"] for r in mine) / passes if passes else None,
            "tokens_per_second_median": median,
            "delta_tokens_per_second": median / base_median - 1 if base_median else None,
            "delta_per_hole_median": statistics.median(ratios) - 1 if ratios else None,
            "equal_to_base": sum(equal) / len(equal) if equal else None,
        }
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(name: str, result: dict) -> None:
    line = (f"\n{name}: {result['train_files']} training / {len(result['heldout_files'])} held-out files, "
            f"{len(result['holes'])} holes")
    if result.get("index"):
        line += f"; index {result['index']['build']['files']} files, {result['index']['build']['tokens']} tokens"
    print(line)
    if result.get("adapter"):
        a = result["adapter"]
        print(f"adapter: {a['steps']} steps, {a['tokens']} tokens, {a['seconds'] / 60:.1f} min"
              + (" (cached)" if a.get("cached") else ""))
    if result.get("online"):
        o = result["online"]
        before, after = (o.get("before") or {}).get("acceptance_rate"), (o.get("after") or {}).get("acceptance_rate")
        state = o.get("skipped") or ("kept" if o.get("kept") else "discarded (acceptance fell): +online is +both's "
                                                                   "adapter")
        print(f"online refresh: {o.get('steps', 0)} steps, held-out acceptance {_fmt(before, '.3f')} -> "
              f"{_fmt(after, '.3f')}, {state}")
    print(f"{'config':8} {'accept':>7} {'tok/pass':>8} {'tok/s':>7} {'Δ tok/s':>8} {'Δ/hole':>7} {'=base':>6}")
    for label, s in result["summary"].items():
        print(f"{label:8} {_fmt(s['acceptance_rate'], '7.3f')} {_fmt(s['tokens_per_pass'], '8.2f')} "
              f"{s['tokens_per_second_median']:7.2f} {_fmt(s['delta_tokens_per_second'], '+8.1%')} "
              f"{_fmt(s['delta_per_hole_median'], '+7.1%')} {_fmt(s['equal_to_base'], '6.0%')}")
    print("(tok/s: median over the holes; Δ tok/s: that median against base's; Δ/hole: median of the per-hole "
          "ratios; =base: outputs equal to base's)")


def bench_package(spec: str, args, configs: list[Config], models: dict, report=print) -> dict:
    from specdec_bench.runner import peak_rss_mb, run_ours
    from specdec_bench.workload import repo_root
    from specdec.engine.drafters.repo_index import RepoIndex
    from specdec.engine.session import GenerationConfig
    from specdec.engine.drafters.base import RequestContext
    from specdec.engine.strategies import make_drafter
    from specdec.models.loading import load_draft
    from specdec.prompts import fim
    from specdec.repository.build import build_index, document_key
    from specdec.repository.files import FileSelection
    from specdec_finetune.evaluate import holes_for
    from specdec_finetune.run import split_repo, train_config

    root = repo_root(spec)
    ft_args = _finetune_args(args, repo=root, max_steps=args.repo_steps)
    _, selection, split = split_repo(str(root), ft_args.holdout, ft_args.seed)
    holes = holes_for(split.heldout, args.holes or 2, ft_args.seed)
    if not holes:
        raise SpecdecError(f"--repo {spec}: no holes could be cut from its {len(split.heldout)} held-out files")
    report(f"\n== {spec}: {len(split.train)} training / {len(split.heldout)} held-out files, {len(holes)} holes")
    target, completer, base_draft = models["target"], models["completer"], models["draft"]
    result = {"package": spec, "root": str(root), "train_files": len(split.train),
              "heldout_files": [f.path for f in split.heldout], "holes": [h.name for h in holes],
              "configs": [c.label for c in configs]}
    index = None
    if any(c.index for c in configs):
        train_paths = {f.path for f in split.train}
        index = RepoIndex()  # the server's default cap
        build = build_index(selection.root, target.tokenizer, index, selection=FileSelection(
            selection.root, [rel for rel in selection.files if rel.as_posix() in train_paths], dict(selection.skipped)))
        result["index"] = {"build": build.as_dict(), "stats": index.stats().as_dict(),
                           "documents": sorted(Path(os.path.relpath(k, selection.root)).as_posix()
                                               for k in index.keys())}
        report(f"  index: {build.files} files, {build.tokens} tokens, {build.seconds:.1f} s")
    drafts = {"": base_draft.model}
    work = Path(tempfile.mkdtemp(prefix="specdec-repo-bench-"))
    try:
        if any(c.adapter for c in configs):
            config = train_config(ft_args)
            lora = adapter_folder(spec, ft_args, config, split, target.weight_hash, models["draft_hash"])
            result["adapter"] = trained_adapter(ft_args, target, split, lora, report)
            result["adapter"]["folder"] = str(lora)
            drafts["lora"] = load_draft(args.draft, target, args.dtype, args.draft_quant, adapter=str(lora),
                                        forward=getattr(args, "forward", "auto")).model
            if any(c.adapter == "online" for c in configs):
                base_drafter = make_drafter("draft", base_draft.model, max_draft=args.max_draft)
                job = replay_job(args, root, split.heldout, holes, completer, base_drafter, models["draft_hash"],
                                 ft_args.seed, report)
                result["replay"] = {"edited": [{"path": d["path"], "chars": len(d["text"])} for d in job.edited],
                                    "accepted": len(job.accepted)}
                online, outcome = online_adapter(job, root, lora, models["draft_hash"], args, work, report)
                result["online"] = {k: v for k, v in outcome.items() if k != "losses"}
                drafts["online"] = load_draft(args.draft, target, args.dtype, args.draft_quant,
                                              adapter=str(online), forward=getattr(args, "forward", "auto")).model
        markers = fim.markers(target.tokenizer, completer.template)
        drafters = {c.name: make_drafter(c.strategy, drafts[c.adapter], max_draft=args.max_draft,
                                         repo_index=index if c.index else None, prompt_markers=markers)
                    for c in configs}
        # per configuration, a session over the completer's target and its cache
        sessions = {c.name: completer.session.derive(drafter=drafters[c.name], strategy=c.strategy) for c in configs}
        generation = GenerationConfig(max_new_tokens=args.max_new_tokens, max_draft=args.max_draft)
        rows = []
        for hole in holes:
            prompt = completer.prompt(hole.prefix, hole.suffix).ids
            previous = completer.prompt(hole.prefix[:-1], hole.suffix).ids
            document = document_key(selection.root / hole.source.member)
            reference = None
            # as the server: never the document being completed (not indexed here)
            request = RequestContext(document)
            for c in configs:
                row = {"package": spec, "hole": hole.name, "file": hole.source.member, "language": hole.language,
                       "config": c.label, "prompt_tokens": len(prompt)}
                tokens = run_ours(sessions[c.name], prompt, previous, generation, args.cold, row, request)
                if c.name == "base":
                    reference = tokens
                row["tokens_per_second"] = row["new_tokens"] / row["seconds"] if row["seconds"] else 0.0
                row["equals_base"] = tokens == reference if reference is not None else None
                row["text"] = target.tokenizer.decode(tokens)
                row["peak_rss_mb"] = round(peak_rss_mb())
                rows.append(row)
                report(f"  {hole.name:28} {c.label:8} {row['new_tokens']:3d} tok {row['seconds']:6.2f}s "
                       f"{row['tokens_per_second']:6.2f} tok/s accept {row['accepted']}/{row['drafted']}")
        result["summary"] = summarize(rows, configs)
        result["rows"] = rows
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args) -> int:
    from specdec.engine.session import GenerationConfig, Session
    from specdec.models.loading import LoadedModel, load, load_draft
    from specdec.models.quantize import quantize_target
    from specdec.models.store import resolve
    from specdec.prompts.completion import Completer

    packages = parse_packages(args.repo)
    configs = parse_configs(args.repo_configs)
    if not packages:
        raise SpecdecError("--repo: name at least one package (name==version) or folder")
    if args.adapter:
        raise SpecdecError("--repo trains its own adapters: drop --adapter")
    if args.repo_steps < 1:
        raise SpecdecError("--repo-steps must be >= 1")
    target = load(args.target, args.dtype)
    quantize_target(target, args.target_quant, args.dtype, args.int4_kernel)
    draft = load_draft(args.draft, target, args.dtype, args.draft_quant, forward=getattr(args, "forward", "auto"))
    completer = Completer.for_session(Session(target.model, target.tokenizer),
                                      max_prefix_tokens=args.max_prefix_tokens,
                                      max_suffix_tokens=args.max_suffix_tokens)
    completer.session.generate(target.tokenizer.encode("def warm_up():\n    return"), GenerationConfig(4))
    completer.session.reset()
    models = {"target": target, "draft": draft, "completer": completer,
              "draft_hash": LoadedModel(args.draft, resolve(args.draft), None, None).weight_hash}
    print(f"{len(packages)} packages, configurations {', '.join(c.label for c in configs)}; target {args.target} "
          f"({str(target.model.dtype).removeprefix('torch.')}), draft {args.draft} ({args.draft_quant}), "
          f"max {args.max_new_tokens} new tokens", flush=True)
    results = [bench_package(spec, args, configs, models) for spec in packages]
    for result in results:
        print_table(result["package"], result)
    out = Path(args.output if args.output != "bench-results/bench.json" else REPO_OUTPUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "config": {k: v for k, v in vars(args).items() if k not in ("func", "bench_runners")},
        "target_dtype": str(target.model.dtype).removeprefix("torch."),
        "packages": results,
    }, indent=2, default=str))
    print(f"\nwrote {out}")
    return 0


def register(parser):
    """`specdec bench --repo PKG`'s own flags (--repo itself is the bench's: the editor replay reads it too); the
    runner answers None unless --repo was given without --editor."""
    parser.add_argument("--repo-configs", default=",".join(CONFIGS),
                        help="--repo: the configurations to run, comma-separated (base,lora,index,both,online)")
    parser.add_argument("--repo-steps", type=int, default=60,
                        help="--repo: LoRA training steps per package (--max-minutes also bounds it); adapters are "
                             "cached per package and settings")
    return lambda args: run(args) if args.repo and not getattr(args, "editor", False) else None
