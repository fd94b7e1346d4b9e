"""`--engine KIND --engine-url URL` for `specdec serve`, `specdec complete` and `specdec bench`, and the
settings a remote backend reads when no server's Settings are at hand (`complete`, `bench`): their backend is
made by `specdec.backends.make_backend`, the server's too."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.backends.base import engine_problem, make_backend
from specdec.backends.remote import KINDS
from specdec.errors import SpecdecError

ENGINES = ("local", *KINDS)


@dataclass(frozen=True)
class EngineSettings:
    """The fields RemoteBackend reads, with the server's defaults (lsp_server/settings.py); the URL is the one
    make_backend was given."""

    target: str = ""
    fim_family: str = ""
    max_prefix_tokens: int = 1024
    max_suffix_tokens: int = 64
    max_snippet_tokens: int = 256
    adapters: bool = True


def add_engine_args(p) -> None:
    p.add_argument("--engine", choices=ENGINES, help="where completions are computed: local (this process, the "
                   "default) or a shared llama-server, vllm or sglang at --engine-url (docs/teams.md); its API key "
                   "comes from SPECDEC_ENGINE_API_KEY")
    p.add_argument("--engine-url", metavar="URL", help="the engine's base URL: http://HOST:PORT or https://...")


def check_engine_args(args) -> str:
    """The remote engine asked for ("" for local), or a one-line error for a bad pair."""
    engine, url = getattr(args, "engine", None) or "local", (getattr(args, "engine_url", None) or "").strip()
    problem = engine_problem(engine, url, ("--engine", "--engine-url"))
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
