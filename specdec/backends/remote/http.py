"""HTTP/1.1 to an engine: one connection per call, read against deadlines, closed to cancel.

Why not urllib: a completion must end within a bound whatever the engine does (stalls mid-stream, never
answers, closes early), and the editor's cancel must reach the engine at once. Engines drop a streamed
request when the client closes its connection (llama-server: "stop: cancel task"; vLLM and SGLang abort
the request on disconnect), so every read here waits at most a short slice, checks the cancel token and
the deadlines, and `close()` is the cancellation. TLS when the URL says https (the engine's or a proxy's).

The API key goes in the `Authorization: Bearer` header only. Every message an `EngineError` carries is
built from the status, the engine's own words and the URL without credentials; the engine's words pass
`Endpoint.quote` (the key scrubbed before they are cut, and what is left of its beginning at a cut scrubbed
after), in case an engine echoes the header back. What an engine sends is bounded in size as in time: a
line, one event of a stream (sse.MAX_EVENT_BYTES), a whole reply (MAX_BODY_BYTES).
"""

from __future__ import annotations

import json
import re
import select
import socket
import ssl
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from specdec.backends import sse

SLICE_S = 0.05  # longest single wait: how quickly a cancel or a deadline is noticed
ERROR_BODY_CHARS = 200  # of an engine's error reply, quoted in the message
WORDS_CHARS = 120  # of an event or a line that is not JSON, quoted in the message
KEY_PREFIX_CHARS = 4  # a word ending in at least this much of the key's beginning is scrubbed as the key
MAX_LINE_BYTES = 64 * 1024  # a status, header or chunk-size line
MAX_BODY_BYTES = 16 << 20  # a whole reply: /props, /metrics, a completion that is not streamed
ERROR_READ_BYTES = 64 * 1024  # of an error reply: read at most this much, quote ERROR_BODY_CHARS of it
_WORD = re.compile(r"[A-Za-z0-9_\-+/=]+")  # a run of the characters API keys are made of


@dataclass(frozen=True)
class Bounds:
    """How long an engine call may take, in seconds: the settings engineConnectSeconds, engineFirstByteSeconds,
    engineStallSeconds and engineTotalSeconds, the flags --engine-connect-seconds ... (specdec/backends/remote/cli.py).

    The first byte is bounded apart from the gaps between pieces: an engine answers only once it has evaluated
    the whole prompt (seconds on a CPU), long after a stream that went quiet mid-way should be given up."""

    connect_s: float = 2.0  # to open a connection
    first_byte_s: float = 15.0  # from the request to the first byte of the reply's body
    stall_s: float = 8.0  # between two pieces of a reply, once it started
    total_s: float = 20.0  # for the whole call: a completion request is answered within this

    # (setting, flag, low, high) per field: the one rule behind the settings' schema and the flags' check
    LIMITS = {"connect_s": ("engineConnectSeconds", "--engine-connect-seconds", 0.1, 60.0),
              "first_byte_s": ("engineFirstByteSeconds", "--engine-first-byte-seconds", 0.1, 3600.0),
              "stall_s": ("engineStallSeconds", "--engine-stall-seconds", 0.1, 3600.0),
              "total_s": ("engineTotalSeconds", "--engine-total-seconds", 0.1, 3600.0)}

    @classmethod
    def of(cls, settings) -> "Bounds":
        """The bounds a settings object names (the server's Settings, the CLI's EngineSettings); defaults for the
        rest."""
        default = cls()
        return cls(*(float(getattr(settings, f"engine_{name[:-2]}_seconds", None) or getattr(default, name))
                     for name in cls.LIMITS))

    def problem(self, flags: bool = False) -> str:
        """What is wrong with these bounds in one line, as the settings (or, flags=True, the flags) name them; ""."""
        names = {name: limit[1 if flags else 0] for name, limit in self.LIMITS.items()}
        for name, (_, _, low, high) in self.LIMITS.items():
            value = getattr(self, name)
            if not (low <= value <= high):  # NaN too
                return f"{names[name]} must be a number of seconds in [{low:g}, {high:g}], not {value!r}"
        for name in ("first_byte_s", "stall_s", "connect_s"):
            if getattr(self, name) > self.total_s:
                return (f"{names[name]} ({getattr(self, name):g}) must not exceed {names['total_s']} "
                        f"({self.total_s:g}), which bounds the whole completion")
        return ""


class EngineError(RuntimeError):
    """A failed call. kind: unreachable | auth | http | stalled | ended | shape | timeout (health.py keys its
    message and backoff on it); status: the HTTP status where there was one; retry_after: the seconds the
    engine's Retry-After asked for (None without one); words: the engine's own words where the raiser could
    not quote them (it does not know the key: engines.py), for `Endpoint.describe` to quote."""

    def __init__(self, kind: str, message: str, status: int = 0, words: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.kind, self.status, self.words, self.retry_after = kind, status, words, retry_after


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
    def host(self) -> str:
        """The host as a URL and a Host header write it: an IPv6 address in brackets."""
        host = urlsplit(self.url).hostname or ""
        return f"[{host}]" if ":" in host else host

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def shown(self) -> str:
        """The URL as messages show it: no user:password part, no query."""
        parts = urlsplit(self.url)
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{self.host}{port}{parts.path.rstrip('/')}"

    def scrub(self, text: str) -> str:
        return text.replace(self.api_key, "[key]") if self.api_key else text

    def quote(self, text: str, limit: int) -> str:
        """The engine's words as a message may show them: the key scrubbed, then cut to `limit` characters, then
        the key's first KEY_PREFIX_CHARS or more characters scrubbed where a cut left them: at the end of the text
        (this cut) or at the end of a word (the engine's own cut). The one way an engine's words reach a message."""
        text = " ".join(self.scrub(text).split())
        cut = _scrub_prefix(text[:limit], self.api_key)
        if len(self.api_key) > KEY_PREFIX_CHARS:
            cut = _WORD.sub(lambda word: _scrub_prefix(word.group(0), self.api_key), cut)
        return cut + ("..." if len(text) > limit else "")

    def describe(self, exc: "EngineError") -> str:
        """An EngineError in one line: its message and the engine's words it carries, quoted; the key scrubbed."""
        words = f": {self.quote(exc.words, WORDS_CHARS)!r}" if exc.words else ""
        return self.scrub(str(exc)) + words


def _scrub_prefix(text: str, key: str) -> str:
    """text with a beginning of the key (KEY_PREFIX_CHARS or more characters) at its end replaced."""
    for n in range(min(len(key) - 1, len(text)), KEY_PREFIX_CHARS - 1, -1):
        if text.endswith(key[:n]):
            return text[:-n] + "[key]"
    return text


def request_head(endpoint: Endpoint, method: str, path: str, body: bytes | None, stream: bool = False) -> bytes:
    """The request line and headers: the Host header as the URL names it (an IPv6 address in brackets), the key
    in `Authorization: Bearer` only."""
    head = [f"{method} {urlsplit(endpoint.url).path.rstrip('/')}{path} HTTP/1.1",
            f"Host: {endpoint.host}:{endpoint.port}", "Connection: close",
            f"Accept: {'text/event-stream' if stream else 'application/json'}"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    if endpoint.api_key:
        head.append(f"Authorization: Bearer {endpoint.api_key}")
    return ("\r\n".join(head) + "\r\n\r\n").encode()


class Call:
    """One request on its own connection. Iterate `events()` (a stream) or read `body()` (a whole reply).
    bounds: connecting, the first byte of the body, the gaps after it, the whole call (Bounds)."""

    def __init__(self, endpoint: Endpoint, method: str, path: str, payload: dict | None, cancel=None,
                 bounds: Bounds = Bounds(), stream: bool = False):
        self.endpoint, self.path, self.cancel, self.bounds = endpoint, path, cancel, bounds
        self.deadline = time.monotonic() + bounds.total_s
        self.sock = None
        self._buffer = b""
        self._eof = False
        self._flowing = False  # the body's first byte came: from then on the stall bound, before it the first-byte
        parts = urlsplit(endpoint.url)
        host = parts.hostname
        try:
            sock = socket.create_connection((host, endpoint.port), timeout=bounds.connect_s)
            if parts.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            sock.setblocking(False)
        except (OSError, ssl.SSLError, UnicodeError) as exc:  # UnicodeError: a host name no resolver takes
            raise EngineError("unreachable", f"{endpoint.shown}: cannot connect ({_reason(exc)})") from None
        self.sock = sock
        body = json.dumps(payload).encode() if payload is not None else None
        try:
            self._send(request_head(endpoint, method, path, body, stream) + (body or b""))
            self.status, self.headers = self._head()
        except BaseException:
            self.close()
            raise

    def _where(self) -> str:
        return f"{self.endpoint.shown}{self.path}"

    def _check_deadlines(self, wait_until: float | None = None) -> None:
        now = time.monotonic()
        if now >= self.deadline:
            raise EngineError("timeout", f"{self._where()}: no complete answer within {self.bounds.total_s:g} s")
        if wait_until is not None and now >= wait_until:
            if self._flowing:
                raise EngineError("stalled", f"{self._where()}: no data for {self.bounds.stall_s:g} s")
            raise EngineError("timeout", f"{self._where()}: no answer within {self.bounds.first_byte_s:g} s "
                                         "(the first-byte bound)")

    # -- the socket, a slice at a time ---------------------------------------------------------------------
    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise Cancelled()

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._check_cancel()
            self._check_deadlines()
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
        """Read what arrives within the stall bound (before the body's first byte: the first-byte bound); False at
        the end of the connection."""
        if self._eof:
            return False
        wait_until = time.monotonic() + (self.bounds.stall_s if self._flowing else self.bounds.first_byte_s)
        while True:
            self._check_cancel()
            self._check_deadlines(wait_until)
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
            if len(self._buffer) > MAX_LINE_BYTES:
                raise EngineError("shape", f"{self._where()}: a line of over {MAX_LINE_BYTES} bytes")
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
                raise EngineError("ended", f"{self._where()}: the reply ended early")
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _pieces(self, n: int):
        """The next n bytes of the body as they arrive (a chunk or a Content-Length may announce gigabytes)."""
        while n:
            if not self._buffer and not self._fill():
                raise EngineError("ended", f"{self._where()}: the reply ended early")
            data, self._buffer = self._buffer[:n], self._buffer[n:]
            n -= len(data)
            self._flowing = True
            yield data

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
                yield from self._pieces(size)
                self._exactly(2)
        elif "content-length" in self.headers:
            length = self.headers["content-length"]
            if not length.isdigit():
                raise EngineError("shape", f"{self._where()}: bad Content-Length {length[:40]!r}")
            yield from self._pieces(int(length))
        else:
            while self._buffer or self._fill():
                data, self._buffer = self._buffer, b""
                self._flowing = True
                yield data

    def body(self, limit: int = MAX_BODY_BYTES, cut: bool = False) -> bytes:
        """The whole reply, at most `limit` bytes: a longer one is an EngineError (cut=True: its first bytes)."""
        parts, size = [], 0
        for data in self.chunks():
            parts.append(data)
            size += len(data)
            if size > limit:
                if cut:
                    return b"".join(parts)[:limit]
                raise EngineError("shape", f"{self._where()}: a reply of over {limit} bytes")
        return b"".join(parts)

    def events(self):
        """Server-sent events' `data:` payloads as JSON; the end of the stream or `[DONE]` ends it. A whole
        JSON reply (an engine or proxy that does not stream) is one event. An event over sse.MAX_EVENT_BYTES
        is an EngineError: the reply is not read further."""
        if "application/json" in self.headers.get("content-type", ""):
            yield self.json(self.body())
            return
        pending = b""
        for chunk in self.chunks():
            try:
                payloads, pending = sse.data_lines(pending + chunk)
            except sse.EventTooLarge as exc:
                raise EngineError("shape", f"{self._where()}: {exc}") from None
            for text in payloads:
                if text == sse.DONE:
                    return
                yield self.json(text)

    def json(self, data: bytes):
        try:
            return json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python's stack
            raise EngineError("shape", f"{self._where()}: not JSON: "
                                       f"{self.endpoint.quote(data[:4096].decode(errors='replace'), 80)!r}") from None

    def check_status(self) -> None:
        """Raise for a status other than 2xx, quoting the engine's reply (Endpoint.quote) and keeping its
        Retry-After."""
        if 200 <= self.status < 300:
            return
        try:
            text = self.body(ERROR_READ_BYTES, cut=True).decode(errors="replace").strip()
        except EngineError:
            text = ""
        text = self.endpoint.quote(text, ERROR_BODY_CHARS)
        kind = "auth" if self.status in (401, 403) else "http"
        raise EngineError(kind, f"{self._where()} answered HTTP {self.status}" + (f": {text}" if text else ""),
                          self.status, retry_after=retry_after(self.headers.get("retry-after", "")))

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
    if isinstance(exc, UnicodeError):
        return "not a host name"
    return getattr(exc, "strerror", None) or type(exc).__name__


def retry_after(value: str) -> float | None:
    """Retry-After's seconds (a number of seconds or an HTTP date), None when absent or not understood."""
    value = value.strip()
    if value.isdigit():
        return float(value[:9])
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time()) if value else None
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def _quick(timeout_s: float) -> Bounds:
    return Bounds(min(timeout_s, Bounds.connect_s), timeout_s, timeout_s, timeout_s)


def get_json(endpoint: Endpoint, path: str, timeout_s: float = 5.0):
    """GET a JSON document (an engine's /props, /v1/models, /metrics is text: see get_text)."""
    with Call(endpoint, "GET", path, None, bounds=_quick(timeout_s)) as call:
        call.check_status()
        return call.json(call.body())


def get_text(endpoint: Endpoint, path: str, timeout_s: float = 5.0) -> str:
    with Call(endpoint, "GET", path, None, bounds=_quick(timeout_s)) as call:
        call.check_status()
        return call.body().decode(errors="replace")
