"""`specdec bench --engine KIND --engine-url URL[,URL...]`: the bench's holes through remote engines, as rows
beside the local strategies (`engine-1`, `engine-2`, ... labelled KIND@HOST:PORT), same holes, same run.

Each hole goes to the engine as the server sends it (specdec.backends.remote: llama-server's /infill, vLLM's
/v1/completions, SGLang's /generate), streamed, greedy, `--max-new-tokens` as the engine-side cap; a warm-up
request for the previous keystroke first (untimed, unless --cold), so the engine's prompt cache holds what
ours does. Seconds are the whole request as the editor waits for it (HTTP included); the engine's own
speculation counts fill drafted/accepted where it reports them. The text is tokenized here to compare with
`plain`; llama-server builds its own prompt from the pieces, so its prompt is not token for token ours.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from specdec.backends.base import CompletionRequest
from specdec.errors import SpecdecError


def start_engines(args) -> dict:
    """{"engine-N": RemoteBackend} for --engine/--engine-url, loaded; {} without --engine."""
    from specdec.backends.remote.cli import check_engine_args, load_engine

    urls = [u.strip() for u in (getattr(args, "engine_url", None) or "").split(",") if u.strip()]
    engine = getattr(args, "engine", None)
    kind = [check_engine_args(SimpleNamespace(engine=engine, engine_url=url)) for url in urls or [""]][0]
    engines = {}
    for i, url in enumerate(urls if kind else [], 1):
        backend = load_engine(kind, url, target=args.target, max_prefix_tokens=args.max_prefix_tokens,
                              max_suffix_tokens=args.max_suffix_tokens, engine_first_byte_seconds=600.0,
                              engine_stall_seconds=600.0, engine_total_seconds=600.0)  # it waits for slow machines
        backend.predict_ms = 0  # and lets every row generate its --max-new-tokens (no engine-side time cap)
        if backend.health.state != "ok":
            raise SpecdecError(f"engine {url}: {backend.error or backend.health.reason}")
        engines[f"engine-{i}"] = backend
    return engines


def label(backend) -> str:
    return f"{backend.kind}@{backend.endpoint.shown.split('://', 1)[1]}"


def run_engine(backend, hole, args, row: dict, tokenizer) -> list[int]:
    """One hole through the engine; fills the row; the text's token ids (for the comparison with plain)."""
    def request(prefix: str, max_new: int):
        return CompletionRequest(prefix, hole.suffix, language=hole.language, max_new_tokens=max_new)

    if not args.cold:
        backend.complete(request(hole.prefix[:-1], 1))
    started = time.perf_counter()
    result = backend.complete(request(hole.prefix, args.max_new_tokens))
    seconds = time.perf_counter() - started
    if result.stop_reason == "error":
        raise SpecdecError(f"{label(backend)}: {backend.health.reason}")
    s = result.stats
    row.update(seconds=seconds, new_tokens=s["new_tokens"], mode="cold" if args.cold else "warm",
               engine=backend.kind, speculation=s["speculation"])
    if s["speculation"] != "not reported":
        row.update(drafted=s["drafted"] or 0, accepted=s["accepted"] or 0,
                   acceptance_rate=(s["accepted"] or 0) / s["drafted"] if s["drafted"] else None)
        if s["target_passes"]:
            row.update(target_passes=s["target_passes"], produced=s["new_tokens"])
    return tokenizer.encode(result.text, add_special_tokens=False)
