"""specdec.finetune (workspace/executeCommand): fine-tune the draft on a workspace folder in a child process
(lsp_server/finetune_child.py); its adapter is used once registered. Answers at once whether it started."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsp_server.cursor import uri_path

COMMAND = "specdec.finetune"


async def handle(ls, *args):
    folder = uri_path(args[0]) if args and isinstance(args[0], str) else (ls.workspace_roots or [""])[0]
    if not folder or not Path(folder).is_dir():
        return {"started": False, "error": "no workspace folder to fine-tune"}
    options = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
    asyncio.ensure_future(ls.finetuning.run(folder, options))
    return {"started": True, "folder": folder}
