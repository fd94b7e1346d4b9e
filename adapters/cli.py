"""`specdec adapters list|show|remove|export|import`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from specdec_adapters.registry import Registry


def _split(name: str) -> tuple[str, str | None]:
    key, _, version = name.partition("@")
    return key, version or None


def cmd_adapters(args) -> int:
    registry = Registry()
    if args.adapters_cmd == "list":
        metas = registry.list()
        if args.json:
            print(json.dumps([asdict(m) for m in metas], indent=2))
        elif not metas:
            print("no adapters; train one with `specdec finetune REPO`")
        for m in metas if not args.json else []:
            gain = m.metrics_after.get("total", {}).get("acceptance_rate", 0) - \
                m.metrics_before.get("total", {}).get("acceptance_rate", 0)
            print(f"{m.name:40} {m.base_draft:28} acceptance {gain:+.3f}  {m.repo_root}")
        for problem in registry.problems:  # broken entries, skipped: said, not fatal
            print(f"specdec: skipped {problem}", file=sys.stderr)
    elif args.adapters_cmd == "show":
        print(json.dumps(asdict(registry.get(*_split(args.name))), indent=2))
    elif args.adapters_cmd == "remove":
        for name in registry.remove(*_split(args.name)):
            print(f"removed {name}")
    elif args.adapters_cmd == "export":
        key, version = _split(args.name)
        print(registry.export(key, version, Path(args.file)))
    elif args.adapters_cmd == "import":
        base_hash = None
        if args.draft:
            from specdec.models.loading import LoadedModel
            from specdec.models.store import resolve

            base_hash = LoadedModel(args.draft, resolve(args.draft), None, None).weight_hash
        print(f"imported {registry.import_archive(Path(args.file), base_hash).name}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("adapters", help="the registry of per-repository draft adapters")
    asub = p.add_subparsers(dest="adapters_cmd", required=True)
    lst = asub.add_parser("list")
    lst.add_argument("--json", action="store_true")
    asub.add_parser("show").add_argument("name", help="KEY or KEY@VERSION")
    asub.add_parser("remove").add_argument("name", help="KEY (all versions) or KEY@VERSION")
    exp = asub.add_parser(
        "export", help="write an adapter as a .tar.gz (to share, or to hand to a shared engine)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write the adapter (PEFT files: adapter_config.json, adapter_model.safetensors, meta.json) as a "
                    ".tar.gz.",
        epilog="Handing it to a shared engine (docs/teams.md): unpack it on the engine's machine and serve it under "
               "the repository's key\n(`specdec adapters list` shows it; characters other than letters, digits, "
               "'.', '_' and '-' become '-'),\nthe name specdec asks the engine for when it completes that "
               "repository:\n"
               "  vLLM:         vllm serve BASE --enable-lora --lora-modules KEY=/path/to/KEY-vN\n"
               "  SGLang:       python -m sglang.launch_server --model-path BASE --enable-lora "
               "--lora-paths KEY=/path/to/KEY-vN\n"
               "  llama-server: convert it with llama.cpp's convert_lora_to_gguf.py --base BASE_DIR to KEY.gguf,\n"
               "                then llama-server -m BASE.gguf --lora KEY.gguf --lora-init-without-apply\n"
               "The adapter is LoRA for the base it was trained on (meta.json: base_draft); the engine must "
               "serve that base.")
    exp.add_argument("name", help="KEY or KEY@VERSION (default: latest)")
    exp.add_argument("file", help="archive to write (.tar.gz)")
    imp = asub.add_parser("import")
    imp.add_argument("file")
    imp.add_argument("--draft", help="refuse the archive unless it was made for this base draft")
    p.set_defaults(func=cmd_adapters)
