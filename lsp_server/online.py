"""Online adaptation (issue #34 item 3): the workspace's draft adapter keeps learning from what the user accepts.

The completion service reports what it serves, what the user accepts and which documents completions are asked
in (the documents being edited). After every `onlineEveryAccepted` accepted completions of a workspace, once no
completion request has come for `onlineIdleSeconds`, a refresh starts: `python -m specdec_finetune.online`
(finetune/online.py) in a child process, at lower priority on one thread, the workspace's accepted completions
and edited documents on its stdin. A completion request stops the child (SIGSTOP, through psutil) until the user
has been idle that long again, so training never runs while a completion does. A child process because
lsp_server may not import specdec_finetune, and because a stopped process is paused at once, mid-step, where a
thread could only stop between steps. A refresh the child keeps is the repository's newest registered adapter;
the swap into the served draft is queued on the model worker at idle, so it happens after the running
generation and before the next, with no reload (LocalBackend.use_adapter, the path every request takes). Each
refresh is a metrics record (kind "online": samples, steps, seconds, CPU seconds, acceptance before and after,
kept).
Nothing of this touches the disk but the adapter and the record: the texts travel over the child's stdin.
A document whose real path (every symlink resolved) is outside its workspace gives no text to learn from.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import sys
import time
from collections import OrderedDict, deque
from dataclasses import asdict
from pathlib import Path

from lsp_server.settings import Settings
from specdec.models.online_job import AcceptedSample, OnlineJob

log = logging.getLogger("specdec.server")

TRAINER = "specdec_finetune.online"  # run as a module in a child process: lsp_server may not import it
MAX_PENDING = 64  # served suggestions whose samples wait for an accept (the newest)
MAX_ACCEPTED = 64  # accepted completions kept per workspace (the newest): one refresh's data
MAX_EDITED = 8  # edited documents kept per workspace (the most recently completed in)


def in_workspace(request) -> bool:
    """Whether the request's document lies inside its workspace once every symlink is resolved (a folder of the
    workspace may be a link to text from elsewhere, which is never learnt from)."""
    from urllib.parse import unquote, urlparse

    from specdec.repository.files import within

    parsed = urlparse(request.uri)
    path = unquote(parsed.path) if parsed.scheme in ("file", "") else ""
    if not request.completion.workspace or not path or "\0" in path or "\0" in request.completion.workspace:
        return False
    return within(os.path.realpath(request.completion.workspace), os.path.realpath(path))
PREFIX_CHARS, SUFFIX_CHARS = 4096, 1024  # of a completion's context: more than the trainer's prompt budget uses
MAX_HISTORY = 20  # this session's refresh outcomes (the metrics file keeps every one)


class OnlineAdaptation:
    """Collects samples per workspace, starts a refresh at idle, pauses it for completions, swaps its adapter in."""

    def __init__(self, host, metrics, settings: Settings):
        self.host, self.metrics, self.settings = host, metrics, settings
        self.pending: OrderedDict[str, tuple[str, AcceptedSample]] = OrderedDict()  # suggestion id -> (ws, sample)
        self.latest: OrderedDict[str, tuple[str, AcceptedSample]] = OrderedDict()  # uri -> its last model sample
        self.accepted: dict[str, deque[AcceptedSample]] = {}
        self.edited: dict[str, OrderedDict[str, tuple[str, str, str]]] = {}  # ws -> uri -> (path, language, text)
        self.since: dict[str, int] = {}  # workspace -> accepted completions since its last refresh
        self.busy = 0  # completion requests under way
        self.last_activity = time.monotonic()
        self.process = None  # the refresh's child process (asyncio.subprocess.Process)
        self.paused = False
        self.paused_seconds = 0.0
        self._paused_at = 0.0
        self.running = ""  # the workspace being refreshed
        self.history: deque[dict] = deque(maxlen=MAX_HISTORY)
        self.error = ""
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None
        self._swap_due = ""  # a workspace whose kept refresh waits for idle to be swapped in
        self.swaps: list[asyncio.Future] = []  # hot swaps queued on the model worker (tests wait on them)
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- what the service reports -----------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.settings.online_adaptation

    def available(self) -> str:
        """Why no refresh can run with the loaded models ("" when one can)."""
        if self.host.switchable is None:
            return "needs a draft model and adapters: true"
        return ""

    def configure(self, settings: Settings) -> None:
        """New settings: turning it off stops a running refresh and forgets every collected text."""
        self.settings = settings
        if not self.enabled:
            self.close()
            for store in (self.pending, self.latest, self.accepted, self.edited, self.since):
                store.clear()
            self._swap_due = ""  # a kept adapter is registered: the next request of its workspace uses it
        elif self._timer is not None or self.process is not None:
            self._arm()  # a new idle time applies from now

    def begin_request(self, request) -> None:
        """A completion request arrived: the user is active; a running refresh stops before any generation."""
        self._loop = asyncio.get_running_loop()
        self.busy += 1
        self.last_activity = time.monotonic()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._suspend()
        if self.enabled and request.completion.workspace and request.uri and in_workspace(request):
            docs = self.edited.setdefault(request.completion.workspace, OrderedDict())
            c = request.completion
            docs[request.uri] = (c.path, c.language, c.prefix + c.suffix)
            docs.move_to_end(request.uri)
            while len(docs) > MAX_EDITED:
                docs.popitem(last=False)

    def end_request(self) -> None:
        self.busy = max(0, self.busy - 1)
        self.last_activity = time.monotonic()
        self._arm()

    def served(self, suggestion, request, generation=None) -> None:
        """A suggestion was shown: keep what it would teach, until it is accepted or pushed out."""
        if not self.enabled or not request.completion.workspace or not in_workspace(request):
            return
        if generation is not None and generation.tokens:
            c = request.completion
            sample = AcceptedSample(c.path, c.language, c.prefix[-PREFIX_CHARS:], c.suffix[:SUFFIX_CHARS],
                                    [int(t) for t in generation.tokens], suggestion.text)
            self.latest[request.uri] = (request.completion.workspace, sample)
            self.latest.move_to_end(request.uri)
            while len(self.latest) > MAX_PENDING:
                self.latest.popitem(last=False)
        elif suggestion.source == "typeahead" and request.uri in self.latest:
            sample = self.latest[request.uri][1]  # the rest of the model's own completion, as typed ahead
        else:
            return  # a cache hit: its generation was another request's
        self.pending[suggestion.id] = (request.completion.workspace, sample)
        while len(self.pending) > MAX_PENDING:
            self.pending.popitem(last=False)

    def accepted_suggestion(self, suggestion_id: str) -> None:
        entry = self.pending.pop(suggestion_id, None)
        if entry is None or not self.enabled:
            return
        workspace, sample = entry
        self.accepted.setdefault(workspace, deque(maxlen=MAX_ACCEPTED)).append(sample)
        self.since[workspace] = self.since.get(workspace, 0) + 1
        self._arm()

    def forget(self, uri: str) -> None:
        """didClose: the document's full text goes (accepted completions keep their bounded windows)."""
        self.latest.pop(uri, None)
        for docs in self.edited.values():
            docs.pop(uri, None)

    def status(self) -> dict:
        """For specdec/stats: on or off, what it is doing, how far each workspace is from its next refresh."""
        state = ("off" if not self.enabled else "unavailable" if self.available() else
                 "paused" if self.paused else "running" if self.process is not None else
                 "waiting for idle" if self._due() else "collecting")
        return {"state": state, "reason": self.available() if self.enabled else "", "workspace": self.running,
                "accepted_since_refresh": dict(self.since), "every_accepted": self.settings.online_every_accepted,
                "error": self.error, "last": self.history[-1] if self.history else None}

    # -- scheduling --------------------------------------------------------------------------
    def _due(self) -> str:
        """A workspace whose refresh is due and possible ("" for none)."""
        if not self.enabled or self.available():
            return ""
        for workspace, count in self.since.items():
            if count >= self.settings.online_every_accepted and len(self.accepted.get(workspace, ())) >= 2:
                return workspace
        return ""

    def _arm(self) -> None:
        """Call _on_idle once the user has been idle for onlineIdleSeconds, if a refresh or a swap is due, or a
        refresh is paused."""
        if self.busy or not self.enabled or (self.process is None and not self._due() and not self._swap_due):
            return
        if self.process is not None and not self.paused:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called off the event loop (an accept from a worker thread): arm it there
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._arm)
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, self.last_activity + self.settings.online_idle_seconds - time.monotonic())
        self._timer = loop.call_later(delay, self._on_idle)

    def _on_idle(self) -> None:
        self._timer = None
        if self.busy:
            return  # end_request arms again
        if time.monotonic() - self.last_activity < self.settings.online_idle_seconds:
            self._arm()
            return
        if self._swap_due:  # folding the new adapter in takes the model worker a few seconds: not while typing
            loop = asyncio.get_running_loop()
            self.swaps.append(loop.run_in_executor(self.host.executor, self._swap, self._swap_due))
            self._swap_due = ""
        if self.process is not None:
            self._resume()
        elif self._task is None:
            workspace = self._due()
            if workspace:
                self._task = asyncio.ensure_future(self._refresh(workspace))

    def _suspend(self) -> None:
        if self.process is None or self.paused:
            return
        import psutil

        try:
            psutil.Process(self.process.pid).suspend()
        except psutil.Error:  # it has just exited
            return
        self.paused, self._paused_at = True, time.monotonic()

    def _resume(self) -> None:
        if self.process is None or not self.paused:
            return
        import psutil

        try:
            psutil.Process(self.process.pid).resume()
        except psutil.Error:
            pass
        self.paused = False
        self.paused_seconds += time.monotonic() - self._paused_at

    def close(self) -> None:
        """Stop a running refresh (settings turned off, server exit): a stopped child would never wake."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.kill()  # SIGKILL ends a stopped process too
            except ProcessLookupError:
                pass

    # -- one refresh -------------------------------------------------------------------------
    def job(self, workspace: str) -> OnlineJob:
        """What the child trains on, from the server's own settings."""
        s = self.settings
        return OnlineJob(workspace, s.draft, s.target, self.host.draft_hash, s.dtype, s.draft_quant, s.fim_family,
                         steps=s.online_steps, accepted=[asdict(a) for a in self.accepted.get(workspace, ())],
                         fresh=self.since.get(workspace, 0),  # the newest, never trained on: the held-out set's pool
                         edited=[{"path": path, "language": language, "text": text}
                                 for path, language, text in self.edited.get(workspace, {}).values()],
                         forward=s.forward)  # the target labels on the forward the server verifies with

    async def _refresh(self, workspace: str) -> None:
        started = time.time()
        job = self.job(workspace)
        self.since[workspace] = 0  # counted afresh from here, whatever the outcome
        outcome, error = {}, ""
        self.paused_seconds, self.running = 0.0, workspace
        try:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", TRAINER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, env=env)
            self.paused = False
            atexit.register(self.close)  # a stopped child must not outlive the server
            if self.busy or time.monotonic() - self.last_activity < self.settings.online_idle_seconds:
                self._suspend()  # a request came while it was starting
                self._arm()
            self.process.stdin.write(job.to_json().encode())
            await self.process.stdin.drain()
            self.process.stdin.close()
            async for raw in self.process.stdout:
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue
                if event.get("event") == "done":
                    outcome = event
                elif event.get("event") == "error":
                    error = str(event.get("message", ""))
                elif event.get("event") == "log":
                    log.info("online refresh of %s: %s", workspace, event.get("message", ""))
            code = await self.process.wait()
            if code and not error:
                error = f"the refresh exited with status {code}"
        except (OSError, ValueError) as exc:
            error = f"the refresh did not run: {exc}"
        finally:
            if self.paused:
                self._resume()
            atexit.unregister(self.close)
            self.process, self.paused, self.running, self._task = None, False, "", None
        self.error = error
        self._record(workspace, started, outcome, error)
        if outcome.get("kept") and outcome.get("adapter"):
            self._swap_due = workspace
        self._arm()  # the swap, and another workspace's refresh, at idle

    def _record(self, workspace: str, started: float, outcome: dict, error: str) -> None:
        def rate(key):
            value = outcome.get(key)
            return value.get("acceptance_rate") if isinstance(value, dict) else None

        row = {"kind": "online", "time": time.time(), "language": "", "workspace": workspace,
               "adapter": outcome.get("adapter", ""), "previous": outcome.get("previous", ""),
               "kept": bool(outcome.get("kept")), "acceptance_before": rate("before"),
               "acceptance_after": rate("after"), "heldout": outcome.get("heldout", 0),
               "accepted_samples": outcome.get("accepted_train", 0), "edited_samples": outcome.get("edited_samples", 0),
               "edited_files": outcome.get("edited_files", 0), "dropped_files": len(outcome.get("dropped") or {}),
               "steps": outcome.get("steps", 0), "seconds": time.time() - started,
               "paused_seconds": self.paused_seconds, "cpu_seconds": outcome.get("cpu_seconds", 0.0),
               "skipped": outcome.get("skipped", ""), "error": error}
        self.metrics.add(row)
        self.history.append(row)
        for path, reason in sorted((outcome.get("dropped") or {}).items()):
            log.info("online refresh never trained on %s (%s)", path, reason)
        log.info("online refresh of %s: %s", workspace, error or (
            f"acceptance {row['acceptance_before']} -> {row['acceptance_after']}, "
            f"{'kept as ' + row['adapter'] if row['kept'] else 'discarded'}"))

    def _swap(self, workspace: str) -> None:
        """Model worker: serve the workspace's new adapter, then drop the online versions it replaced (their
        weights from the draft, their folders from the registry). Adapters made by `specdec finetune` stay."""
        from specdec_adapters.registry import Registry, repo_identity

        from specdec.errors import SpecdecError

        host = self.host
        if host.switchable is None:
            return
        host.use_adapter(workspace)  # the newest registered adapter; the draft's KV cache restarts
        try:
            registry = Registry()
            key = repo_identity(Path(workspace))[0]
            for meta in registry.versions(key)[:-1]:
                if not meta.training.get("online"):
                    continue
                if meta.name != host.switchable.active:
                    host.switchable.unload(meta.name)
                registry.remove(key, meta.version)
        except (SpecdecError, OSError) as exc:  # the registry changed under it: the next swap tidies up
            log.warning("online adaptation: replaced adapters of %s not removed: %s", workspace, exc)
