"""The pygls language server: LSP 3.18 inline completion (and plain completion) over specdec.

torch and transformers are imported only when the models load, in the background after
`initialized`, so `initialize` answers at once. Until the models are ready, completion
requests answer empty immediately.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from lsp_server import syntax
from lsp_server.documents import ChunkedText, DocumentWorkspace, summary, text_of
from lsp_server.metrics import MetricsStore
from lsp_server.service import CompletionRequest, CompletionService, ModelHost
from lsp_server.settings import Settings, SettingsError

log = logging.getLogger("specdec.server")
ACCEPT_COMMAND = "specdec.accept"
FINETUNE_COMMAND = "specdec.finetune"
STATS_REQUEST = "specdec/stats"
TRACE_REQUEST = "specdec/trace"  # {"uri": ..., "limit": N}: the pass traces of the document's last N completions
BINARY_SNIFF = 8192
PREFIX_WINDOW = 256_000  # characters before the cursor a request carries: far more than any prompt budget uses,
SUFFIX_WINDOW = 64_000  # and a 10 MB document costs a slice, not a copy the size of the file per keystroke


def uri_path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def window(source: str | ChunkedText, offset: int) -> tuple[str, str]:
    """Prefix and suffix around the cursor, bounded: a huge document is completed from the text near it
    (from a document's ChunkedText, that text is all this reads).

    The prefix window starts at a line break on a fixed grid of the document, so its start
    (and the prompt's, and the KV cache built on it) does not move while the user types.
    """
    start = 0
    if offset > PREFIX_WINDOW:
        grid = (offset - PREFIX_WINDOW) // 4096 * 4096 + 4096
        newline = source.find("\n", grid, offset)
        start = newline + 1 if newline >= 0 else offset - PREFIX_WINDOW
    return source[start:offset], source[offset : offset + SUFFIX_WINDOW]


def inline_item(position: types.Position, suggestion) -> types.InlineCompletionItem:
    """The suggestion inserted at the cursor (it already holds any line break it needs: syntax.finalize)."""
    return types.InlineCompletionItem(
        insert_text=suggestion.text, range=types.Range(position, position),
        command=types.Command(title="specdec: suggestion accepted", command=ACCEPT_COMMAND, arguments=[suggestion.id]))


class SpecdecServer(LanguageServer):
    def __init__(self, metrics: MetricsStore | None = None):
        super().__init__("specdec", "0.1.0", max_workers=4)
        self.settings = Settings()
        self.metrics = metrics or MetricsStore()
        self.host = self._new_host("local")
        self.service = CompletionService(self.host, self.metrics, self.settings)
        self.service.on_accept = self._index_accepted
        self.indexer = None  # specdec.repository.indexer.WorkspaceIndexer while the repository index is on
        self.metrics.index_stats = lambda: self.indexer.stats() if self.indexer is not None else None  # Prometheus
        self.workspace_roots: list[str] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._load_generation = 0
        self._loading_settings: Settings | None = None  # what the load in flight was started with
        self.last_finetune: dict = {}

    def _new_host(self, engine: str):
        """ModelHost for the local engine, RemoteHost for llama-server, vllm or sglang (lsp_server/remote_host.py)."""
        def show(kind, message: str) -> None:
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.window_show_message,
                                               types.ShowMessageParams(kind, f"specdec: {message}"))

        if engine == "local":
            host = ModelHost()
        else:
            from lsp_server.remote_host import RemoteHost

            host = RemoteHost(engine)  # one message per outage and one when it ends (remote/health.py)
            host.on_status = lambda state, message: show(
                types.MessageType.Info if state == "ok" else types.MessageType.Warning, message)
        host.on_warning = lambda message: show(types.MessageType.Warning, message)  # once per adapter
        return host

    def _use_engine(self, engine: str) -> None:
        """Swap the host when the engine setting changed; the old one's models or pool are let go."""
        if getattr(self.host, "kind", "local") == engine:
            return
        old, self.host = self.host, self._new_host(engine)
        self.service.host = self.service.online.host = self.host
        if hasattr(old, "close"):
            old.close()
        self.sync_index()  # a remote engine drafts for itself: the local repository index stops

    # -- settings and model loading -------------------------------------------------
    def apply_settings(self, options) -> None:
        """Validate, prepare every step that can fail, then commit: all or nothing, the old settings stay on refusal."""
        old = self.settings
        try:
            new = old.update(options)
            loading = self._loading_settings
            deferred = self.host.state == "loading" and loading is not None and not new.models_differ(loading)
            commit, reload = None, False
            if not deferred and self.host.state in ("ready", "failed", "loading"):
                # the same models are on their way when deferred: the rest is applied in _finish_load
                commit = None if new.models_differ(old) else self.host.reconfigure(new)
                reload = commit is None
            self._start_prometheus(new)  # the last step that can fail: nothing is applied before it
        except SettingsError as exc:
            self.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"specdec: {exc}"))
            log.error("settings rejected: %s", exc)
            return
        self.settings = new
        self.service.settings = new
        if commit is not None:
            commit()
        elif reload:
            self.start_loading()
        self.sync_index()

    # -- the repository index -----------------------------------------------------------------------------
    def sync_index(self) -> None:
        """Start, resize or stop the background indexer as the settings say: on while a strategy reads it."""
        index = self.host.index_for(self.settings)
        if index is None:
            if self.indexer is not None:  # its thread empties the index as it ends; a later start makes a new one
                self.indexer.stop(timeout=0, clear=True)
                self.indexer, self.host.repo_index = None, None
            return
        if self.indexer is not None and self.indexer.index is not index:  # another engine's host: its own index
            self.indexer.stop(timeout=0, clear=True)
            self.indexer = None
        if self.indexer is None:
            from specdec.repository.indexer import WorkspaceIndexer

            self.indexer = WorkspaceIndexer(index, idle=self.host.idle)
            for root in self.workspace_roots:
                self.indexer.open_root(root)
            if self.host.ready:
                self.indexer.set_tokenizer(self.host.completer.session.tokenizer)
        if self.settings.repo_index_max_tokens != index.max_tokens:
            self.indexer.set_max_tokens(self.settings.repo_index_max_tokens)

    def _index_accepted(self, suggestion) -> None:
        if self.indexer is not None:
            self.indexer.accepted(suggestion.context, suggestion.text, suggestion.document or None)

    def index_document(self, uri: str, closed: bool = False) -> None:
        """didChange/didSave: the buffer is re-indexed (debounced, in the background); didClose: the disk's text."""
        if self.indexer is None or urlparse(uri).scheme not in ("file", ""):
            return
        if closed:
            self.indexer.revert(uri_path(uri))
            return
        document = self.workspace.text_documents.get(uri) or self.workspace.text_documents.get(unquote(uri))
        if document is not None:  # a snapshot: made into one string by the indexer's thread, once it is due
            self.indexer.update(uri_path(uri), text_of(document))

    def _start_prometheus(self, new: Settings) -> None:
        """Start the endpoint a new prometheusPort asks for; SettingsError if it cannot be started."""
        port = new.prometheus_port
        if not port or port == self.settings.prometheus_port:
            return
        if self.metrics._prometheus is not None:
            log.warning("prometheusPort %d takes effect when the server restarts (the endpoint keeps its port)", port)
            return
        try:
            self.metrics.serve_prometheus(port)
        except Exception as exc:  # OSError (in use), OverflowError, a missing prometheus_client, ...
            raise SettingsError(f"prometheusPort {port}: the endpoint did not start: {exc}") from None

    def start_loading(self) -> None:
        self._load_generation += 1
        generation = self._load_generation
        token = f"specdec-load-{generation}"
        settings = self.settings
        caps = self.client_capabilities.window
        progress = bool(caps and caps.work_done_progress)

        def send(fn, *args):
            if self.loop is not None:
                self.loop.call_soon_threadsafe(fn, *args)

        def report(message: str, percent: int) -> None:
            if progress:
                send(self.work_done_progress.report, token,
                     types.WorkDoneProgressReport(message=message, percentage=percent))

        def run() -> None:
            self.host.load(settings, report)
            send(self._finish_load, generation, token, settings, progress)

        self._use_engine(settings.engine)
        self.host.state = "loading"
        self._loading_settings = settings
        if progress:
            self.work_done_progress.create(token)
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(
                title="specdec", message=f"loading {settings.target}", percentage=0, cancellable=False))
        threading.Thread(target=run, name="specdec-load", daemon=True).start()

    def _finish_load(self, generation: int, token: str, settings: Settings, progress: bool) -> None:
        """On the event loop: end the load's progress; apply settings that arrived while it was loading."""
        current = generation == self._load_generation
        message = ("superseded by newer settings" if not current else
                   "models ready" if self.host.ready else f"model load failed: {self.host.error}")
        if progress:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
        if not current:
            return
        log.info(message)
        self._loading_settings = None
        if self.host.ready and self.indexer is not None and self.host.completer is not None:  # waited for the tokenizer
            self.indexer.set_tokenizer(self.host.completer.session.tokenizer)
        if not self.host.ready:
            self.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"specdec: {message}"))
            return
        try:
            if self.settings != settings and not self.host.apply(self.settings):
                self.start_loading()
        except SettingsError as exc:  # the new models cannot serve a setting accepted meanwhile: reload says why
            log.error("settings not applicable to the loaded models: %s", exc)
            self.start_loading()

    async def run_finetune(self, folder: str, options: dict) -> dict:
        """`specdec finetune FOLDER --progress-json` as a child process, reported as work-done progress."""
        import json
        import sys

        token = f"specdec-finetune-{uuid.uuid4().hex[:8]}"
        caps = self.client_capabilities.window
        progress = bool(caps and caps.work_done_progress)
        if progress:
            await self.work_done_progress.create_async(token)
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(
                title="specdec: fine-tuning the draft", message=folder, percentage=0, cancellable=False))
        cmd = [sys.executable, "-m", "specdec.cli", "finetune", folder, "--progress-json", "--target",
               self.settings.target, "--draft", self.settings.draft, "--dtype", self.settings.dtype,
               "--draft-quant", self.settings.draft_quant]  # the adapter is fitted over the draft this server runs
        for key in ("max_steps", "max_minutes", "objective", "rank", "lr"):
            if key in options:
                cmd += [f"--{key.replace('_', '-')}", str(options[key])]
        if options.get("force"):
            cmd.append("--force")
        process = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.DEVNULL)
        outcome: dict = {}
        async for raw in process.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if event.get("event") == "step" and progress:
                self.work_done_progress.report(token, types.WorkDoneProgressReport(
                    message=f"step {event['step']}/{event['max']} loss {event['loss']:.3f}",
                    percentage=int(100 * event["step"] / max(1, event["max"]))))
            elif event.get("event") == "done":
                outcome = event
        await process.wait()
        if outcome.get("registered"):
            message = f"adapter {outcome['registered']} registered: acceptance {outcome['gain']:+.3f}"
        elif process.returncode == 0:
            message = f"no adapter registered: acceptance {outcome.get('gain', 0):+.3f}"
        else:
            message = f"fine-tuning failed (exit {process.returncode})"
        if progress:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
        self.window_show_message(types.ShowMessageParams(
            types.MessageType.Info if process.returncode == 0 else types.MessageType.Error, f"specdec: {message}"))
        self.last_finetune = {"folder": folder, "returncode": process.returncode, "message": message, **outcome}
        return self.last_finetune

    # -- requests ---------------------------------------------------------------------
    def workspace_for(self, path: str) -> str:
        matches = [root for root in self.workspace_roots if path.startswith(root.rstrip("/") + "/")]
        return max(matches, key=len) if matches else ""

    def build_request(self, uri: str, position: types.Position, invoked: bool) -> CompletionRequest | None:
        document = self.workspace.text_documents.get(uri) or self.workspace.text_documents.get(unquote(uri))
        if document is None:
            log.info("no completion: %s is not open", uri)
            return None
        text = text_of(document)
        if "\0" in text[:BINARY_SNIFF]:
            return None
        encoding = self.server_capabilities.position_encoding or types.PositionEncodingKind.Utf16
        offset = text.cursor_offset(position, encoding)
        path = uri_path(uri)
        language = syntax.detect_language(document.language_id, uri)
        workspace = self.workspace_for(path)
        prefix, suffix = window(text, offset)
        request = CompletionRequest(uri, language, workspace, prefix, suffix, invoked,
                                    path=str(Path(path).relative_to(workspace)) if workspace else Path(path).name)
        request.context = self.snippets(uri, language)
        if getattr(self.host, "remote", False):  # the engine gets other files as chunks (input_extra, <|file_sep|>)
            request.chunks = self.chunks(uri, language)
        if self.indexer is not None:
            from specdec.repository.build import document_key

            request.document = document_key(path)
        return request

    def chunks(self, uri: str, language: str) -> list[dict]:
        """Heads of other open files of the language, as {filename, text}: a remote engine's repository context."""
        if not self.settings.snippets_from_open_files:
            return []
        budget, out = self.settings.max_snippet_tokens * 3, []
        for other_uri, doc in list(self.workspace.text_documents.items())[-8:]:
            if other_uri != uri and syntax.detect_language(doc.language_id, other_uri) == language:
                out.append({"filename": Path(uri_path(other_uri)).name, "text": text_of(doc)[:budget]})
        return out[-2:]

    def snippets(self, uri: str, language: str) -> str:
        """Heads of other open files of the same language, in the family's repo-level format."""
        completer = self.host.completer
        if not (self.settings.snippets_from_open_files and completer and completer.template.file_header):
            return ""
        budget = self.settings.max_snippet_tokens * 3
        parts = []
        for other_uri, doc in list(self.workspace.text_documents.items())[-8:]:
            if other_uri == uri or syntax.detect_language(doc.language_id, other_uri) != language:
                continue
            head = text_of(doc)[:budget]
            parts.append(completer.template.file_header.format(path=Path(uri_path(other_uri)).name) + head + "\n")
            if len(parts) == 2:
                break
        return "".join(parts)


def create_server(metrics: MetricsStore | None = None, settings: Settings | None = None) -> SpecdecServer:
    """settings: the base the editor's options apply to (`specdec serve --engine KIND --engine-url URL`)."""
    server = SpecdecServer(metrics)
    if settings is not None:
        server.settings = server.service.settings = settings

    @server.feature(types.INITIALIZE)
    def initialize(ls: SpecdecServer, params: types.InitializeParams):
        ls.loop = asyncio.get_running_loop()
        ls.protocol._workspace = DocumentWorkspace.replacing(ls.workspace)  # documents kept in chunks
        folders = params.workspace_folders or []
        ls.workspace_roots = [uri_path(f.uri) for f in folders]
        if not folders and params.root_uri:
            ls.workspace_roots = [uri_path(params.root_uri)]
        ls.apply_settings(params.initialization_options)
        ls.sync_index()  # the repository index builds in the background (even if the options were refused)

    @server.feature(types.INITIALIZED)
    def initialized(ls: SpecdecServer, params: types.InitializedParams):
        ls.start_loading()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: SpecdecServer, params: types.DidChangeConfigurationParams):
        ls.apply_settings(params.settings)

    @server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def did_change_folders(ls: SpecdecServer, params: types.DidChangeWorkspaceFoldersParams):
        removed = {uri_path(f.uri) for f in params.event.removed}
        ls.workspace_roots = [r for r in ls.workspace_roots if r not in removed]
        ls.workspace_roots += [uri_path(f.uri) for f in params.event.added]
        if ls.indexer is not None:
            for root in removed:
                ls.indexer.close_root(root)
            for folder in params.event.added:
                ls.indexer.open_root(uri_path(folder.uri))

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: SpecdecServer, params: types.DidChangeTextDocumentParams):
        ls.index_document(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: SpecdecServer, params: types.DidSaveTextDocumentParams):
        ls.index_document(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: SpecdecServer, params: types.InlineCompletionParams):
        invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        request = ls.build_request(params.text_document.uri, params.position, invoked)
        suggestion = await ls.service.complete(request) if request else None
        if suggestion is None:
            return types.InlineCompletionList(items=[])
        return types.InlineCompletionList(items=[inline_item(params.position, suggestion)])

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: SpecdecServer, params: types.DidCloseTextDocumentParams):
        ls.service.forget(params.text_document.uri)
        ls.index_document(params.text_document.uri, closed=True)

    @server.feature(types.TEXT_DOCUMENT_COMPLETION,
                    types.CompletionOptions(trigger_characters=[".", "(", " "], resolve_provider=False))
    async def completion(ls: SpecdecServer, params: types.CompletionParams):
        invoked = params.context is None or params.context.trigger_kind == types.CompletionTriggerKind.Invoked
        request = ls.build_request(params.text_document.uri, params.position, invoked)
        suggestion = await ls.service.complete(request) if request else None
        if suggestion is None:
            return types.CompletionList(is_incomplete=True, items=[])
        # clients filter by the word before the cursor, so the item replaces that word
        word = len(request.prefix) - len(request.prefix.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                 "0123456789_"))
        word_text = request.prefix[len(request.prefix) - word :]
        start = types.Position(params.position.line, max(0, params.position.character - len(word_text.encode(
            "utf-16-le")) // 2))
        new_text = word_text + suggestion.text
        return types.CompletionList(is_incomplete=True, items=[types.CompletionItem(
            label=new_text.split("\n")[0][:80] or new_text[:80], kind=types.CompletionItemKind.Snippet,
            detail="specdec", filter_text=new_text, sort_text="0",
            insert_text_format=types.InsertTextFormat.PlainText,
            text_edit=types.TextEdit(types.Range(start, params.position), new_text),
            command=types.Command(title="specdec: suggestion accepted", command=ACCEPT_COMMAND, arguments=[suggestion.id]))])

    @server.command(ACCEPT_COMMAND)
    def accept(ls: SpecdecServer, *args):
        suggestion_id = args[0] if args and isinstance(args[0], str) else None
        return {"counted": bool(suggestion_id) and ls.service.accept(suggestion_id)}

    @server.command(FINETUNE_COMMAND)
    async def finetune(ls: SpecdecServer, *args):
        """Fine-tune the draft on a workspace folder in a subprocess; its adapter is used once registered."""
        folder = uri_path(args[0]) if args and isinstance(args[0], str) else (ls.workspace_roots or [""])[0]
        if not folder or not Path(folder).is_dir():
            return {"started": False, "error": "no workspace folder to fine-tune"}
        options = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
        asyncio.ensure_future(ls.run_finetune(folder, options))
        return {"started": True, "folder": folder}

    @server.feature(STATS_REQUEST)
    def stats(ls: SpecdecServer, params=None):
        return {"model": {"state": ls.host.state, "error": ls.host.error, "target": ls.settings.target,
                          "draft": ls.settings.draft, "strategy": ls.settings.strategy, "adapter": ls.host.adapter,
                          "target_quant": ls.host.target_quant,
                          "adapter_error": ls.host.adapter_error, "progress": ls.host.progress},
                "scheduler": dict(ls.service.counters), "finetune": ls.last_finetune,
                "repo_index": ls.indexer.stats() if ls.indexer is not None else {"state": "off"},
                "online_adaptation": ls.service.online.status(), "cost_curve": ls.host.cost_curve(),
                "documents": summary(ls.workspace.text_documents.values()),
                "engine": ls.host.stats() if getattr(ls.host, "remote", False) else {"kind": "local", "state": "ok"},
                **ls.metrics.summary()}

    @server.feature(TRACE_REQUEST)
    def trace(ls: SpecdecServer, params=None):
        """From the first ask on, completions record p and q too (a softmax per pass nobody read before)."""
        from pygls.exceptions import JsonRpcInvalidParams

        from lsp_server.traces import parse_params
        from specdec.errors import SpecdecError

        try:
            uri, limit = parse_params(params)
        except SpecdecError as exc:
            raise JsonRpcInvalidParams(str(exc)) from None
        ls.host.trace_probabilities = True
        return {"uri": uri, "traces": ls.service.traces.latest(uri, limit)}

    return server
