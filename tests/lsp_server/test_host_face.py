"""Issue #49 item 2: one face for the server's host, whichever backend computes: every member of hosts.ServerHost
is on ModelHost and RemoteHost, and what a remote engine cannot serve answers as it says."""

import pytest

from lsp_server.hosts import ModelHost, ServerHost
from lsp_server.remote_host import RemoteHost
from specdec.engine.session import CancelToken
from specdec.errors import SpecdecError


def members() -> set[str]:
    names = set(getattr(ServerHost, "__annotations__", {}))
    names |= {n for n, v in vars(ServerHost).items() if not n.startswith("_") and (callable(v) or
                                                                                  isinstance(v, property))}
    return names


@pytest.mark.parametrize("make", [ModelHost, lambda: RemoteHost("llama-server")], ids=["local", "remote"])
def test_every_host_has_the_whole_face(make):
    host = make()
    missing = sorted(name for name in members() if not hasattr(host, name))
    assert not missing, missing
    assert isinstance(host.remote, bool) and host.kind and host.state == "idle"


def test_a_remote_engine_prefills_nothing_ahead_and_refuses_next_edits_in_one_line():
    host = RemoteHost("vllm")
    assert host.prefill(None, None, CancelToken()) is False
    with pytest.raises(SpecdecError, match="next edits need the local engine"):
        host.next_edit("x = 1\n", 0, "a.py")
