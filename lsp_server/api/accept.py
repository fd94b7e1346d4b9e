"""specdec.accept (workspace/executeCommand): the client took a suggestion; it is counted, indexed, learnt from."""

from __future__ import annotations

from lsprotocol import types

COMMAND = "specdec.accept"


def accepted_command(suggestion) -> types.Command:
    """What a shown suggestion runs when the user takes it."""
    return types.Command(title="specdec: suggestion accepted", command=COMMAND, arguments=[suggestion.id])


def handle(ls, *args):
    suggestion_id = args[0] if args and isinstance(args[0], str) else None
    return {"counted": bool(suggestion_id) and ls.service.accept(suggestion_id)}
