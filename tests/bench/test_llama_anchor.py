"""llama.cpp's /infill answers through the server's completion rules: the same window, stops, budget and
trimming as ours, against a stand-in llama-server (tests/fake_llama_server.py)."""

import json
import time
from pathlib import Path

import pytest
import tiny
from fake_llama_server import answers_for, start
from humaneval_files import PROBLEMS
from test_humaneval_bench import DocumentCompleter, host_with

from specdec_bench import humaneval_bench
from specdec_bench.llama_anchor import InfillRules
from lsp_server.settings import Settings
from specdec.backends import llama_server
from specdec_bench import humaneval

TAIL = "\n\n\nprint('the file goes on')\n" + "".join(f"x_{i} = {i}\n" for i in range(20))


@pytest.fixture
def rules():
    return InfillRules.load(Settings(), tiny.tokenizer())


def serve(tmp_path, cases: dict[str, str], **extra):
    config = {**answers_for(tiny.tokenizer(), cases), "log": str(tmp_path / "requests.jsonl"), **extra}
    return start(config), Path(config["log"])


def logged(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_humaneval_through_llama_infill_gives_the_texts_our_path_gives(tmp_path, rules):
    tasks = humaneval.single_line_tasks(PROBLEMS)
    # llama.cpp "writes" the true document on from the cursor, as the oracle completer does for our path
    server, log = serve(tmp_path, {t.prefix: t.middle + t.suffix + TAIL for t in tasks}, token_delay_s=0.01)
    try:
        theirs = humaneval_bench.evaluate(None, tasks, Settings(), "llama-infill", 30, log=lambda line: None,
                                          answer=lambda t: rules.complete(server.server_address[1], "python",
                                                                          t.prefix, t.suffix))
    finally:
        server.shutdown()
    ours = humaneval_bench.evaluate(host_with(DocumentCompleter(tasks)), tasks, Settings(), "oracle", 30,
                                    log=lambda line: None)
    assert [r["text"] for r in theirs] == [r["text"] for r in ours]  # same stop rules, same trimming
    assert all(r["passed"] and r["exact"] for r in theirs)
    assert {r["stop_reason"] for r in theirs} == {"stop"}
    time.sleep(0.2)
    requests = logged(log)
    assert len(requests) == len(tasks)
    assert all(r["ended"] == "closed" for r in requests), "the stream goes on after our rules ended it"
    body = requests[0]["body"]
    assert body["n_predict"] == Settings().max_new_tokens and body["stream"] and body["return_tokens"]
    assert body["samplers"] == ["top_k"] and body["top_k"] == 1 and body["n_indent"] == 0
    assert body["t_max_predict_ms"] == 0 and body["cache_prompt"]
    assert body["input_prefix"] + body["prompt"] == tasks[0].prefix
    assert body["input_suffix"] == tasks[0].suffix  # short enough for the suffix budget


def test_a_whole_reply_ends_at_a_stop_token_or_the_budget_as_ours_would(rules):
    tok = tiny.tokenizer()
    ctx, _ = rules.cursor("python", "def f(x):\n    return ", "\n")
    ids = tok.encode("x + 1", add_special_tokens=False)
    stop = tok.get_vocab()["<|file_sep|>"]
    reply = llama_server.InfillReply("", ids + [stop] + ids, "limit", 2 * len(ids) + 1)
    text, reason, kept = rules.answer(ctx, reply)
    assert (text, reason, kept) == ("x + 1", "eos", ids)  # our stop ids, not llama.cpp's, end it
    budget = InfillRules(tok, rules.stop_ids, Settings().update({"maxNewTokens": 2}))
    text, reason, kept = budget.answer(ctx, llama_server.InfillReply("", ids, "limit", len(ids)))
    assert reason == "max_tokens" and kept == ids[:2] and text == tok.decode(ids[:2]).rstrip()
    text, reason, _ = rules.answer(ctx, llama_server.InfillReply("", ids, "eos", len(ids)))
    assert (text, reason) == ("x + 1", "eos")  # llama.cpp ended it first: its reason, in our words


def test_the_window_follows_the_settings_budgets(rules):
    prefix = "".join(f"value_{i} = {i}\n" for i in range(400)) + "total = "
    suffix = "".join(f"print(value_{i})\n" for i in range(200))
    small = InfillRules(rules.tokenizer, rules.stop_ids, Settings().update({"maxPrefixTokens": 64,
                                                                            "maxSuffixTokens": 16}))
    _, local = small.cursor("python", prefix, suffix)
    assert local.prompt == "total = " and prefix.endswith(local.input_prefix + local.prompt)
    assert len(local.input_prefix) < len(prefix) // 10 and local.input_prefix.startswith("value_")
    assert len(rules.tokenizer.encode(local.input_suffix, add_special_tokens=False)) == 16
