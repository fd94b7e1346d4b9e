"""`specdec` console script: one entry point, one subcommand per job, each registered by its own wing.

The core registers `models` (the models wing's) and `complete` and `next-edit` (this package's: a cursor in a file
through a backend and the completion policy, on top of every wing); packages that build on specdec (the server,
fine-tuning, adapters, the benchmarks) add theirs through the `specdec.commands` entry points. Heavy imports
(torch, transformers) happen inside the subcommands that need them, so `specdec --help` and the
LSP server's `initialize` stay fast.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

from specdec.cli import complete, next_edit
from specdec.errors import SpecdecError
from specdec.models import commands as models

PLUGIN_GROUP = "specdec.commands"  # entry points: fn(subparsers) adding subcommands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for register in (models.register, complete.register, next_edit.register):
        register(sub)
    for plugin in entry_points(group=PLUGIN_GROUP):  # serve, stats, finetune, adapters, bench
        plugin.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
