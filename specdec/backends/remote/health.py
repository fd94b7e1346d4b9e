"""The failure policy for a remote engine: one message per outage, a bounded backoff, resumption.

While the engine is down, requests are answered empty at once instead of each one waiting out a timeout
(no retry storm on every keystroke); after the backoff (1 s doubling to MAX_BACKOFF_S) one request tries
the engine again, and its success ends the outage: completions resume by themselves. The user hears of an
outage once (`on_change` with the new state and a one-line reason) and once when it ends. An engine's
Retry-After is honoured up to MAX_BACKOFF_S; a new configuration (`reset`: another engineUrl) ends the
backoff at once.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0

STATES = {"unreachable": "engine unreachable", "auth": "engine refused the key", "http": "engine error",
          "stalled": "engine stalled", "ended": "engine stream ended early", "shape": "engine reply not understood",
          "timeout": "engine too slow"}


class Health:
    def __init__(self, on_change: Callable[[str, str], None] = lambda state, message: None,
                 first_s: float = FIRST_BACKOFF_S, max_s: float = MAX_BACKOFF_S, clock=time.monotonic):
        self.on_change, self.first_s, self.max_s, self.clock = on_change, first_s, max_s, clock
        self.state = "ok"  # ok | one of STATES' keys
        self.reason = ""
        self.failures = 0  # in a row
        self.retry_at = 0.0
        self._trying = False  # one request probes a down engine at a time
        self._announced = False  # an outage was said before a reset: the next success says it is over
        self._lock = threading.Lock()

    def may_try(self) -> bool:
        """Whether a request may call the engine now: always while it is up; while it is down, one request
        once the backoff has passed."""
        with self._lock:
            if self.state == "ok":
                return True
            if self._trying or self.clock() < self.retry_at:
                return False
            self._trying = True
            return True

    def succeeded(self) -> None:
        with self._lock:
            was, self._trying = self.state, False
            announced, self._announced = self._announced, False
            self.state, self.reason, self.failures, self.retry_at = "ok", "", 0, 0.0
        if was != "ok" or announced:
            self.on_change("ok", "engine reachable again: completions resume")

    def failed(self, kind: str, reason: str, retry_after: float | None = None) -> None:
        """retry_after: the engine's Retry-After in seconds: the next try waits that long, up to max_s."""
        with self._lock:
            was, self._trying = self.state, False
            self.failures += 1
            delay = min(self.max_s, max(self.first_s * 2 ** min(self.failures - 1, 32), retry_after or 0.0))
            self.state, self.reason, self.retry_at = kind if kind in STATES else "http", reason, self.clock() + delay
            if was == "ok":
                self._announced = False  # this outage's own message follows
        if was == "ok":  # one message per outage, not per request
            self.on_change(self.state, f"{STATES[self.state]}: {reason}; retrying in the background")

    def reset(self) -> None:
        """A new configuration (another URL, key or engine settings): no backoff left, the next request tries.
        Silent: a failure of the new one is a new outage with its own message, a success says the old one ended."""
        with self._lock:
            self._announced = self._announced or self.state != "ok"
            self.state, self.reason, self.failures, self.retry_at, self._trying = "ok", "", 0, 0.0, False

    def released(self) -> None:
        """A probing request ended without a verdict (cancelled): let the next one try."""
        with self._lock:
            self._trying = False

    def status(self) -> dict:
        return {"state": self.state, "reason": self.reason, "failures": self.failures,
                "retry_in_s": max(0.0, round(self.retry_at - self.clock(), 1)) if self.state != "ok" else 0.0}
