"""One work-done progress ($/progress: begin, reports, end) for a client that can show it; nothing for one that cannot.

Model loading reports from its thread through the event loop; the fine-tune child's reader reports on it.
"""

from __future__ import annotations

from lsprotocol import types


class Progress:
    def __init__(self, server, token: str):
        caps = server.client_capabilities.window
        self.server, self.token = server, token
        self.shown = bool(caps and caps.work_done_progress)

    def create(self) -> None:
        if self.shown:
            self.server.work_done_progress.create(self.token)

    async def create_async(self) -> None:
        if self.shown:
            await self.server.work_done_progress.create_async(self.token)

    def begin(self, title: str, message: str) -> None:
        if self.shown:
            self.server.work_done_progress.begin(self.token, types.WorkDoneProgressBegin(
                title=title, message=message, percentage=0, cancellable=False))

    def report(self, message: str, percent: int) -> None:
        if self.shown:
            self.server.work_done_progress.report(self.token, types.WorkDoneProgressReport(message=message,
                                                                                           percentage=percent))

    def end(self, message: str) -> None:
        if self.shown:
            self.server.work_done_progress.end(self.token, types.WorkDoneProgressEnd(message=message))
