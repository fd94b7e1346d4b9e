"""`specdec.finetune` in the server: `specdec finetune FOLDER --progress-json` as a child process, its steps reported
as work-done progress, its outcome as a message and in specdec/stats (`finetune`)."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

from lsprotocol import types

from lsp_server.progress import Progress

OPTIONS = ("max_steps", "max_minutes", "objective", "rank", "lr")  # the command's options passed on as flags


class Finetuning:
    def __init__(self, server):
        self.server = server
        self.last: dict = {}  # the latest run's outcome

    def argv(self, folder: str, options: dict) -> list[str]:
        settings = self.server.settings
        cmd = [sys.executable, "-m", "specdec.cli", "finetune", folder, "--progress-json", "--target",
               settings.target, "--draft", settings.draft, "--dtype", settings.dtype,
               "--draft-quant", settings.draft_quant,  # the adapter is fitted over the draft this server runs
               "--forward", settings.forward]  # and taught and measured on the forward it serves with
        for key in OPTIONS:
            if key in options:
                cmd += [f"--{key.replace('_', '-')}", str(options[key])]
        if options.get("force"):
            cmd.append("--force")
        return cmd

    async def run(self, folder: str, options: dict) -> dict:
        server = self.server
        progress = Progress(server, f"specdec-finetune-{uuid.uuid4().hex[:8]}")
        await progress.create_async()
        progress.begin("specdec: fine-tuning the draft", folder)
        process = await asyncio.create_subprocess_exec(*self.argv(folder, options), stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.DEVNULL)
        outcome: dict = {}
        async for raw in process.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if event.get("event") == "step":
                progress.report(f"step {event['step']}/{event['max']} loss {event['loss']:.3f}",
                                int(100 * event["step"] / max(1, event["max"])))
            elif event.get("event") == "done":
                outcome = event
        await process.wait()
        if outcome.get("registered"):
            message = f"adapter {outcome['registered']} registered: acceptance {outcome['gain']:+.3f}"
        elif process.returncode == 0:
            message = f"no adapter registered: acceptance {outcome.get('gain', 0):+.3f}"
        else:
            message = f"fine-tuning failed (exit {process.returncode})"
        progress.end(message)
        server.window_show_message(types.ShowMessageParams(
            types.MessageType.Info if process.returncode == 0 else types.MessageType.Error, f"specdec: {message}"))
        self.last = {"folder": folder, "returncode": process.returncode, "message": message, **outcome}
        return self.last
