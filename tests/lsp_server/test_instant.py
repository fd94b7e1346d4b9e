"""Issue #50: the first line first, the rest in the background; the prompt prefilled during the debounce; the next
suggestion prefetched after an accept. The fake hosts step when the test lets them (gates), so every check waits on
a state, never on the machine's speed."""

import asyncio
import threading

from test_service import FakeHost, request, service

from specdec.backends import CompletionResult
from specdec.engine.session import CancelToken, GenerationStats

BLOCK = "def f(a):\n    "  # a blank line in a block: a multi-line completion
TEXT = "x = a + 1\n    y = x * 2\n    return y"


class GatedHost(FakeHost):
    """Generates one character each time the test opens the gate; a cancel is seen while it waits."""

    def __init__(self, text=TEXT):
        super().__init__(text=text, step=0)
        self.gate = threading.Semaphore(0)
        self.stepped = threading.Semaphore(0)  # released after each character

    def generate(self, request, ctx, settings, cancel, progress=None):
        self.calls.append(request.completion.prefix)
        out = ""
        for ch in self.text:
            while not self.gate.acquire(timeout=0.01):
                if cancel.cancelled:
                    self.cancelled_at.append(len(out))
                    return out, CompletionResult(out, "cancelled", GenerationStats().as_dict())
            out += ch
            if progress is not None:
                progress(out)
            self.stepped.release()
        stats = GenerationStats(new_tokens=len(out), produced=len(out) + 1, seconds=0.1)
        return out, CompletionResult(out, "eos", stats.as_dict())

    async def advance(self, n: int) -> None:
        """Let n characters through and wait until the worker made them (a ceiling, not an expectation: a worker
        that stopped fails the test instead of hanging it)."""
        for _ in range(n):
            self.gate.release()
            assert await asyncio.to_thread(self.stepped.acquire, timeout=120), "the worker made no character"


def ready_event(svc) -> asyncio.Event:
    from lsp_server.events import CompletionObserver

    ready = asyncio.Event()

    class Ready(CompletionObserver):
        def ready(self, uri):
            ready.set()

    svc.events.subscribe(Ready())
    return ready


async def test_a_multi_line_suggestion_answers_with_its_first_line_and_grows_in_the_background(tmp_path):
    host = GatedHost()
    svc = service(tmp_path, host)
    ready = ready_event(svc)
    asked = asyncio.ensure_future(svc.complete(request(prefix=BLOCK)))
    await host.advance(len("x = a + 1\n"))
    first = await asked  # answered while the model is still generating
    assert first.text == "x = a + 1" and first.source == "model" and not ready.is_set()
    typed = await svc.complete(request(prefix=BLOCK + "x = a"))  # a keystroke that matches: no model
    assert typed.source == "typeahead" and typed.text == " + 1"
    await host.advance(len(TEXT) - len("x = a + 1\n"))
    await asyncio.wait_for(ready.wait(), 10)
    whole = await svc.complete(request(prefix=BLOCK))
    assert whole.source == "cache" and whole.text == TEXT and TEXT.startswith(first.text)
    assert (await svc.complete(request(prefix=BLOCK + "x = a + 1\n    y"))).text == " = x * 2\n    return y"
    assert host.calls == [BLOCK]
    [model] = [r for r in svc.metrics.records if r.get("source") == "model"]
    assert model["early"] and model["new_tokens"] == len(TEXT)  # recorded once, with the whole generation's stats


async def test_an_invoked_request_waits_for_the_whole_suggestion(tmp_path):
    host = GatedHost()
    svc = service(tmp_path, host)
    asked = asyncio.ensure_future(svc.complete(request(prefix=BLOCK, invoked=True)))
    await host.advance(len(TEXT))
    assert (await asked).text == TEXT


async def test_max_predict_ms_answers_with_the_complete_lines_once_it_passed(tmp_path):
    host = GatedHost()
    svc = service(tmp_path, host, first_line_first=False, max_predict_ms=50)
    late = request(prefix=BLOCK, invoked=True)
    late.received -= 1.0  # the budget is long gone when the first line completes
    asked = asyncio.ensure_future(svc.complete(late))
    await host.advance(len("x = a + 1\n    y = x"))
    assert (await asked).text == "x = a + 1"
    await host.advance(len(TEXT) - len("x = a + 1\n    y = x"))


async def test_a_single_line_completion_is_never_cut(tmp_path):
    host = GatedHost(text="a + b")
    svc = service(tmp_path, host, max_predict_ms=50)
    late = request(prefix="def f(a, b):\n    return ", suffix="\n")
    late.received -= 1.0
    asked = asyncio.ensure_future(svc.complete(late))
    await host.advance(len("a + b"))
    assert (await asked).text == "a + b"


async def test_a_keystroke_that_leaves_the_suggestion_stops_its_background_generation(tmp_path):
    host = GatedHost()
    svc = service(tmp_path, host)
    asked = asyncio.ensure_future(svc.complete(request(prefix=BLOCK)))
    await host.advance(len("x = a + 1\n"))
    assert (await asked).text == "x = a + 1"
    other = asyncio.ensure_future(svc.complete(request(prefix=BLOCK + "pass\n    ")))  # not what was suggested
    while not host.cancelled_at:
        await asyncio.sleep(0.01)
    assert host.cancelled_at == [len("x = a + 1\n")]
    await host.advance(len("x = a + 1\n"))
    assert (await other).text == "x = a + 1"  # the new prompt's own answer, early again
    await host.advance(len(TEXT) - len("x = a + 1\n"))  # its background ends
    await asyncio.gather(*svc._background)
    assert host.calls == [BLOCK, BLOCK + "pass\n    "] and list(svc.answers.cache.values()) == [TEXT]


class PrefillHost(FakeHost):
    """Records each early prefill and holds it until it is cancelled or let go."""

    def __init__(self):
        super().__init__(step=0)
        self.prefills, self.prefill_started, self.prefill_cancelled = [], threading.Event(), threading.Event()
        self.release = threading.Event()

    def prefill(self, request, settings, cancel, closed=None) -> bool:
        self.prefills.append(request.completion.prefix)
        self.prefill_started.set()
        while not self.release.wait(0.01):
            if cancel.cancelled:
                self.prefill_cancelled.set()
                return False
        return True


async def test_the_prompt_is_prefilled_during_the_debounce_and_a_newer_keystroke_cancels_it(tmp_path):
    host = PrefillHost()
    svc = service(tmp_path, host, debounce_ms=300)
    old = asyncio.ensure_future(svc.complete(request(prefix="def add(a, b):\n    r")))
    await asyncio.to_thread(host.prefill_started.wait, 10)
    assert not old.done()  # still in its debounce
    new = asyncio.ensure_future(svc.complete(request(prefix="def add(a, b):\n    re")))
    await asyncio.to_thread(host.prefill_cancelled.wait, 10)
    host.release.set()
    assert await old is None and (await new).text == "return a + b"
    assert host.prefills == ["def add(a, b):\n    r", "def add(a, b):\n    re"]
    assert host.calls == ["def add(a, b):\n    re"] and svc.counters["superseded"] == 1


async def test_an_accept_prefetches_the_suggestion_at_the_cursor_it_leaves(tmp_path):
    svc = service(tmp_path, FakeHost(text=" + b"))
    shown = await svc.complete(request(prefix="def add(a, b):\n    return a", suffix="\n"))
    assert svc.accept(shown.id)
    await asyncio.gather(*svc._background)
    assert svc.host.calls == ["def add(a, b):\n    return a", "def add(a, b):\n    return a + b"]
    after = await svc.complete(request(prefix="def add(a, b):\n    return a + b", suffix="\n"))
    assert after.source == "cache" and after.text == " + b" and svc.counters["prefetched"] == 1
    assert [r["source"] for r in svc.metrics.records if r.get("kind") == "request"] == ["model", "cache"]


def test_a_prefilled_prompt_is_generated_from_its_last_token_with_the_same_text(tmp_path):
    """ModelHost.prefill puts the very prompt the generation then uses into the caches: the generation computes
    one token of it, and answers what it answers without the prefill."""
    import tiny
    from test_service import loaded_host

    from specdec.completion import syntax

    host, settings = loaded_host(tiny.saved_pair(tmp_path), strategy="draft")
    req = request(prefix="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n")
    ctx = syntax.analyze("python", req.completion.prefix, req.completion.suffix)
    cold_text, cold = host.executor.submit(host.generate, req, ctx, settings, CancelToken()).result(60)
    host.executor.submit(host.completer.session.reset).result(60)
    assert host.executor.submit(host.prefill, req, settings, CancelToken()).result(60)
    warm_text, warm = host.executor.submit(host.generate, req, ctx, settings, CancelToken()).result(60)
    assert warm.stats["prefill_computed"] == 1 and warm.stats["prefill_reused"] == cold.stats["prefill_computed"] - 1
    assert warm_text == cold_text and warm.text == cold.text
    cancelled = CancelToken()
    cancelled.cancel()
    host.executor.submit(host.completer.session.reset).result(60)
    assert not host.executor.submit(host.prefill, req, settings, cancelled).result(60)


async def test_a_keystroke_that_types_through_the_suggestion_under_way_waits_for_it_instead_of_cancelling(tmp_path):
    host = GatedHost(text="foo(1)")
    svc = service(tmp_path, host)
    first = asyncio.ensure_future(svc.complete(request(prefix="x = ", suffix="\n")))
    await host.advance(len("foo"))
    typed = asyncio.ensure_future(svc.complete(request(prefix="x = f", suffix="\n")))  # what it is making
    further = asyncio.ensure_future(svc.complete(request(prefix="x = foo(", suffix="\n")))  # past what it made
    await host.advance(len("(1)"))
    assert (await first).text == "foo(1)"
    assert [(s.source, s.text) for s in (await typed, await further)] == [("typeahead", "oo(1)"),
                                                                            ("typeahead", "1)")]
    assert host.calls == ["x = "] and not host.cancelled_at


async def test_the_worker_stops_a_suggestion_the_typing_left(tmp_path):
    host = GatedHost(text="bar(1)")
    svc = service(tmp_path, host)
    first = asyncio.ensure_future(svc.complete(request(prefix="x = ", suffix="\n")))
    await host.advance(1)  # it made "b"
    typed = asyncio.ensure_future(svc.complete(request(prefix="x = bo", suffix="\n")))  # "bo": still may be
    await host.advance(1)  # it makes "ba": the user typed "bo", so the worker cancels it
    assert await first is None and host.cancelled_at == [2]
    await host.advance(len("bar(1)"))
    assert (await typed).text == "bar(1)" and host.calls == ["x = ", "x = bo"]


def test_a_superseded_prefill_keeps_the_lines_above_the_cursor_for_the_next_keystroke(tmp_path):
    """Typing cancels each keystroke's prefill before it ends; the part of its prompt the next keystrokes share
    (FimPrompt.stable: up to the lines above the cursor) is prefilled anyway, so a cold file's prompt gets into the
    cache while the user types, and only a closed document (or a cursor that left those lines) stops it."""
    import tiny
    from test_service import loaded_host

    from specdec.prompts import fim

    host, settings = loaded_host(tiny.saved_pair(tmp_path), strategy="plain")
    tok = host.tokenizer()
    above = "".join(f"value_{i} = compute({i})\n" for i in range(30))
    typing = [request(prefix=above + "x = va" + "l" * n, suffix="\nprint(x)\n") for n in range(3)]
    prompts = [fim.build(tok, host.completer.template, r.completion.prefix, r.completion.suffix, None, 1024, 64)
               for r in typing]
    assert prompts[0].stable > len(tok.encode(above)) - 4
    assert all(p.ids[: prompts[0].stable] == prompts[0].ids[: prompts[0].stable] for p in prompts)
    superseded = CancelToken()
    superseded.cancel()
    assert not host.executor.submit(host.prefill, typing[0], settings, superseded, CancelToken()).result(60)
    target = host.completer.session.target
    assert target.tokens[: prompts[0].stable] == prompts[0].ids[: prompts[0].stable]
    assert len(target.tokens) == prompts[0].stable  # and nothing past it
    host.executor.submit(host.completer.session.reset).result(60)
    closed = CancelToken()
    closed.cancel()
    assert not host.executor.submit(host.prefill, typing[1], settings, superseded, closed).result(60)
    assert host.completer.session.target.tokens == []
