"""The server's `specdec` subcommands (`serve`, `stats`), registered through an entry point."""

from __future__ import annotations

import logging

from specdec.errors import SpecdecError


def cmd_serve(args) -> int:
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), filename=args.log_file,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":
        logging.getLogger("pygls").setLevel(logging.WARNING)  # it logs every message at INFO
    from lsp_server import transport
    from lsp_server.server import create_server

    server = create_server(settings=engine_settings(args))
    if args.tcp:  # our reader, not pygls' start_tcp/start_io: see lsp_server/transport.py
        host, _, port = args.tcp.rpartition(":")
        if not port.isdigit():
            raise SpecdecError(f"--tcp wants HOST:PORT or PORT, got {args.tcp!r}")
        return transport.serve_tcp(server, host or "127.0.0.1", int(port))
    return transport.serve_stdio(server)


def engine_settings(args):
    """The server's base settings from --engine/--engine-url and the --engine-*-seconds bounds (the editor's
    options still apply over them); None when none is given. A bad value is one line, before anything starts,
    naming the flags."""
    from specdec.backends.remote.cli import BOUND_FLAGS, engine_bounds

    bounds = engine_bounds(args)
    if args.engine is None and args.engine_url is None and not bounds:
        return None
    from lsp_server.settings import Settings, SettingsError, camel

    options = {key: value for key, value in (("engine", args.engine), ("engineUrl", args.engine_url)) if value}
    try:
        return Settings().update({**options, **bounds})
    except SettingsError as exc:
        message = str(exc).replace("engineUrl", "--engine-url")
        for key, flag in BOUND_FLAGS.items():
            message = message.replace(camel(key), flag)
        raise SpecdecError(message) from None


def cmd_stats(args) -> int:
    from lsp_server.stats_cli import run

    return run(args)


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the language server (stdio by default)")
    transport = p.add_mutually_exclusive_group()
    transport.add_argument("--stdio", action="store_true", help="LSP over stdio (the default; editors pass it)")
    transport.add_argument("--tcp", help="listen on HOST:PORT instead of stdio (host defaults to 127.0.0.1)")
    p.add_argument("--log-file", help="log here instead of stderr")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    from specdec.backends.remote.cli import add_engine_args

    add_engine_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("stats", help="acceptance and latency per language, from the server's metrics")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="FILE.png", help="chart of acceptance over time per language")
    p.set_defaults(func=cmd_stats)
