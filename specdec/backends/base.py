"""The one backend interface: a serialisable request and result, the `Backend` protocol, `make_backend`.

Torch-free: the server imports it before any model loads. A request carries everything a completion depends on
(text around the cursor, the file's path, other files' snippets, the generation settings), so it can cross a
process or a network as JSON; a result carries the text as generated (the server's stop and trim rules,
specdec.completion.syntax, apply to whatever a backend returns), why it stopped, the engine's counters as a dict and,
when the engine keeps one, its pass trace.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Protocol, runtime_checkable
from urllib.parse import urlsplit

from specdec.backends.remote import API_KEY_ENV, KINDS as REMOTE_KINDS
from specdec.errors import SpecdecError

StopPredicate = Callable[[str], "int | None"]  # text so far -> where to cut it, or None to go on
Report = Callable[[str, int], None]  # (message, percent): a load's progress


class _Unresolved:
    def __repr__(self) -> str:
        return "UNRESOLVED"


UNRESOLVED = _Unresolved()  # a request's draft adapter not yet looked up (LocalBackend.complete looks it up)

REMOTE = "specdec.backends.remote.backend:RemoteBackend"  # llama-server, vllm and sglang: one HTTP backend
KINDS = {"local": "specdec.backends.local:LocalBackend", **{kind: REMOTE for kind in REMOTE_KINDS}}


@dataclass
class CompletionRequest:
    """One fill-in-the-middle completion, as any backend takes it."""

    prefix: str
    suffix: str
    path: str = ""  # the file's path as the prompt names it ("" for none)
    context: str = ""  # snippets from other open files, already in the model family's format
    language: str = ""
    workspace: str = ""  # the workspace folder: which repository adapter the draft uses (local backend)
    document: str = ""  # the document's key in the repository index: not drafted from while it is completed
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_draft: int = 8
    trace: bool = False  # record the target's p and the draft's q of every drafted token in the pass trace
    # repository context for an engine that takes it apart from the prompt ([{filename, text}], best first: a remote
    # engine's input_extra or file-separated prompt); the local engine reads `context` and its index instead
    chunks: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CompletionRequest":
        """Refuses unknown keys and missing text in one line, rather than completing something else."""
        if not isinstance(data, dict):
            raise SpecdecError(f"a completion request is a JSON object, not {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecdecError(f"unknown completion request keys {unknown}; known: {', '.join(sorted(known))}")
        missing = [key for key in ("prefix", "suffix") if not isinstance(data.get(key), str)]
        if missing:
            raise SpecdecError(f"a completion request needs {' and '.join(missing)} as text")
        chunks = data.get("chunks", [])
        if not isinstance(chunks, list) or not all(
                isinstance(c, dict) and isinstance(c.get("filename"), str) and isinstance(c.get("text"), str)
                for c in chunks):
            raise SpecdecError('a completion request\'s chunks are a list of {"filename": TEXT, "text": TEXT}')
        return cls(**data)


@dataclass
class CompletionResult:
    """What a backend returns: the text as generated (not yet trimmed by the server), and how it went."""

    text: str
    stop_reason: str  # "eos" | "max_tokens" | "stop" | "cancelled" | "error" (a remote engine that failed)
    stats: dict = field(default_factory=dict)  # the engine's GenerationStats.as_dict(), or a remote engine's
    tokens: list[int] = field(default_factory=list)  # the generated token ids (online adaptation learns from them)
    trace: object = None  # the engine's per-pass trace (engine/trace.py), a remote engine's counts, or None

    def to_dict(self) -> dict:
        trace = self.trace
        if trace is not None and hasattr(trace, "as_dict"):  # the engine's Trace (engine/trace.py)
            trace = trace.as_dict()
        return {"text": self.text, "stop_reason": self.stop_reason, "stats": dict(self.stats),
                "tokens": [int(t) for t in self.tokens], "trace": trace}

    @classmethod
    def from_dict(cls, data: dict) -> "CompletionResult":
        return cls(data["text"], data["stop_reason"], dict(data.get("stats") or {}), list(data.get("tokens") or []),
                   data.get("trace"))

    @classmethod
    def from_generation(cls, generation) -> "CompletionResult":
        """The engine's Generation (specdec.engine.session) as a result."""
        stats = generation.stats
        return cls(generation.text, generation.stop_reason, stats.as_dict() if hasattr(stats, "as_dict") else {},
                   [int(t) for t in generation.tokens], getattr(generation, "trace", None))


class Reconfigurable:
    """`apply`, for a backend whose `reconfigure(settings)` returns a commit, or None where the models must be
    reloaded (a caller that may still refuse the change calls reconfigure and commits later itself)."""

    def apply(self, settings) -> bool:
        """Apply settings that need no reload; False if the models must be reloaded."""
        commit = self.reconfigure(settings)
        if commit is None:
            return False
        commit()
        return True


@runtime_checkable
class Backend(Protocol):
    """Where completions are computed. `load` blocks (call it from a thread) and never raises: it ends in state
    'ready' or 'failed' with `error` set; `progress` is the latest loading step. `complete` runs one request
    (on whatever thread the caller picks: the local backend's `executor` serialises with its swaps)."""

    kind: str
    state: str  # idle | loading | ready | failed
    error: str
    progress: str

    @property
    def ready(self) -> bool: ...

    def load(self, settings, report: Report = ...) -> None: ...

    def complete(self, request: CompletionRequest, stop: StopPredicate | None = None,
                 cancel=None) -> CompletionResult: ...

    def stats(self) -> dict: ...

    def tokenizer(self):
        """The target's tokenizer (the repository index holds its ids), or None: not loaded, or none built."""

    def template(self):
        """The target's prompt format (specdec.prompts.fim.FimTemplate), or None before a load."""

    def index_for(self, settings):
        """The repository index this backend reads under these settings (made on first ask), or None."""

    def repository_context(self, request: CompletionRequest) -> CompletionRequest:
        """The request with the repository context this backend reads (a remote engine's chunks from the index);
        as it is where the engine reads the index itself (the local drafters)."""


def backend_class(kind: str):
    """The class registered for `kind` (imported on first use: a remote backend needs no torch)."""
    if kind not in KINDS:
        raise SpecdecError(f"unknown engine {kind!r}; known: {', '.join(KINDS)}")
    module, name = KINDS[kind].split(":")
    return getattr(importlib.import_module(module), name)


def engine_problem(kind: str, url: str, names: tuple[str, str] = ("engine", "engine URL")) -> str:
    """What is wrong with an engine kind and URL together, in one line ("" when nothing is): the one rule behind
    make_backend, the --engine/--engine-url flags and the server's engine/engineUrl settings, each naming the two
    as its user writes them (`names`)."""
    engine, address = names
    url = (url or "").strip()
    if kind not in KINDS:
        return f"unknown {engine} {kind!r}; known: {', '.join(KINDS)}"
    if kind == "local":
        return f"{address} needs {engine} {', '.join(REMOTE_KINDS[:-1])} or {REMOTE_KINDS[-1]}" if url else ""
    if not url:
        return f"{engine} {kind} needs {address} (http://HOST:PORT of the engine)"
    return url_problem(url, address)


MAX_URL_CHARS = 2048  # an engine's base URL at most
SHOWN_URL_CHARS = 80  # of a refused URL, in its message


def url_problem(url: str, name: str = "engine URL") -> str:
    """What is wrong with an engine's base URL, in one line ("" when nothing is): not http(s), a port that is none,
    a user:password (never sent, so refused rather than dropped), a host no resolver takes, control characters,
    over MAX_URL_CHARS. The message never shows a user:password, nor more than SHOWN_URL_CHARS of the URL."""
    url = url.strip()
    shown = re.sub(r"//[^/@]*@", "//", url)
    shown = shown[:SHOWN_URL_CHARS] + ("..." if len(shown) > SHOWN_URL_CHARS else "")
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not any(c.isspace() for c in url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        ok = False
    if not ok:
        return f"{name} must be http://HOST[:PORT][/PATH] or https://..., not {shown!r}"
    if parts.username is not None or parts.password is not None:
        return (f"{name} must not hold a user or password (they would not be sent): the engine's key goes in "
                f"{API_KEY_ENV}; not {shown!r}")
    if len(url) > MAX_URL_CHARS:
        return f"{name} must be at most {MAX_URL_CHARS} characters, not {len(url)}: {shown!r}"
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return f"{name} must not hold control characters: {shown!r}"
    host = parts.hostname
    try:
        ipaddress.ip_address(host.split("%")[0]) if ":" in host else host.encode("idna")
    except (UnicodeError, ValueError):
        return f"{name}'s host is not a host name (an empty label, or one over 63 characters): {shown!r}"
    return ""


def make_backend(kind: str = "local", url: str = "", cls=None, **options) -> Backend:
    """The backend for an engine kind, unloaded: `local` (specdec's engine in this process) or a shared
    `llama-server`, `vllm` or `sglang` at `url` (specdec.backends.remote), as vLLM's `EngineCoreClient.make_client`
    picks a client. The one place a backend is made: the server, `specdec complete` and `specdec bench` call it.

    url: the remote engine's base URL; "" lets `load(settings)` take `settings.engine_url` (the server's case, whose
    URL is a setting). cls: a subclass of the kind's class to make instead (the server's adds its adapter
    registry lookup). options: a remote backend's keywords (`on_status`). A bad kind or URL is a SpecdecError of
    one line."""
    kind = (kind or "local").strip()
    problem = engine_problem(kind, url) if (url or "").strip() or kind not in KINDS else ""
    if problem:
        raise SpecdecError(problem)
    base = backend_class(kind)
    if cls is not None and not issubclass(cls, base):
        raise SpecdecError(f"{cls.__name__} is not a {kind} backend")
    if kind == "local":
        if options:
            raise SpecdecError(f"the local backend takes no {', '.join(sorted(options))}")
        return (cls or base)()
    return (cls or base)(kind, url=(url or "").strip(), **options)
