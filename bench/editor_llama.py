"""The editor benchmark's typing replay against llama-server's `/infill`, as llama.vim would send it.

The same sessions and seeded keystroke delays as the replay against `specdec serve`. On each
keystroke the request in flight, if any, is cancelled by closing its connection (llama-server
drops a task whose connection closed); then the client's own cache answers if it can — llama.vim's
cache: the same text again, or a suggestion that the characters typed since continue (its
look-back over the last 128 characters; our server's type-ahead rule) — and otherwise a new
`/infill` request goes out: llama.vim's layout (specdec_bench.llama_anchor, specdec.backends.llama_server),
greedy, `cache_prompt` on, its `t_max_prompt_ms`/`t_max_predict_ms`, of the text window and token
budget our server uses; streamed, since llama-server cancels only a streamed request whose
connection closed, and answered when its last event arrives (llama.vim shows a whole reply). A
reply goes through our stop rules and trimming, so "answered" means a non-empty suggestion on
both sides. Unlike llama.vim (which waits for the request in flight, retrying every 100 ms) a
keystroke cancels it, as the VS Code client does with ours.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from specdec_bench.llama_anchor import InfillRules
from lsp_server.metrics import percentile
from specdec.backends import llama_server

LOOK_BACK = 128  # characters llama.vim looks back for a cached suggestion the typing continues
CACHE_KEYS = 250  # llama.vim's max_cache_keys


@dataclass
class LlamaRecord:
    language: str
    sent: float
    done: float = 0.0
    status: str = "pending"  # served | empty | cancelled | error
    source: str = ""  # model | cache | typeahead
    prompt_n: int = 0  # prompt tokens llama.cpp evaluated (the rest came from its cache)
    cache_n: int = 0
    text: str = ""  # the suggestion, after our stop rules and trimming
    prefill_ms: float = 0.0  # llama.cpp's own prompt_ms

    @property
    def ms(self) -> float:
        return (self.done - self.sent) * 1000


@dataclass
class ClientCache:
    """llama.vim's completion cache, keyed by the text around the cursor."""

    size: int = CACHE_KEYS
    entries: OrderedDict = field(default_factory=OrderedDict)

    def put(self, prefix: str, suffix: str, text: str) -> None:
        self.entries[(prefix, suffix)] = text
        self.entries.move_to_end((prefix, suffix))
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def get(self, prefix: str, suffix: str) -> tuple[str, str] | None:
        """("cache", text) for this very text; ("typeahead", the rest) for a suggestion made up to LOOK_BACK
        characters earlier that the characters typed since begin; None when neither."""
        if (prefix, suffix) in self.entries:
            self.entries.move_to_end((prefix, suffix))
            return "cache", self.entries[(prefix, suffix)]
        for back in range(1, min(LOOK_BACK, len(prefix)) + 1):
            text = self.entries.get((prefix[:-back], suffix))
            if text and len(text) > back and text.startswith(prefix[-back:]):
                return "typeahead", text[back:]
        return None


@dataclass
class LlamaReplay:
    port: int
    rules: InfillRules
    language: str
    records: list[LlamaRecord] = field(default_factory=list)
    cache: ClientCache = field(default_factory=ClientCache)

    async def run(self, before: str, typed: str, after: str, delays: list[float]) -> None:
        pending: asyncio.Task | None = None
        for ch, delay in zip(typed, delays):
            await asyncio.sleep(delay)
            if pending is not None and not pending.done():
                pending.cancel()  # closes its connection: llama-server stops that task
            before += ch
            pending = self.keystroke(before, after)
        if pending is not None:
            await asyncio.wait([pending])

    def keystroke(self, prefix: str, suffix: str) -> asyncio.Task | None:
        record = LlamaRecord(self.language, time.perf_counter())
        self.records.append(record)
        hit = self.cache.get(prefix, suffix)
        if hit is not None:
            record.source, record.text = hit
            record.status, record.done = ("served" if record.text else "empty"), time.perf_counter()
            return None
        ctx, local = self.rules.cursor(self.language, prefix, suffix)
        payload = llama_server.vim_request(local, self.rules.settings.max_new_tokens, stream=True)
        record.source = "model"

        async def send() -> None:
            streamed = llama_server.StreamedInfill()

            def gather(event: dict) -> bool:
                streamed.add(event)
                return False  # the whole reply, as llama.vim takes it

            try:
                await llama_server.stream(self.port, "/infill", payload, gather)
                reply = streamed.reply()
            except asyncio.CancelledError:
                record.status, record.done = "cancelled", time.perf_counter()
                raise
            except (OSError, ValueError, llama_server.HttpError):
                record.status, record.done = "error", time.perf_counter()
                return
            record.text, _, _ = self.rules.answer(ctx, reply)
            record.done = time.perf_counter()
            record.status = "served" if record.text else "empty"
            record.prompt_n, record.cache_n, record.prefill_ms = reply.prompt_n, reply.cache_n, reply.prompt_ms
            self.cache.put(prefix, suffix, record.text)

        return asyncio.ensure_future(send())


PAUSE_S = 0.3  # a pause: this long without typing after a keystroke; its suggestion counts when on screen by then


def pauses(records: list) -> tuple[int, int]:
    """(pauses, pauses with a suggestion on screen within PAUSE_S of their keystroke): a pause is a keystroke
    followed by PAUSE_S or more without typing (the next keystroke's request is sent later, or none comes); the
    records are one server's client records in the order typed (sent, done, status)."""
    total = hits = 0
    for i, record in enumerate(records):
        following = records[i + 1].sent if i + 1 < len(records) else float("inf")
        if following - record.sent < PAUSE_S:
            continue
        total += 1
        hits += record.status == "served" and record.done - record.sent <= PAUSE_S
    return total, hits


def comparison_row(*, keystrokes: int, cancelled: int, errors: int, hit_ms: list[float], model_ms: list[float],
                   answered_ms: list[float], reused: int, computed: int, paused: tuple[int, int],
                   queue_ms: list[float], prefill_ms: list[float], decode_ms: list[float]) -> dict:
    """One row of the comparison, by the same arithmetic for either server (metrics.percentile: nearest rank)."""
    return {
        "keystrokes": keystrokes,
        "answered": len(answered_ms),
        "cancelled": cancelled,
        "errors": errors,
        "typeahead_hits": len(hit_ms),
        "hit_p50_ms": percentile(hit_ms, 0.5),
        "model_answers": len(model_ms),
        "model_p50_ms": percentile(model_ms, 0.5),
        "model_p95_ms": percentile(model_ms, 0.95),
        "queue_p50_ms": percentile(queue_ms, 0.5),
        "prefill_p50_ms": percentile(prefill_ms, 0.5),
        "decode_p50_ms": percentile(decode_ms, 0.5),
        "suggestion_p50_ms": percentile(answered_ms, 0.5),
        "suggestion_p95_ms": percentile(answered_ms, 0.95),
        "pauses": paused[0],
        "pause_hits": paused[1],
        "pause_share": paused[1] / paused[0] if paused[0] else None,
        "prefill_reuse_rate": reused / (reused + computed) if reused + computed else None,
    }


def summarize_llama(records: list[LlamaRecord]) -> dict:
    """The comparison row of the llama-server replay (all latencies client side: keystroke -> suggestion; its
    prefill is llama.cpp's prompt_ms, its decode the rest of the request: queue and HTTP included)."""
    model = [r for r in records if r.source == "model" and r.status in ("served", "empty")]
    return comparison_row(
        keystrokes=len(records), cancelled=sum(r.status == "cancelled" for r in records),
        errors=sum(r.status == "error" for r in records),
        hit_ms=[r.ms for r in records if r.source in ("cache", "typeahead") and r.status == "served"],
        model_ms=[r.ms for r in model], answered_ms=[r.ms for r in records if r.status == "served"],
        reused=sum(r.cache_n for r in model), computed=sum(r.prompt_n for r in model), paused=pauses(records),
        queue_ms=[], prefill_ms=[r.prefill_ms for r in model], decode_ms=[r.ms - r.prefill_ms for r in model])


def summarize_ours(client_records: list, server_records: list[dict]) -> dict:
    """The same row for `specdec serve`: hits and model answers from its metrics (request received ->
    suggestion ready; queue: debounce and the wait for the model, then prefill and decode of the generation),
    the suggestion times and pauses from the client (request sent -> item received)."""
    requests = [r for r in server_records if r.get("kind") == "request"]
    model = [r for r in requests if r["source"] == "model"]
    return comparison_row(
        keystrokes=len(client_records), cancelled=sum(r.status == "cancelled" for r in client_records),
        errors=sum(r.status == "error" for r in client_records),
        hit_ms=[r["latency_ms"] for r in requests if r["source"] in ("cache", "typeahead") and r.get("shown")],
        model_ms=[r["latency_ms"] for r in model],
        answered_ms=[(r.done - r.sent) * 1000 for r in client_records if r.status == "served"],
        reused=sum(r["prefill_reused"] for r in model), computed=sum(r["prefill_computed"] for r in model),
        paused=pauses(client_records), queue_ms=[r.get("queue_ms", 0.0) for r in model],
        prefill_ms=[1000 * r.get("prefill_seconds", 0.0) for r in model],
        decode_ms=[1000 * r.get("decode_seconds", 0.0) for r in model])


def print_comparison(rows: dict[str, dict]) -> None:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    cols = ("keys", "answered", "cancel", "t-ahead", "hit p50", "model", "model p50", "model p95", "queue",
            "prefill", "decode", "sugg p50", "sugg p95", "pauses", "<=300ms", "reused")
    print("\n" + f"{'server':22} " + " ".join(f"{c:>9}" for c in cols))
    for name, s in rows.items():
        cells = [s["keystrokes"], s["answered"], s["cancelled"], s["typeahead_hits"], f(s["hit_p50_ms"], ".1f"),
                 s["model_answers"], f(s["model_p50_ms"], ".0f"), f(s["model_p95_ms"], ".0f"),
                 f(s["queue_p50_ms"], ".0f"), f(s["prefill_p50_ms"], ".0f"), f(s["decode_p50_ms"], ".0f"),
                 f(s["suggestion_p50_ms"], ".0f"), f(s["suggestion_p95_ms"], ".0f"), s["pauses"],
                 f(s["pause_share"], ".0%"), f(s["prefill_reuse_rate"], ".0%")]
        print(f"{name:22} " + " ".join(f"{c:>9}" for c in cells))
    print("(ms; answered: keystrokes that got a non-empty suggestion; t-ahead: answered from a cache or by "
          "type-ahead, no model call; model: completed model requests, p50/p95 of their latency and of its parts "
          "(queue: debounce and the wait for the model; llama-server's decode holds its queue); sugg: keystroke -> "
          "suggestion of the answered ones; pauses: keystrokes followed by >= 300 ms without typing, <=300ms: the "
          "share with a suggestion on screen within 300 ms of the keystroke; reused: prompt tokens served from the "
          "KV cache)")
