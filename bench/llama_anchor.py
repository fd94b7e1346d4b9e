"""llama.cpp's `/infill` answers put through the server's completion rules, for the benchmarks that show it beside ours.

The comparison is only fair if both sides see the same text and end alike. So llama-server
gets the part of the document our prompt holds (`fim.window` under the same Settings budgets)
in llama.vim's layout, and the tokens it returns go through what our generations go through:
the syntax stop predicate after every token (`accept_tokens`, the engine's own loop), the
same token budget, the same stop ids, and `syntax.finalize`. What differs is llama.cpp's:
its prompt format (`<|repo_name|>myproject`, `<|file_sep|>filename`) and its kernels.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path

from lsp_server.settings import Settings
from specdec.backends.base import CompletionResult
from specdec.backends import llama_server
from specdec.completion import syntax
from specdec.prompts import fim

SERVER_STOPS = {"eos": "eos", "limit": "max_tokens", "word": "stop"}  # llama.cpp's stop_type, in our words


@dataclass
class InfillRules:
    tokenizer: object  # the target's: llama.cpp's vocabulary is the same one (the GGUF was made from it)
    stop_ids: frozenset[int]
    settings: Settings

    @classmethod
    def load(cls, settings: Settings, tokenizer=None) -> InfillRules:
        """The target's tokenizer (only that: no weights) and the stop ids our sessions use for it."""
        if tokenizer is None:
            from transformers import AutoTokenizer

            from specdec.models.store import ensure_local, tokenizer_dir

            ensure_local(settings.target)
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir(settings.target)))
        stops = fim.stop_token_ids(tokenizer, fim.detect(tokenizer, settings.fim_family or None))
        return cls(tokenizer, frozenset(stops), settings)

    def cursor(self, language: str, prefix: str, suffix: str) -> tuple[syntax.CursorContext, llama_server.LocalContext]:
        """Our cursor analysis (as ModelHost.generate applies it) and llama.vim's context of the text we keep."""
        ctx = syntax.analyze(language, prefix, suffix)
        if not self.settings.multiline:
            ctx = replace(ctx, multiline=False)
        kept_prefix, kept_suffix = fim.window(self.tokenizer, prefix, suffix, self.settings.max_prefix_tokens,
                                              self.settings.max_suffix_tokens)
        return ctx, llama_server.local_context(kept_prefix, kept_suffix)

    def accept(self, ctx: syntax.CursorContext, new: list[int], out: list[int]) -> tuple[str, str | None]:
        """Tokens as they come, checked as the engine checks its own: ("", None) while generation may go on."""
        from specdec.engine.session import accept_tokens  # torch: not before a run (`specdec serve` builds this parser)

        return accept_tokens(new, out, self.stop_ids, self.tokenizer, self.settings.max_new_tokens,
                             syntax.stop_predicate(ctx))

    def finish(self, ctx: syntax.CursorContext, out: list[int], reason: str, cut: str | None,
               server_stop: str) -> tuple[str, str]:
        """(the item's text, our stop reason): `reason` from accept, or, if our rules never stopped it, how
        llama.cpp ended (eos, or its token limit)."""
        reason = reason or SERVER_STOPS.get(server_stop, "eos")
        text = cut if cut is not None else self.tokenizer.decode(out)
        return syntax.finalize(ctx, text, reason), reason

    def answer(self, ctx: syntax.CursorContext, reply: llama_server.InfillReply) -> tuple[str, str, list[int]]:
        """A whole (non-streamed) reply through the rules: (text, stop reason, the tokens kept)."""
        out: list[int] = []
        reason, cut = self.accept(ctx, reply.tokens, out)
        text, reason = self.finish(ctx, out, reason, cut, reply.stop_type)
        return text, reason, out

    def complete(self, port: int, language: str, prefix: str, suffix: str) -> tuple[str, CompletionResult]:
        """One completion streamed from llama-server, its connection closed as soon as our rules end it (as
        our generation stops there), the same token budget as ours. Returns (text, CompletionResult)."""
        ctx, local = self.cursor(language, prefix, suffix)
        payload = llama_server.stream_request(local, self.settings.max_new_tokens)
        streamed = llama_server.StreamedInfill()
        out: list[int] = []
        ending: list = ["", None]

        def on_event(event: dict) -> bool:
            reason, cut = self.accept(ctx, streamed.add(event), out)
            if reason:
                ending[:] = [reason, cut]
            return bool(reason)

        started = time.perf_counter()
        asyncio.run(llama_server.stream(port, "/infill", payload, on_event))
        seconds = time.perf_counter() - started
        text, reason = self.finish(ctx, out, ending[0], ending[1], streamed.stop_type)
        from specdec.engine.session import Generation, GenerationStats

        stats = GenerationStats(strategy="llama-infill", new_tokens=len(out), produced=len(out) + (reason == "eos"),
                                prefill_computed=streamed.prompt_n, prefill_reused=streamed.cache_n,
                                prefill_seconds=streamed.prompt_ms / 1000, seconds=seconds)
        return text, CompletionResult.from_generation(Generation(out, text, reason, stats))


def infill_files(settings: Settings, what: str) -> tuple[Path, Path] | None:
    """(llama-server, the target's GGUF) for a benchmark's llama.cpp side, or None where either is missing (said:
    `what` is skipped)."""
    from specdec.models.store import target_gguf

    binary = llama_server.find_server()
    if binary is None:
        print(f"llama.cpp is not installed: skipping {what}. Install it with:\n  {llama_server.INSTALL_HINT}",
              flush=True)
        return None
    gguf = target_gguf(settings.target)
    if gguf is None:
        print(f"no GGUF for {settings.target}: skipping {what}", flush=True)
        return None
    return binary, gguf


@contextlib.contextmanager
def infill_server(binary: Path, gguf: Path, what: str):
    """llama.anchor_server, said: yields the started anchor, or None where it did not start even with weight
    repacking off (`what` is skipped, said why); a start without repacking is said too."""
    from specdec_bench import llama

    with llama.anchor_server(binary, gguf) as anchor:
        if anchor.server is None:
            print(f"skipping {what}: {anchor.failed}", flush=True)
            yield None
            return
        if anchor.note:
            print(f"{what}: llama-server runs with weight repacking off ({anchor.repack_failure} with it on)",
                  flush=True)
        yield anchor
