"""The settings in force and the models they load.

A settings change is all or nothing: validated, every step that can fail prepared, then committed; a refused
one leaves the previous settings in force and says why (window/showMessage). Models load in the background,
reported as work-done progress; a newer load supersedes an older one, and settings that arrive while the same
models load are applied once they are ready.
"""

from __future__ import annotations

import logging
import threading

from lsprotocol import types

from lsp_server.hosts import new_host
from lsp_server.progress import Progress
from lsp_server.settings import Settings, SettingsError

log = logging.getLogger("specdec.server")


class Configuration:
    def __init__(self, server):
        self.server = server
        self.generation = 0  # of the newest load: an older one's end is "superseded"
        self.loading: Settings | None = None  # what the load in flight was started with

    def apply(self, options) -> None:
        """Validate, prepare every step that can fail, then commit: all or nothing, the old settings stay on refusal."""
        server = self.server
        old, host = server.settings, server.host
        try:
            new = old.update(options)
            deferred = host.state == "loading" and self.loading is not None and not new.models_differ(self.loading)
            commit, reload = None, False
            if not deferred and host.state in ("ready", "failed", "loading"):
                # the same models are on their way when deferred: the rest is applied in _finish_load
                commit = None if new.models_differ(old) else host.reconfigure(new)
                reload = commit is None
            self._start_prometheus(new)  # the last step that can fail: nothing is applied before it
        except SettingsError as exc:
            server.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"specdec: {exc}"))
            log.error("settings rejected: %s", exc)
            return
        server.settings = new
        server.service.settings = new
        if commit is not None:
            commit()
        elif reload:
            self.start_loading()
        server.indexing.sync()

    def _start_prometheus(self, new: Settings) -> None:
        """Start the endpoint a new prometheusPort asks for; SettingsError if it cannot be started."""
        port, metrics = new.prometheus_port, self.server.metrics
        if not port or port == self.server.settings.prometheus_port:
            return
        if metrics._prometheus is not None:
            log.warning("prometheusPort %d takes effect when the server restarts (the endpoint keeps its port)", port)
            return
        try:
            metrics.serve_prometheus(port)
        except Exception as exc:  # OSError (in use), OverflowError, a missing prometheus_client, ...
            raise SettingsError(f"prometheusPort {port}: the endpoint did not start: {exc}") from None

    def use_engine(self, engine: str) -> None:
        """Swap the host when the engine setting changed; the old one's models or pool are let go."""
        server = self.server
        if server.host.kind == engine:
            return
        old, server.host = server.host, new_host(engine, server.show_message)
        server.service.host = server.service.online.host = server.host
        if hasattr(old, "close"):
            old.close()
        server.indexing.sync()  # a remote engine drafts for itself: the local repository index stops

    def start_loading(self) -> None:
        server = self.server
        self.generation += 1
        generation = self.generation
        settings = server.settings
        progress = Progress(server, f"specdec-load-{generation}")

        def send(fn, *args):
            if server.loop is not None:
                server.loop.call_soon_threadsafe(fn, *args)

        def run() -> None:
            server.host.load(settings, lambda message, percent: send(progress.report, message, percent))
            send(self._finish_load, generation, progress, settings)

        self.use_engine(settings.engine)
        server.host.state = "loading"
        self.loading = settings
        progress.create()
        progress.begin("specdec", f"loading {settings.target}")
        threading.Thread(target=run, name="specdec-load", daemon=True).start()

    def _finish_load(self, generation: int, progress: Progress, settings: Settings) -> None:
        """On the event loop: end the load's progress; apply settings that arrived while it was loading."""
        server, host = self.server, self.server.host
        current = generation == self.generation
        message = ("superseded by newer settings" if not current else
                   "models ready" if host.ready else f"model load failed: {host.error}")
        progress.end(message)
        if not current:
            return
        log.info(message)
        self.loading = None
        if host.ready and host.tokenizer() is not None:  # the indexer waited for the tokenizer
            server.indexing.set_tokenizer(host.tokenizer())
        if not host.ready:
            server.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"specdec: {message}"))
            return
        try:
            if server.settings != settings and not host.apply(server.settings):
                self.start_loading()
        except SettingsError as exc:  # the new models cannot serve a setting accepted meanwhile: reload says why
            log.error("settings not applicable to the loaded models: %s", exc)
            self.start_loading()
