"""`specdec serve` with a remote engine and a workspace folder, over real LSP: the repository index is built in the
target's tokens (its tokenizer made locally from `target`), and the engine receives the index's best chunk for the
cursor (not the heads of the other open files) as llama-server's input_extra / in vLLM's repository-level prompt."""

from __future__ import annotations

import time

import pytest

import raw_client as rc
import tiny
from fake_engines import FakeEngine

GEOMETRY = ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n\n"
            "def scale(point, factor):\n    return Point(point.x * factor, point.y * factor)\n")
MAIN = "from geometry import Point\n\n\ndef scale(point, factor):\n    return Point(\n"
UTIL = "for i in range(10):\n    print(i)\n"


@pytest.mark.parametrize("kind", ["llama-server", "vllm"])
def test_the_engine_gets_the_repository_index_chunks_for_the_cursor(tmp_path, kind):
    target = tmp_path / "tiny"
    tiny.tokenizer().save_pretrained(target)  # the target's tokenizer is all a remote engine's server needs
    project = tmp_path / "proj"
    project.mkdir()
    (project / "geometry.py").write_text(GEOMETRY)
    (project / "main.py").write_text(MAIN)
    main_uri = (project / "main.py").as_uri()
    with FakeEngine(kind, ["point.x", ")", "\n"]) as engine:
        server = rc.RawServer(tmp_path)
        try:
            server.call("init", "initialize", {
                "processId": None, "rootUri": None, "capabilities": {},
                "workspaceFolders": [{"uri": project.as_uri(), "name": "proj"}],
                "initializationOptions": {"engine": kind, "engineUrl": engine.url, "target": str(target),
                                          "debounceMs": 0}})
            server.send(rc.notification("initialized", {}))
            deadline = time.monotonic() + 120
            while True:  # the engine asked, the tokenizer built, the folder indexed
                stats = server.call(f"s{time.monotonic()}", "specdec/stats", {})["result"]
                if stats["model"]["state"] == "ready" and stats["repo_index"].get("settled") \
                        and stats["repo_index"].get("files") == 2:
                    break
                assert time.monotonic() < deadline, stats
                time.sleep(0.1)
            for uri, text in ((main_uri, MAIN), ((project / "util.py").as_uri(), UTIL)):  # util.py: open, unrelated
                server.send(rc.notification("textDocument/didOpen", {"textDocument": {
                    "uri": uri, "languageId": "python", "version": 1, "text": text}}))
            reply = server.call("c", "textDocument/inlineCompletion", {
                "textDocument": {"uri": main_uri}, "position": {"line": 4, "character": 17},
                "context": {"triggerKind": 1}})
            assert "error" not in reply, reply
            body = engine.wait_post()["body"]
        finally:
            server.close()
    chunk = {"filename": "geometry.py", "text": GEOMETRY}  # main.py itself is the document: never its own context
    if kind == "llama-server":
        assert body["input_extra"] == [chunk]
    else:
        assert body["prompt"] == ("<|repo_name|>proj\n<|file_sep|>geometry.py\n" + GEOMETRY + "\n"
                                  "<|file_sep|>main.py\n<|fim_prefix|>" + MAIN[:-1] + "<|fim_suffix|>\n"
                                  "<|fim_middle|>")
