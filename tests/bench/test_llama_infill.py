"""llama.cpp's /infill as llama.vim calls it: request layout, the recorded reply (whole and streamed), and the
HTTP client's cancellation (closing the connection) against a stand-in server."""

import asyncio
import json
import time
from pathlib import Path

import pytest
from fake_llama_server import start

from specdec.backends import llama_server

RECORDED = json.loads((Path(__file__).parent.parent / "data" / "llama_infill.json").read_text())


def test_the_request_has_llama_vims_layout_as_recorded():
    ctx = llama_server.local_context(RECORDED["context"]["prefix"], RECORDED["context"]["suffix"])
    body = llama_server.vim_request(ctx, 16)
    assert body == RECORDED["request"]  # what was sent to the real llama-server when the reply was recorded
    assert body["input_prefix"] == "def fib(n):\n" and body["prompt"] == "    "
    assert body["input_suffix"] == "\n\nprint(fib(10))\n" and body["input_extra"] == []
    assert body["samplers"] == ["top_k"] and body["top_k"] == 1 and body["cache_prompt"] is True
    assert (body["t_max_prompt_ms"], body["t_max_predict_ms"]) == (500, 250)  # llama.vim's first request
    streamed = llama_server.vim_request(ctx, 16, stream=True)
    assert streamed == RECORDED["stream_request"] and streamed["stream"] is True


def test_local_context_splits_at_the_cursor_line():
    ctx = llama_server.local_context("import os\n    x = f(", ")\n    return x\n")
    assert (ctx.input_prefix, ctx.prompt, ctx.input_suffix, ctx.indent) == (
        "import os\n", "    x = f(", ")\n    return x\n", 4)
    first = llama_server.local_context("de", "f main():\n")
    assert (first.input_prefix, first.prompt, first.input_suffix) == ("", "de", "f main():\n")
    blank = llama_server.local_context("if x:\n        ", "\nelse:\n")
    assert blank.prompt == "        " and blank.indent == 0  # llama.vim's n_indent 0 on a blank line
    assert llama_server.local_context("a\n", "").input_suffix == "\n"


def test_the_recorded_reply_parses():
    reply = llama_server.parse_reply(RECORDED["response"])  # cut to response_fields: flattened "timings/..."
    assert reply.content == "if n <= 1:\n" and reply.tokens == [333, 308, 2651, 220, 16, 510]
    assert reply.stop_type == "limit" and reply.tokens_predicted == 6  # t_max_predict_ms after the line break
    assert reply.prompt_n == RECORDED["response"]["timings/prompt_n"] == 23 and reply.cache_n == 0
    with pytest.raises(ValueError, match="not an /infill response"):
        llama_server.parse_reply({"error": {"code": 500}})


def test_the_recorded_stream_gathers_into_the_same_reply():
    streamed = llama_server.StreamedInfill()
    for event in RECORDED["stream_events"]:
        streamed.add(event)
    reply = streamed.reply()
    whole = llama_server.parse_reply(RECORDED["response"])
    assert (reply.content, reply.tokens, reply.stop_type) == (whole.content, whole.tokens, whole.stop_type)
    assert reply.cache_n == 22 and reply.prompt_n == 1  # the second call found its prompt in the slot's cache


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture
def fake(tmp_path):
    config = {"answers": {"a\n": [1, 2, 3, 4]}, "pieces": {"1": "x", "2": " =", "3": " 1", "4": "\n"},
              "default": [], "log": str(tmp_path / "log.jsonl")}
    server = start(config)
    yield config, server.server_address[1], Path(config["log"])
    server.shutdown()


def logged(path: Path, entries: int = 1, wait_s: float = 3.0) -> list[dict]:
    """The fake server's log, once it has `entries` lines (it writes each after the reply went out)."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= entries or time.monotonic() > deadline:
            return [json.loads(line) for line in lines]
        time.sleep(0.02)


def test_post_and_stream_read_whole_and_chunked_replies(fake):
    _, port, log = fake
    body = run(llama_server.post(port, "/infill", {"input_prefix": "a\n", "prompt": "", "n_predict": 3}))
    assert body["content"] == "x = 1" and body["stop_type"] == "limit"
    streamed = llama_server.StreamedInfill()
    stopped = run(llama_server.stream(port, "/infill", {"input_prefix": "a\n", "stream": True},
                                      lambda e: streamed.add(e) and False))
    assert not stopped and streamed.tokens == [1, 2, 3, 4] and streamed.content == "x = 1\n"
    assert streamed.stop_type == "eos"
    assert [e["ended"] for e in logged(log, 2)] == ["done", "done"]


def test_a_stream_is_closed_as_soon_as_the_caller_has_enough(fake):
    config, port, log = fake
    config["token_delay_s"] = 0.2
    seen = []
    stopped = run(llama_server.stream(port, "/infill", {"input_prefix": "a\n", "stream": True},
                                      lambda e: seen.append(e["tokens"]) or len(seen) == 2))
    assert stopped and seen == [[1], [2]]
    time.sleep(0.5)
    assert logged(log)[-1]["ended"] == "closed" and logged(log)[-1]["tokens_sent"] == 2  # the rest never went


def test_cancelling_the_awaiting_task_closes_the_connection(fake):
    config, port, log = fake
    config["delay_s"] = 1.0

    async def cancel_after(seconds):
        task = asyncio.ensure_future(llama_server.post(port, "/infill", {"input_prefix": "a\n"}))
        await asyncio.sleep(seconds)
        task.cancel()
        await asyncio.wait([task])
        return task.cancelled()

    assert run(cancel_after(0.1))
    time.sleep(0.3)
    assert logged(log)[-1]["ended"] == "closed"


def test_an_http_error_is_one_clear_exception(fake):
    _, port, _ = fake
    with pytest.raises(llama_server.HttpError, match="HTTP 404"):
        run(llama_server.post(port, "/nowhere", {}))


@pytest.mark.slow
def test_real_llama_server_infill_as_recorded_and_cancelled_when_closed():
    binary = llama_server.find_server()
    if binary is None:
        pytest.skip(f"llama.cpp is not installed: {llama_server.INSTALL_HINT}")
    gguf = Path.home() / ".cache/specdec/models/gguf/qwen2.5-coder-1.5b-q4_k_m.gguf"
    if not gguf.is_file():
        pytest.skip(f"no {gguf}: run `specdec models pull Qwen/Qwen2.5-Coder-1.5B`")
    ctx = llama_server.local_context(RECORDED["context"]["prefix"], RECORDED["context"]["suffix"])
    with llama_server.LlamaServer(binary, gguf) as server:
        streamed = llama_server.StreamedInfill()
        run(llama_server.stream(server.port, "/infill", llama_server.vim_request(ctx, 16, stream=True),
                                lambda e: streamed.add(e) and False))
        long = llama_server.vim_request(llama_server.local_context("PRIMES = [\n    2, 3, 5,", "\n]\n"), 200,
                                        t_max_predict_ms=0, stream=True)
        seen = []
        run(llama_server.stream(server.port, "/infill", long, lambda e: seen.append(e) or len(seen) == 2))
        run(llama_server.post(server.port, "/infill", llama_server.vim_request(ctx, 1)))  # the slot is free again
        server.log.seek(0)
        log = server.log.read()
    recorded = RECORDED["response"]["tokens"]  # greedy: the tokens recorded, up to the first line break;
    assert streamed.tokens[:len(recorded)] == recorded  # past it t_max_predict_ms's clock decides where it stops
    assert "cancel task" in log, "llama-server did not stop the stream whose connection closed"
