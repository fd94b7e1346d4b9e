"""`--engine KIND --engine-url URL` for `specdec serve`, `specdec complete` and `specdec bench`, and the
settings a remote backend reads when no server's Settings are at hand (`complete`, `bench`): their backend is
made by `specdec.backends.make_backend`, the server's too. The `--engine-*-seconds` flags are the time bounds
(http.Bounds), the server's `engine*Seconds` settings."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.backends.base import engine_problem, make_backend
from specdec.backends.remote import KINDS
from specdec.backends.remote.http import Bounds
from specdec.errors import SpecdecError

ENGINES = ("local", *KINDS)
BOUND_FLAGS = {f"engine_{name[:-2]}_seconds": flag for name, (_, flag, _, _) in Bounds.LIMITS.items()}


@dataclass(frozen=True)
class EngineSettings:
    """The fields RemoteBackend reads, with the server's defaults (lsp_server/settings.py); the URL is the one
    make_backend was given."""

    target: str = ""
    fim_family: str = ""
    fim_order: str = ""  # "": the family's own (fim.in_order)
    max_prefix_tokens: int = 1024
    max_suffix_tokens: int = 64
    max_snippet_tokens: int = 256
    adapters: bool = True
    engine_connect_seconds: float = Bounds.connect_s
    engine_first_byte_seconds: float = Bounds.first_byte_s
    engine_stall_seconds: float = Bounds.stall_s
    engine_total_seconds: float = Bounds.total_s


def add_engine_args(p) -> None:
    p.add_argument("--engine", choices=ENGINES, help="where completions are computed: local (this process, the "
                   "default) or a shared llama-server, vllm or sglang at --engine-url (docs/teams.md); its API key "
                   "comes from SPECDEC_ENGINE_API_KEY")
    p.add_argument("--engine-url", metavar="URL", help="the engine's base URL: http://HOST:PORT or https://...")
    helps = {"connect_s": "to connect to the engine", "first_byte_s": "for the engine's first byte of a reply "
             "(it evaluates the whole prompt first)", "stall_s": "between two pieces of a reply",
             "total_s": "for a whole completion"}
    for name, (_, flag, _, _) in Bounds.LIMITS.items():
        p.add_argument(flag, type=float, metavar="S",
                       help=f"seconds to wait at most {helps[name]} (default {getattr(Bounds, name):g})")


def engine_bounds(args) -> dict:
    """The --engine-*-seconds flags given, as EngineSettings' (and the server's snake_case settings') keys."""
    return {key: getattr(args, key) for key in BOUND_FLAGS if getattr(args, key, None) is not None}


def check_engine_args(args) -> str:
    """The remote engine asked for ("" for local), or a one-line error for a bad pair or bad bounds."""
    engine, url = getattr(args, "engine", None) or "local", (getattr(args, "engine_url", None) or "").strip()
    problem = engine_problem(engine, url, ("--engine", "--engine-url"))
    given = engine_bounds(args)
    if not problem and given:
        problem = (f"{BOUND_FLAGS[next(iter(given))]} needs --engine {', '.join(KINDS[:-1])} or {KINDS[-1]}"
                   if engine == "local" else Bounds.of(EngineSettings(**given)).problem(flags=True))
    if problem:
        raise SpecdecError(problem)
    return "" if engine == "local" else engine


def load_engine(kind: str, url: str, **settings):
    """The remote backend for `specdec complete` and `specdec bench`: made by make_backend and loaded with
    EngineSettings(**settings); a one-line SpecdecError when it cannot be (an engine that does not answer yet is
    the caller's to judge: `backend.health`)."""
    backend = make_backend(kind, url)
    backend.load(EngineSettings(**settings))
    if not backend.ready:
        raise SpecdecError(backend.error)
    return backend
