"""Our reader between the byte stream and pygls' protocol, for stdio and TCP.

pygls' own loop drops what it cannot parse without a word: a request whose params do not
structure, a batch, invalid UTF-8 or JSON get no reply, and a bad frame deafens it (see
framing.py). Here every request with an id gets an answer (ParseError, InvalidRequest,
InvalidParams, ServerNotInitialized), bad input gets one log line, and well-formed messages go
to pygls' `handle_message` unchanged. `exit` (any params) ends the process at once with LSP's exit
code: replies still owed are moot and a generation in flight must not keep the process alive.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
from typing import Any, Callable

import cattrs
from lsprotocol import types
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage

from lsp_server.framing import Body, Discarded, FrameParser

log = logging.getLogger("specdec.transport")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002
ID_PATTERN = re.compile(rb'"id"\s*:\s*(-?\d{1,19}(?![\d.eE])|"(?:[^"\\\r\n]|\\.){0,256}")')
CHUNK = 65536
STALL_SECONDS = 1.0  # mid-frame silence after which a body that is already whole JSON is read
PENDING_SECONDS = 5.0  # --tcp: a connection that has not sent `initialize` by then is closed (a probe, not a client)


def recover_id(data: bytes) -> int | str | None:
    """Best effort: the top-level id of a request whose body could not be parsed, so it can still be answered."""
    data = data[:65536]
    for match in ID_PATTERN.finditer(data):
        if depth(data[: match.start()]) != 1:
            continue  # an "id" inside params ($/cancelRequest's) is not the message's
        try:
            value = json.loads(match.group(1))
        except ValueError:
            return None
        return value if isinstance(value, (int, str)) else None
    return None


def depth(prefix: bytes) -> int:
    """Nesting of JSON objects and arrays at the end of prefix, outside strings."""
    level, in_string, escaped = 0, False, False
    for byte in prefix:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):
            level += 1
        elif byte in (0x7D, 0x5D):
            level -= 1
    return level


def valid_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class SafeWriter:
    """Writes frames to a stream; after the stream is gone, one log line instead of one traceback a write."""

    def __init__(self, write: Callable[[bytes], None], close: Callable[[], None] = lambda: None):
        self._write, self._close = write, close
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self._write(data)
        except (OSError, ValueError) as exc:
            self.closed = True
            log.error("the client's end is gone (%s); dropping further output", exc)

    def close(self) -> None:
        self.closed = True
        try:
            self._close()
        except (OSError, ValueError):
            pass


class Dispatcher:
    """Frames in, pygls messages out; answers in place of pygls wherever it would stay silent."""

    def __init__(self, server, on_exit: Callable[[int], None], claim: Callable[[], bool] = lambda: True,
                 send: Callable[[dict], None] | None = None):
        """claim: called on `initialize`; False when another connection is already the client (--tcp).
        send: where this dispatcher's own error replies go (default: the protocol's writer)."""
        self.server = server
        self.protocol = server.protocol
        self.on_exit = on_exit  # `exit` (or the end of the stream) with LSP's exit code
        self.claim = claim
        self.send = send or self.protocol._send_data
        self.parser = FrameParser()
        self.initialized = False

    # -- replies --------------------------------------------------------------------
    def error(self, msg_id, code: int, message: str) -> None:
        """One log line; an error reply when there is a request to answer (id null if it was unreadable)."""
        log.error("bad message%s: %s", "" if msg_id is None else f" (id {msg_id!r})", message)
        self.send({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    # -- input ----------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.parser.feed(data)
        while (event := self.parser.next_event()) is not None:
            try:
                if isinstance(event, Body):
                    self.body(event.data, event.problem)
                else:
                    self.discarded(event)
            except Exception:  # a bug here must cost one message, not the server
                log.exception("internal error handling a frame; continuing with the next")

    def discarded(self, event: Discarded) -> None:
        if not event.reason:
            return  # the rest of a run already reported
        msg_id = recover_id(event.data)
        if msg_id is None:
            log.error("framing: %s; skipped to the next Content-Length header", event.reason)
        else:
            self.error(msg_id, PARSE_ERROR, f"framing: {event.reason}")

    def body(self, data: bytes, problem: str = "") -> None:
        framing = f" (framing: {problem})" if problem else ""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.error(recover_id(data), PARSE_ERROR, f"body is not UTF-8 ({exc.reason} at byte {exc.start}){framing}")
            return
        start = len(text) - len(text.lstrip())
        try:
            value, end = json.JSONDecoder().raw_decode(text, start)
        except ValueError as exc:
            self.error(recover_id(data), PARSE_ERROR, f"body is not JSON ({exc}){framing}")
            return
        except RecursionError:  # nested deeper than the decoder's stack allows: a message no client sends
            self.error(recover_id(data), PARSE_ERROR, f"body is nested too deep to decode{framing}")
            return
        rest = text[end:]
        if rest.strip():
            # the frame was longer than its JSON value: the rest may be the next frame's header
            problem = f"{len(rest.encode())} bytes after the JSON value in a frame, read as the next frame"
            self.parser.unread(rest.encode())
        if problem:
            log.error("framing: %s; the JSON value was read", problem)
        self.message(value)

    def message(self, value: Any) -> None:
        if isinstance(value, list):
            ids = [m["id"] for m in value if isinstance(m, dict) and valid_id(m.get("id"))]
            for msg_id in ids or [None]:
                self.error(msg_id, INVALID_REQUEST, "JSON-RPC batches are not supported by LSP")
            return
        if not isinstance(value, dict):
            self.error(None, INVALID_REQUEST, f"a message is a JSON object, not {type(value).__name__}")
            return
        has_id, msg_id, method = "id" in value, value.get("id"), value.get("method")
        response = method is None and ("result" in value or "error" in value)
        if has_id and not valid_id(msg_id) and not (msg_id is None and response):
            why = f"id must be an integer or a string, not {json.dumps(msg_id)[:40]}"
            if response:  # a reply is never answered
                log.error("bad message: a response's %s", why)
            else:
                self.error(None, INVALID_REQUEST, why)
            return
        reply_id = msg_id if has_id and "result" not in value and "error" not in value else None
        if value.get("jsonrpc") != "2.0":
            self.error(reply_id, INVALID_REQUEST, "jsonrpc must be \"2.0\"")
            return
        if "method" in value and not isinstance(method, str):
            self.error(reply_id, INVALID_REQUEST, "method must be a string")
            return
        if method is None:
            if not (has_id and response):
                self.error(reply_id, INVALID_REQUEST, "neither a request, a notification nor a response")
                return
            if not self.initialized:  # the server asks nothing before initialize: not a reply of its client's
                log.error("bad message: a response before initialize, dropped")
                return
        elif method == types.EXIT:  # whatever its params: the client wants the process gone
            self.on_exit(self.exit_code())
            return
        elif not self.admit(method, reply_id):
            return
        try:
            message = self.structure(value)
        except Exception as exc:
            if reply_id is None:
                log.error("bad message: %s %s", method or "response", self.why(exc))
            else:
                self.error(reply_id, INVALID_PARAMS, f"{method}: {self.why(exc)}")
            return
        if method == types.INITIALIZE:
            if not self.claim():
                self.error(reply_id, INVALID_REQUEST, "initialize: the server already serves another client")
                return
            self.initialized = True
        try:
            self.protocol.handle_message(message)
        except Exception as exc:  # pygls answers handler errors itself; this is its own failure
            if reply_id is None:
                log.error("%s failed: %s", method or "response", exc)
            else:
                self.error(reply_id, INTERNAL_ERROR, f"{method}: {exc}")

    def admit(self, method: str, reply_id) -> bool:
        """LSP's lifecycle rules, which pygls leaves to the server (it drops requests after shutdown silently)."""
        if self.protocol._shutdown:
            if reply_id is not None:
                self.error(reply_id, INVALID_REQUEST, f"{method}: the server is shutting down")
            return False
        if method == types.INITIALIZE and self.initialized and reply_id is not None:
            self.error(reply_id, INVALID_REQUEST, "initialize was already received")
            return False
        if not self.initialized and method != types.INITIALIZE:
            if reply_id is not None:
                self.error(reply_id, SERVER_NOT_INITIALIZED, f"{method}: initialize first")
            else:
                log.error("bad message: %s before initialize, dropped", method)
            return False
        return True

    def structure(self, value: dict):
        """pygls' structure_message for the top-level object only, without its multi-line traceback log."""
        protocol = self.protocol
        method = value.get("method")
        if "id" in value:
            if "error" in value:
                kind = types.ResponseErrorMessage
            elif method is not None:
                kind = protocol.get_message_type(method) or JsonRPCRequestMessage
            else:
                kind = protocol._result_types.pop(value["id"], None) or JsonRPCResponseMessage
        else:
            kind = protocol.get_message_type(method) or JsonRPCNotification
        if kind in (JsonRPCRequestMessage, JsonRPCNotification) and "params" not in value:
            value = {**value, "params": None}  # optional in JSON-RPC, required by pygls' fallback types
        return protocol._converter.structure(value, kind)

    @staticmethod
    def why(exc: Exception) -> str:
        if isinstance(exc, cattrs.ClassValidationError):
            return "; ".join(cattrs.transform_error(exc)[:3])
        return f"{type(exc).__name__}: {exc}"

    def exit_code(self) -> int:
        return 0 if self.protocol._shutdown else 1


def finish(server, code: int) -> None:
    """End the process now: cancel the generation in flight, flush what was written, skip thread joins."""
    server.service.cancel_all()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


async def pump(dispatcher: Dispatcher, read: Callable[[], Any]) -> None:
    """Feed chunks from `read` (awaitable bytes, b"" at the end); at the end, exit as LSP says."""
    while True:
        if dispatcher.parser.mid_body:  # a client that overstated a length waits for a reply, not us
            try:
                chunk = await asyncio.wait_for(read(), STALL_SECONDS)
            except asyncio.TimeoutError:
                if (event := dispatcher.parser.stalled()) is not None:
                    dispatcher.body(event.data, event.problem)
                    dispatcher.feed(b"")
                continue
        else:
            chunk = await read()
        if not chunk:
            break
        dispatcher.feed(chunk)
    if dispatcher.initialized:
        log.info("the client closed the stream%s", "" if dispatcher.protocol._shutdown else " without shutdown")
    else:
        log.info("the stream closed before initialize")
    dispatcher.on_exit(dispatcher.exit_code())


def serve_stdio(server) -> int:
    """Serve one client over stdin/stdout until `exit` or the end of stdin, which end the process."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    dispatcher = Dispatcher(server, lambda code: finish(server, code))

    def write(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    server.protocol.set_writer(SafeWriter(write))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes] = asyncio.Queue()

        def read_stdin() -> None:  # a daemon thread: a blocked read must not keep the process alive
            while True:
                try:
                    chunk = stdin.read1(CHUNK)
                except (OSError, ValueError):
                    chunk = b""
                loop.call_soon_threadsafe(chunks.put_nowait, chunk)
                if not chunk:
                    return

        threading.Thread(target=read_stdin, name="specdec-stdin", daemon=True).start()
        await pump(dispatcher, chunks.get)

    return run(server, main)


def serve_tcp(server, host: str, port: int) -> int:
    """Serve one client on HOST:PORT: the first connection that sends `initialize`.

    Until then a connection is only a candidate, served beside any others: one that stays silent (or chatters
    without initializing) for PENDING_SECONDS is closed, and one that leaves (a port probe) changes nothing. Once
    a client is initialized, further connections are closed at once, and the server ends when that client leaves.
    """
    client: Dispatcher | None = None

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peername")
            if client is not None:
                log.error("refused a connection from %s: the server serves one client at a time", peer)
                writer.close()
                return

            def claim() -> bool:
                nonlocal client
                if client is not None:
                    loop.call_soon(writer.close)  # after the error reply is written
                    return False
                client = dispatcher
                dispatcher.send = server.protocol._send_data
                server.protocol.set_writer(SafeWriter(writer.write, writer.close))
                log.info("client connected from %s", peer)
                return True

            def on_exit(code: int) -> None:
                if client is dispatcher:
                    finish(server, code)
                writer.close()  # a candidate that leaves, or says `exit`, takes only itself away

            def drop_if_pending() -> None:
                if not dispatcher.initialized:
                    log.info("closed a connection from %s: no initialize within %gs", peer, PENDING_SECONDS)
                    writer.close()

            dispatcher = Dispatcher(server, on_exit, claim, send=lambda message: writer.write(frame(message)))
            timer = loop.call_later(PENDING_SECONDS, drop_if_pending)
            try:
                await pump(dispatcher, lambda: reader.read(CHUNK))
            except ConnectionError as exc:
                if client is dispatcher:
                    log.error("connection from %s lost: %s; the server ends with its session", peer, exc)
                on_exit(dispatcher.exit_code())
            finally:
                timer.cancel()

        listener = await asyncio.start_server(connection, host, port)
        log.info("serving on %s", ", ".join(str(s.getsockname()) for s in listener.sockets))
        async with listener:
            await listener.serve_forever()

    return run(server, main)


def run(server, main) -> int:
    """Run the loop; it ends the process itself (`exit`, end of stream), so returning is a failure."""
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        finish(server, 1)
    return 1
