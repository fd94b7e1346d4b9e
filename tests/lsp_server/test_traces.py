"""specdec/trace's store: the last traces per document, a bounded number of documents (LRU), params checked."""

import pytest

from lsp_server.traces import TraceStore, parse_params
from specdec.engine.trace import PLAIN, PassRecord, Trace
from specdec.errors import SpecdecError


def trace(token: int) -> Trace:
    return Trace(3, "plain", passes=[PassRecord([], [], "", None, [], token, PLAIN, 0, 0.0, 0.001, prefill=True)],
                 new_tokens=1, stop_reason="max_tokens", text=str(token))


def decode(ids):
    return "".join(str(i) for i in ids)


def test_the_last_traces_of_a_document_newest_last():
    store = TraceStore(per_document=3, documents=4)
    for token in range(5):
        store.add("file:///a.py", trace(token), decode, f"shown {token}")
    kept = store.latest("file:///a.py")
    assert [t["tokens"] for t in kept] == [[2], [3], [4]]  # only the last three
    assert [t["shown"] for t in store.latest("file:///a.py", 2)] == ["shown 3", "shown 4"]
    assert store.latest("file:///a.py", 0) == [] and store.latest("file:///other.py") == []
    assert kept[-1]["pieces"] == ["4"] and kept[-1]["passes"][0]["next_text"] == "4"  # the --trace-json shape
    assert set(kept[-1]) >= {"strategy", "passes", "summary", "text", "tokens", "prefill"}


def test_documents_are_dropped_least_recently_completed_first_and_when_closed():
    store = TraceStore(per_document=2, documents=3)
    for name in "abc":
        store.add(f"file:///{name}.py", trace(1), decode, "")
    store.add("file:///a.py", trace(2), decode, "")  # a is the newest now
    store.add("file:///d.py", trace(3), decode, "")  # b, the least recent, goes
    assert store.latest("file:///b.py") == [] and len(store.latest("file:///a.py")) == 2
    assert all(store.latest(f"file:///{n}.py") for n in "acd")
    store.forget("file:///a.py")
    assert store.latest("file:///a.py") == []


@pytest.mark.parametrize("params,message", [({}, "needs params"), ({"uri": 3}, "needs params"),
                                            ({"uri": "file:///a.py", "limit": -1}, "limit"),
                                            ({"uri": "file:///a.py", "limit": "2"}, "limit"),
                                            ({"uri": "file:///a.py", "limit": True}, "limit"), (None, "needs params")])
def test_bad_params_are_one_line_errors(params, message):
    with pytest.raises(SpecdecError, match=message):
        parse_params(params)
    assert parse_params({"uri": "file:///a.py"}) == ("file:///a.py", None)
    assert parse_params({"uri": "file:///a.py", "limit": 2}) == ("file:///a.py", 2)
