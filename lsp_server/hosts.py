"""The server's host: where its completions are computed, chosen by the `engine` setting (`new_host`).

`ModelHost` is the in-process backend (specdec/backends/local.py: the models and their single worker) as the server
runs it: adapters from the registry per workspace, the settings' errors, and the completion policy's syntax rules
(specdec/completion/syntax.py) that stop and trim whatever the backend returns. `RemoteHost` (lsp_server/remote_host.py)
is the same face for a remote engine. The scheduler (service.py) and the handlers see only that face.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Protocol

from lsprotocol import types

from lsp_server.settings import Settings, SettingsError
from specdec import backends
from specdec.backends.local import LocalBackend
from specdec.completion import syntax
from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from lsp_server.service import EditorRequest

log = logging.getLogger("specdec.server")


class ServerHost(Protocol):
    """The one face of the server's host, whichever backend computes (ModelHost: the local engine; RemoteHost: a
    shared one): what the scheduler (service.py), the handlers (api/) and the server's state modules read. A member
    a backend cannot serve answers as it says (a remote engine prefills nothing ahead; next edits are refused in
    one line), so nobody asks which host it is."""

    kind: str  # local | llama-server | vllm | sglang
    remote: bool
    state: str  # idle | loading | ready | failed
    error: str
    progress: str
    adapter: str  # the draft adapter in use (name@version), for stats
    adapter_error: str
    target_quant: str
    executor: ThreadPoolExecutor  # where generate, prefill and next_edit run
    idle: threading.Event  # set while no completion runs: background indexing waits for it
    switchable: object  # the draft's per-request adapters (online adaptation), or None
    draft_hash: str
    repo_index: object
    on_warning: Callable[[str], None]

    @property
    def ready(self) -> bool: ...

    def load(self, settings: Settings, report=...) -> None: ...

    def reconfigure(self, settings: Settings) -> Callable[[], None] | None: ...

    def apply(self, settings: Settings) -> bool: ...

    def adapter_for(self, workspace: str): ...

    def tokenizer(self): ...

    def template(self): ...

    def index_for(self, settings: Settings): ...

    def cost_curve(self) -> dict | None: ...

    def stats(self) -> dict: ...

    def generate(self, request: EditorRequest, ctx: syntax.CursorContext, settings: Settings, cancel,
                 progress: Callable[[str], None] | None = None): ...

    def prefill(self, request: EditorRequest, settings: Settings, cancel, closed=None) -> bool: ...

    def next_edit(self, text: str, line: int, path: str, history=(), cancel=None, max_new_tokens: int = 0): ...


def new_host(engine: str, show: Callable[[types.MessageType, str], None]):
    """ModelHost for the local engine, RemoteHost for llama-server, vllm or sglang (lsp_server/remote_host.py).
    show(kind, message): how its warnings and the engine's health reach the editor."""
    if engine == "local":
        host = backends.make_backend("local", cls=ModelHost)  # the one builder of backends (specdec.backends)
    else:
        from lsp_server.remote_host import RemoteHost

        host = RemoteHost(engine)  # one message per outage and one when it ends (remote/health.py)
        host.on_status = lambda state, message: show(
            types.MessageType.Info if state == "ok" else types.MessageType.Warning, message)
    host.on_warning = lambda message: show(types.MessageType.Warning, message)  # once per adapter
    return host


class ModelHost(LocalBackend):
    """The in-process backend as the server runs it: adapters from the registry per workspace, the server's
    settings errors, and the syntax rules around each generation."""

    remote = False

    def __init__(self):
        super().__init__()
        self._warned: set[str] = set()  # broken registry entries already said (_warn_once)
        self._warned_lock = threading.Lock()
        self._adapter_lookup: dict[str, tuple[float, object]] = {}  # workspace -> (registry mtime, meta)

    def _published(self) -> None:
        self._adapter_lookup = {}

    def reconfigure(self, settings: Settings) -> Callable[[], None] | None:
        """LocalBackend.reconfigure; SettingsError when the loaded models cannot serve these settings."""
        try:
            return super().reconfigure(settings)
        except SpecdecError as exc:
            raise SettingsError(f"{exc} (with the loaded models)") from None

    def adapter_for(self, workspace: str):
        """The newest registered adapter of the workspace's repository made for this draft, or None."""
        if self.switchable is None or not workspace:
            return None
        from specdec_adapters.registry import Registry, repo_identity

        try:
            registry = Registry()
            stamp = registry.root.stat().st_mtime_ns + sum(p.stat().st_mtime_ns for p in registry.root.iterdir())
            cached = self._adapter_lookup.get(workspace)
            if cached and cached[0] == stamp:
                meta = cached[1]
                return None if meta is not None and (meta.name, self.draft_hash) in self.broken_adapters else meta
            meta = registry.latest(repo_identity(Path(workspace))[0])
            problems = registry.problems
        except (SpecdecError, OSError, ValueError) as exc:  # an unreadable registry: the base draft, said once
            meta, stamp = None, None
            problems = [f"the adapter registry is unreadable ({str(exc).splitlines()[0] if str(exc) else exc!r})"]
        for problem in problems:  # a broken entry is skipped: the repository's other versions, else the base draft
            self._warn_once(problem, f"{problem}; skipped: completions use the repository's other adapter "
                                     f"versions, or the base draft")
        if meta is not None and meta.base_draft_hash != self.draft_hash:
            log.warning("adapter %s was made for another base draft; not using it", meta.name)
            meta = None
        if stamp is not None:
            self._adapter_lookup[workspace] = (stamp, meta)
        return None if meta is not None and (meta.name, self.draft_hash) in self.broken_adapters else meta

    def _warn_once(self, key: str, message: str) -> None:
        """Log and show a broken adapter's message the first time only (adapter_for runs for every request,
        on the event loop and on the worker)."""
        with self._warned_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        self.adapter_error = key
        log.warning("%s", message)
        self.on_warning(message)

    def adapter_file(self, meta):
        from specdec_adapters.registry import Registry

        return Registry().path(meta)

    def generate(self, request: EditorRequest, ctx: syntax.CursorContext, settings: Settings, cancel,
                 progress: Callable[[str], None] | None = None):
        """Worker thread: one completion, stopped and trimmed by the syntax rules. Returns (text, CompletionResult).
        progress(text): told each text the stop rules let go on (the scheduler's early answer)."""
        if not settings.multiline:
            ctx = replace(ctx, multiline=False)  # the setting caps every completion at the cursor's line
        asked = self.repository_context(backend_request(request, settings))
        # the adapter the scheduler resolved for the request (and attributed it to), not looked up again
        result = self.complete(asked, syntax.reporting(syntax.stop_predicate(ctx), progress), cancel,
                               request.resolved_adapter)
        return syntax.finalize(ctx, result.text, result.stop_reason), result

    def prefill(self, request: EditorRequest, settings: Settings, cancel, closed=None) -> bool:
        """Worker thread: the request's prompt into the KV caches before it is generated (LocalBackend.prefill)."""
        asked = self.repository_context(backend_request(request, settings))
        return super().prefill(asked, cancel, request.resolved_adapter, closed)


def backend_request(request: EditorRequest, settings: Settings) -> backends.CompletionRequest:
    """An editor's completion under the server's settings (the one rule of which settings a request carries)."""
    return replace(request.completion, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                   top_k=0, top_p=settings.top_p, seed=None, max_draft=settings.max_draft)
