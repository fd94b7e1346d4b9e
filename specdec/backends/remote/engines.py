"""Each engine's request shape, how its stream is read, and how its speculation counters become ours.

llama-server: `/infill` as llama.vim sends it (input_prefix / prompt split at the cursor's line, input_suffix,
`input_extra` = repository chunks, `cache_prompt`, `n_indent`), streamed: input_prefix + prompt and input_suffix
are the window the local prompt holds, exactly (llama.vim's newline after a suffix without one is not added).
`n_predict` and `t_max_predict_ms` are the engine-side caps, plus `timings_per_token`: every event then carries
`timings` with `draft_n` / `draft_n_accepted` so far, so a stream our stop rule closes still reports its speculation.
vLLM: `/v1/completions` with the raw FIM prompt (it refuses `suffix`), explicit stop strings,
`stream_options.include_usage`, `max_tokens`; `metrics.speculative_decoding` when the server runs with
`--per-request-spec-decode-metrics`, else deltas of its Prometheus `vllm:spec_decode_*` counters.
SGLang: `/generate` with the raw FIM prompt and `sampling_params`; `meta_info` `spec_accept_rate` /
`spec_accept_length` / `spec_verify_ct`.

A `Speculation` with `source == "not reported"` carries no counts: missing fields are never zero acceptance,
and neither is a count that is not one (`_count`: negative, not finite, Infinity, 1e999, beyond MAX_COUNT).
An event of the wrong shape is an EngineError carrying the engine's words uncut: backend.py quotes them
(`Endpoint.describe`), scrubbing the key before any cut.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from specdec.backends.remote.http import EngineError

REPORTED, PROMETHEUS, NOT_REPORTED = "reported", "prometheus", "not reported"
MAX_COUNT = 1 << 53  # a count beyond this (a float's whole numbers) is no count of tokens or passes


@dataclass
class EngineRequest:
    """What one engine call needs, engine-neutral: built by backend.py from a CompletionRequest."""

    prefix: str
    suffix: str
    prompt: str  # the whole FIM prompt as text (vLLM, SGLang); llama-server builds its own from the pieces
    extra: list[dict] = field(default_factory=list)  # repository chunks: [{"filename", "text"}]
    stops: list[str] = field(default_factory=list)  # the template's stop strings
    max_tokens: int = 64
    max_ms: int = 0  # the engine's own time cap on prediction (llama-server t_max_predict_ms); 0: none
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    model: str = ""  # the served model (vLLM's `model`): the adapter's name when one serves this workspace
    lora: str = ""  # the adapter's name, as the engine serves it ("" for the base model)
    lora_id: int | None = None  # llama-server's adapter id (from /lora-adapters)


@dataclass
class Speculation:
    """The engine's speculation for one request. drafted/accepted/passes are None where not reported."""

    source: str = NOT_REPORTED  # reported | prometheus (server-wide counter deltas) | not reported
    drafted: int | None = None
    accepted: int | None = None
    passes: int | None = None  # target (verify) passes

    def as_stats(self) -> dict:
        return {"speculation": self.source, "drafted": self.drafted, "accepted": self.accepted,
                "target_passes": self.passes}


@dataclass
class Reading:
    """What a stream (or a whole reply) has said so far."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish: str = ""  # the engine's own reason, as it says it
    completion_tokens: int | None = None
    final: dict = field(default_factory=dict)  # the fields only the last event carries (timings, usage, metrics)


def _number(value) -> float | None:
    """A finite number, or None (not a number, a boolean, Infinity or NaN, an int too big for a float)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _count(value) -> int | None:
    """A whole count (the nearest, where it is computed from a rate), or None where the value is not one."""
    number = _number(value)
    return round(number) if number is not None and 0 <= number <= MAX_COUNT else None


def passes_from(tokens: int | None, accepted: int | None) -> int | None:
    """Each verify pass yields its accepted draft tokens and one token of its own: passes = tokens - accepted."""
    if tokens is None or accepted is None or tokens <= 0:
        return None
    return max(1, tokens - accepted)


class LlamaServer:
    kind = "llama-server"
    path = "/infill"

    def body(self, req: EngineRequest) -> dict:
        cut = req.prefix.rfind("\n") + 1
        above, before = req.prefix[:cut], req.prefix[cut:]
        line = before + req.suffix.split("\n", 1)[0]
        indent = len(line) - len(line.lstrip(" \t")) if line.strip() else 0
        body = {"input_prefix": above, "input_suffix": req.suffix, "input_extra": list(req.extra),
                "prompt": before, "n_predict": req.max_tokens, "n_indent": indent, "stream": True,
                "cache_prompt": True, "return_tokens": True, "stop": [],  # llama.vim: the engine stops at EOG
                "timings_per_token": True}  # draft_n so far on every event: a stream our stop rule cuts reports too
        if req.max_ms:
            body["t_max_predict_ms"] = req.max_ms
        if req.temperature == 0:
            body.update(top_k=1, samplers=["top_k"])  # llama.vim's greedy
        else:
            body.update(temperature=req.temperature, top_p=req.top_p)
        if req.seed is not None:
            body["seed"] = req.seed
        if req.lora_id is not None:
            body["lora"] = [{"id": req.lora_id, "scale": 1.0}]
        return body

    def read(self, event, reading: Reading) -> str:
        if not isinstance(event, dict) or not isinstance(event.get("content", ""), str):
            raise EngineError("shape", "llama-server sent an event without content", words=str(event))
        if "error" in event:
            raise EngineError("http", "llama-server said", words=str(event["error"]))
        piece = event.get("content", "")
        reading.text += piece
        tokens = event.get("tokens")
        if isinstance(tokens, list):
            reading.tokens += [int(t) for t in tokens if isinstance(t, int)]
        if isinstance(event.get("timings"), dict):
            reading.final["timings"] = event["timings"]  # cumulative: the latest holds the counts so far
        if event.get("stop"):
            reading.finish = str(event.get("stop_type") or "eos")
            reading.completion_tokens = _count(event.get("tokens_predicted"))
        return piece

    def speculation(self, reading: Reading) -> Speculation:
        timings = reading.final.get("timings")
        if not isinstance(timings, dict):
            return Speculation()
        drafted, accepted = _count(timings.get("draft_n")), _count(timings.get("draft_n_accepted"))
        if drafted is None or accepted is None:
            return Speculation()
        tokens = _count(timings.get("predicted_n"))
        return Speculation(REPORTED, drafted, accepted, passes_from(tokens, accepted))

    def stop_reason(self, reading: Reading) -> str:
        return {"eos": "eos", "limit": "max_tokens", "word": "stop"}.get(reading.finish, "eos")


class Vllm:
    kind = "vllm"
    path = "/v1/completions"
    COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens")

    def body(self, req: EngineRequest) -> dict:
        body = {"model": req.model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": req.temperature,
                "top_p": req.top_p, "stop": list(req.stops), "stream": True,
                "stream_options": {"include_usage": True}}
        if req.seed is not None:
            body["seed"] = req.seed
        return body

    def read(self, event, reading: Reading) -> str:
        if not isinstance(event, dict) or not isinstance(event.get("choices"), list):
            raise EngineError("shape", "vLLM sent an event without choices", words=str(event))
        piece = ""
        for choice in event["choices"]:
            if not isinstance(choice, dict) or not isinstance(choice.get("text", ""), str):
                raise EngineError("shape", "vLLM sent a choice without text", words=str(choice))
            piece += choice.get("text", "")
            if choice.get("finish_reason"):
                reading.finish = str(choice["finish_reason"])
        reading.text += piece
        usage = event.get("usage")
        if isinstance(usage, dict):
            reading.completion_tokens = _count(usage.get("completion_tokens"))
            reading.final["usage"] = usage
        if isinstance(event.get("metrics"), dict):
            reading.final["metrics"] = event["metrics"]
        return piece

    def speculation(self, reading: Reading) -> Speculation:
        spec = (reading.final.get("metrics") or {}).get("speculative_decoding")
        if not isinstance(spec, dict):
            return Speculation()
        drafted, accepted = _count(spec.get("num_draft_tokens")), _count(spec.get("num_accepted_draft_tokens"))
        if drafted is None or accepted is None:
            return Speculation()
        return Speculation(REPORTED, drafted, accepted, passes_from(reading.completion_tokens, accepted))

    @classmethod
    def counters(cls, text: str) -> dict[str, float] | None:
        """The spec-decode counters of a Prometheus page, summed over labels (engines); None without them."""
        totals: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            match = re.match(r"^([a-zA-Z_:][\w:]*?)(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)", line)
            if match and match.group(1) in cls.COUNTERS:
                try:
                    value = float(match.group(2))  # 1e999 is inf: delta() reads no count from it
                except ValueError:
                    continue
                totals[match.group(1)] = totals.get(match.group(1), 0.0) + value
        return totals if len(totals) == len(cls.COUNTERS) else None

    @classmethod
    def delta(cls, before: dict[str, float], after: dict[str, float]) -> Speculation:
        """Server-wide counter deltas between two scrapes: this request's and any other served meanwhile."""
        drafts, drafted, accepted = (_count(after[c] - before[c]) for c in cls.COUNTERS)
        if None in (drafts, drafted, accepted):  # the engine restarted between the scrapes, or a counter is not one
            return Speculation()
        return Speculation(PROMETHEUS, drafted, accepted, None)

    def stop_reason(self, reading: Reading) -> str:
        return {"length": "max_tokens", "stop": "eos"}.get(reading.finish, "eos")


class Sglang:
    kind = "sglang"
    path = "/generate"

    def body(self, req: EngineRequest) -> dict:
        params = {"max_new_tokens": req.max_tokens, "temperature": req.temperature, "top_p": req.top_p,
                  "stop": list(req.stops)}
        if req.seed is not None:
            params["sampling_seed"] = req.seed
        body = {"text": req.prompt, "sampling_params": params, "stream": True}
        if req.lora:
            body["lora_path"] = req.lora
        return body

    def read(self, event, reading: Reading) -> str:
        if not isinstance(event, dict) or not isinstance(event.get("text"), str):
            raise EngineError("shape", "SGLang sent an event without text", words=str(event))
        text = event["text"]
        # /generate streams the whole text so far (or, with --incremental-streaming-output, the new piece)
        piece = text[len(reading.text):] if text.startswith(reading.text) else text
        reading.text += piece
        meta = event.get("meta_info")
        if isinstance(meta, dict):
            reading.completion_tokens = _count(meta.get("completion_tokens"))
            finish = meta.get("finish_reason")
            if isinstance(finish, dict):
                reading.finish = str(finish.get("type") or "")
            reading.final["meta_info"] = meta
        return piece

    def speculation(self, reading: Reading) -> Speculation:
        meta = reading.final.get("meta_info") or {}
        rate, length = _number(meta.get("spec_accept_rate")), _number(meta.get("spec_accept_length"))
        tokens = reading.completion_tokens
        if rate is None or length is None or not tokens:
            return Speculation()
        estimate = _count(tokens / length) if length > 0 else None
        passes = _count(meta.get("spec_verify_ct")) or (max(1, estimate) if estimate is not None else None)
        if passes is None:
            return Speculation()
        accepted = max(0, tokens - passes)
        if rate > 0:
            drafted = _count(accepted / rate)  # a rate of 1e-320 drafts no 10^320 tokens
            return Speculation(REPORTED, max(accepted, drafted), accepted, passes) if drafted is not None \
                else Speculation()
        if accepted == 0:  # nothing accepted: how much was drafted is not said
            return Speculation(NOT_REPORTED, None, None, passes)
        return Speculation()

    def stop_reason(self, reading: Reading) -> str:
        return {"length": "max_tokens", "stop": "eos", "abort": "cancelled"}.get(reading.finish, "eos")


ENGINES = {cls.kind: cls for cls in (LlamaServer, Vllm, Sglang)}
