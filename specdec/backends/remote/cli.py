"""`--engine KIND --engine-url URL` for `specdec serve`, `specdec complete` and `specdec bench`, and the
settings a remote backend reads when no server's Settings are at hand (`complete`, `bench`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from specdec.backends.remote import KINDS
from specdec.errors import SpecdecError

ENGINES = ("local", *KINDS)


@dataclass(frozen=True)
class EngineSettings:
    """The fields RemoteBackend reads, with the server's defaults (lsp_server/settings.py)."""

    engine: str
    engine_url: str
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
    if engine == "local":
        if url:
            raise SpecdecError("--engine-url needs --engine llama-server, vllm or sglang")
        return ""
    if not url:
        raise SpecdecError(f"--engine {engine} needs --engine-url (http://HOST:PORT of the engine)")
    if not re.match(r"^https?://[^/\s]+", url):
        raise SpecdecError(f"--engine-url must be http://HOST[:PORT][/PATH] or https://..., not {url!r}")
    return engine
