"""HTTP/1.1 to an engine: one connection per call, read against deadlines, closed to cancel.

Why not urllib: a completion must end within a bound whatever the engine does (stalls mid-stream, never
answers, closes early), and the editor's cancel must reach the engine at once. Engines drop a streamed
request when the client closes its connection (llama-server: "stop: cancel task"; vLLM and SGLang abort
the request on disconnect), so every read here waits at most a short slice, checks the cancel token and
the deadlines, and `close()` is the cancellation. TLS when the URL says https (the engine's or a proxy's).

The API key goes in the `Authorization: Bearer` header only. Every message an `EngineError` carries is
built here from the status, the engine's own words (cut short) and the URL without credentials, and the
key is scrubbed from it once more in case an engine echoes the header back.
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from specdec.backends import sse

SLICE_S = 0.05  # longest single wait: how quickly a cancel or a deadline is noticed
ERROR_BODY_CHARS = 200  # of an engine's error reply, quoted in the message


class EngineError(RuntimeError):
    """A failed call. kind: unreachable | auth | http | stalled | ended | shape | timeout (health.py keys its
    message and backoff on it); status: the HTTP status where there was one."""

    def __init__(self, kind: str, message: str, status: int = 0):
        super().__init__(message)
        self.kind, self.status = kind, status


class Cancelled(Exception):
    """The caller's cancel token was set: the connection is closed, nothing is wrong with the engine."""


@dataclass(frozen=True)
class Endpoint:
    """An engine's base URL (scheme, host, port, path prefix) and the key to send, if any."""

    url: str
    api_key: str = ""

    def __post_init__(self):
        from specdec.backends.base import url_problem

        problem = url_problem(self.url, "engineUrl")
        if problem:
            raise ValueError(problem)

    @property
    def shown(self) -> str:
        """The URL as messages show it: no user:password part, no query."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"

    def scrub(self, text: str) -> str:
        return text.replace(self.api_key, "[key]") if self.api_key else text


def _deadline_left(deadline: float, what: str, endpoint: Endpoint, path: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise EngineError("stalled" if what == "stall" else "timeout",
                          f"{endpoint.shown}{path}: no data for too long" if what == "stall"
                          else f"{endpoint.shown}{path}: no complete answer in time")
    return left


class Call:
    """One request on its own connection. Iterate `lines()` (a stream) or read `body()` (a whole reply)."""

    def __init__(self, endpoint: Endpoint, method: str, path: str, payload: dict | None, cancel=None,
                 connect_s: float = 3.0, stall_s: float = 10.0, total_s: float = 30.0, stream: bool = False):
        self.endpoint, self.path, self.cancel = endpoint, path, cancel
        self.stall_s, self.deadline = stall_s, time.monotonic() + total_s
        parts = urlsplit(endpoint.url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        full = parts.path.rstrip("/") + path
        self.sock = None
        self._buffer = b""
        self._eof = False
        try:
            sock = socket.create_connection((host, port), timeout=connect_s)
            if parts.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            sock.setblocking(False)
        except (OSError, ssl.SSLError) as exc:
            raise EngineError("unreachable", f"{endpoint.shown}: cannot connect ({_reason(exc)})") from None
        self.sock = sock
        body = json.dumps(payload).encode() if payload is not None else b""
        head = [f"{method} {full} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
                f"Accept: {'text/event-stream' if stream else 'application/json'}"]
        if payload is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        if endpoint.api_key:
            head.append(f"Authorization: Bearer {endpoint.api_key}")
        try:
            self._send(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            self.status, self.headers = self._head()
        except BaseException:
            self.close()
            raise

    # -- the socket, a slice at a time ---------------------------------------------------------------------
    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise Cancelled()

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._check_cancel()
            _deadline_left(self.deadline, "total", self.endpoint, self.path)
            _, writable, _ = select.select([], [self.sock], [], SLICE_S)
            if not writable:
                continue
            try:
                sent = self.sock.send(view)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                continue
            except OSError as exc:
                raise EngineError("unreachable", f"{self.endpoint.shown}: connection lost ({_reason(exc)})") \
                    from None
            view = view[sent:]

    def _fill(self) -> bool:
        """Read what arrives within the stall bound; False at the end of the connection."""
        if self._eof:
            return False
        stall = time.monotonic() + self.stall_s
        while True:
            self._check_cancel()
            _deadline_left(self.deadline, "total", self.endpoint, self.path)
            _deadline_left(stall, "stall", self.endpoint, self.path)
            pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
            if not pending:
                readable, _, _ = select.select([self.sock], [], [], SLICE_S)
                if not readable:
                    continue
            try:
                data = self.sock.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                continue
            except OSError as exc:
                raise EngineError("ended", f"{self.endpoint.shown}{self.path}: connection lost "
                                           f"({_reason(exc)})") from None
            if not data:
                self._eof = True
                return False
            self._buffer += data
            return True

    def _line(self) -> bytes | None:
        while b"\n" not in self._buffer:
            if not self._fill():
                if self._buffer:
                    line, self._buffer = self._buffer, b""
                    return line
                return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line + b"\n"

    def _exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if not self._fill():
                raise EngineError("ended", f"{self.endpoint.shown}{self.path}: the reply ended early")
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _head(self) -> tuple[int, dict]:
        line = self._line()
        parts = (line or b"").decode("latin-1").split()
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise EngineError("shape", f"{self.endpoint.shown}{self.path}: not an HTTP reply")
        headers = {}
        while True:
            line = self._line()
            if line is None:
                raise EngineError("ended", f"{self.endpoint.shown}{self.path}: the reply ended in its headers")
            text = line.decode("latin-1").strip()
            if not text:
                return int(parts[1]), headers
            key, _, value = text.partition(":")
            headers[key.strip().lower()] = value.strip()

    # -- the body -------------------------------------------------------------------------------------------
    def chunks(self):
        """The body as it arrives: chunked transfer coding, a Content-Length, or up to the end."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = self._line()
                if size_line is None:
                    raise EngineError("ended", f"{self.endpoint.shown}{self.path}: the stream ended early")
                try:
                    size = int(size_line.split(b";")[0].strip() or b"0", 16)
                except ValueError:
                    raise EngineError("shape", f"{self.endpoint.shown}{self.path}: bad chunked encoding") from None
                if size == 0:
                    return
                yield self._exactly(size)
                self._exactly(2)
        elif "content-length" in self.headers:
            yield self._exactly(int(self.headers["content-length"]))
        else:
            while self._buffer or self._fill():
                data, self._buffer = self._buffer, b""
                yield data

    def body(self) -> bytes:
        return b"".join(self.chunks())

    def events(self):
        """Server-sent events' `data:` payloads as JSON; the end of the stream or `[DONE]` ends it. A whole
        JSON reply (an engine or proxy that does not stream) is one event."""
        if "application/json" in self.headers.get("content-type", ""):
            yield self.json(self.body())
            return
        pending = b""
        for chunk in self.chunks():
            payloads, pending = sse.data_lines(pending + chunk)
            for text in payloads:
                if text == sse.DONE:
                    return
                yield self.json(text)

    def json(self, data: bytes):
        try:
            return json.loads(data)
        except ValueError:
            raise EngineError("shape", f"{self.endpoint.shown}{self.path}: not JSON: "
                                       f"{self.endpoint.scrub(data[:80].decode(errors='replace'))!r}") from None

    def check_status(self) -> None:
        """Raise for a status other than 2xx, quoting the engine's reply (cut short, key scrubbed)."""
        if 200 <= self.status < 300:
            return
        try:
            text = self.body()[:ERROR_BODY_CHARS].decode(errors="replace").strip()
        except EngineError:
            text = ""
        text = self.endpoint.scrub(" ".join(text.split()))
        kind = "auth" if self.status in (401, 403) else "http"
        raise EngineError(kind, f"{self.endpoint.shown}{self.path} answered HTTP {self.status}"
                                + (f": {text}" if text else ""), self.status)

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__


def get_json(endpoint: Endpoint, path: str, timeout_s: float = 5.0):
    """GET a JSON document (an engine's /props, /v1/models, /metrics is text: see get_text)."""
    with Call(endpoint, "GET", path, None, total_s=timeout_s, stall_s=timeout_s) as call:
        call.check_status()
        return call.json(call.body())


def get_text(endpoint: Endpoint, path: str, timeout_s: float = 5.0) -> str:
    with Call(endpoint, "GET", path, None, total_s=timeout_s, stall_s=timeout_s) as call:
        call.check_status()
        return call.body().decode(errors="replace")
