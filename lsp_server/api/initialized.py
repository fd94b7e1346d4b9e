"""initialized: the models start loading in the background, reported as work-done progress."""

from __future__ import annotations

from lsprotocol import types

METHOD = types.INITIALIZED


def handle(ls, params: types.InitializedParams):
    ls.configuration.start_loading()
