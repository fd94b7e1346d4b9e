"""The server's host for a remote engine (`engine` llama-server, vllm or sglang): what ModelHost is for the
local engine, with the same face to the scheduler (service.py) and the server.

Completions run on a small pool (the engine batches requests; a slow one must not hold the next), each
streamed by specdec.backends.remote with the server's stop predicate after every piece and the same
syntax.finalize as a local generation. The repository index is the backend's (RemoteBackend.index_for), in the
target's tokens (its tokenizer built locally from `target`, specdec/backends/remote/tokens.py): its best chunks for
the cursor are the engine's repository context (RemoteBackend.repository_context), the heads of other open files
where it has none (off, still building, or no tokenizer could be built). The engine's health (health.py) reaches the
editor as one `window/showMessage` per outage and as `engine` in `specdec/stats`, which the VS Code status bar shows.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable

from specdec.backends import make_backend
from specdec.backends.base import Reconfigurable
from specdec.completion import syntax
from specdec.errors import SpecdecError


class RemoteHost(Reconfigurable):
    remote = True

    def __init__(self, kind: str):
        self.kind = kind
        self.on_status: Callable[[str, str], None] = lambda state, message: None  # set by the server
        # the one builder of backends; the URL is the settings' engineUrl, read at load
        self.backend = make_backend(kind, on_status=lambda state, message: self.on_status(state, message))
        self.backend.repo_key_of = repo_key_of
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="specdec-engine")
        self.adapter = ""
        self.adapter_error = ""
        self.target_quant = ""
        self.switchable = None  # online adaptation trains a local draft: not with a remote engine
        self.draft_hash = ""
        self.on_warning: Callable[[str], None] = lambda message: None
        self.idle = threading.Event()
        self.idle.set()  # the engine computes: the indexer never waits for a remote completion

    # the state the server and the editor read
    @property
    def state(self) -> str:
        return self.backend.state

    @state.setter
    def state(self, value: str) -> None:
        self.backend.state = value

    @property
    def error(self) -> str:
        return self.backend.error

    @property
    def progress(self) -> str:
        return self.backend.progress

    @property
    def ready(self) -> bool:
        return self.backend.ready

    def load(self, settings, report=lambda message, percent: None) -> None:
        self.backend.load(settings, report)
        if self.backend.ready:
            report(f"building {settings.target}'s tokenizer", 80)
            self.backend.token_counter()  # here, on the loading thread: the indexer and the budgets need it

    def tokenizer(self):
        return self.backend.tokenizer()

    def template(self):
        return self.backend.template()

    @property
    def repo_index(self):
        return self.backend.repo_index

    @repo_index.setter
    def repo_index(self, index) -> None:
        self.backend.repo_index = index

    def index_for(self, settings):
        return self.backend.index_for(settings)

    def reconfigure(self, settings):
        """Every setting but the engine's own applies at the next request (the backend reads them then)."""
        if self.backend.settings is None or settings.models_differ(self.backend.settings):
            return None
        return lambda: setattr(self.backend, "settings", settings)

    def adapter_for(self, workspace: str):
        return None  # the served adapter is chosen per request by the backend (RemoteBackend.adapter_for)

    def cost_curve(self):
        return None

    def stats(self) -> dict:
        return self.backend.stats()

    def generate(self, request, ctx: syntax.CursorContext, settings, cancel, progress=None):
        """Pool thread: one completion, stopped and trimmed by the same syntax rules as a local one; progress as
        ModelHost.generate's (the text streamed so far)."""
        if not settings.multiline:
            ctx = replace(ctx, multiline=False)
        from lsp_server.hosts import backend_request

        asked = self.backend.repository_context(backend_request(request, settings))
        result = self.backend.complete(asked, syntax.reporting(syntax.stop_predicate(ctx), progress), cancel)
        self.adapter = result.stats.get("adapter", "")
        return syntax.finalize(ctx, result.text, result.stop_reason), result

    def prefill(self, request, settings, cancel, closed=None) -> bool:
        """Nothing ahead: the engine keeps its own prompt cache and prefills when asked (ServerHost.prefill)."""
        return False

    def next_edit(self, text: str, line: int, path: str, history=(), cancel=None, max_new_tokens: int = 0):
        """Next edits run on the local engine only (their prompt and the window-copy drafter are ours)."""
        raise SpecdecError(f"next edits need the local engine (engine is {self.kind})")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def repo_key_of(workspace: str) -> str:
    """The adapter registry's key of the workspace's repository (what `specdec finetune` registered it under)."""
    from pathlib import Path

    from specdec_adapters.registry import repo_identity

    return repo_identity(Path(workspace))[0]

