"""`specdec complete --engine KIND --engine-url URL` against the fake engines: the completion, the engine's
speculation in --json, one line and no key when the engine fails; the flags' checks."""

import json

import pytest

from specdec.cli import main
from tests.fake_engines import FakeEngine

KEY = "sk-cli-secret-5150"


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "calc.py"
    path.write_text("def add(a, b):\n    \n")
    return path


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_complete_through_an_engine(source, capsys, monkeypatch, kind):
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", KEY)
    with FakeEngine(kind, ["return", " a", " +", " b"]) as engine:
        rc = main(["complete", str(source), "--line", "2", "--col", "5", "--engine", kind, "--engine-url",
                   engine.url, "--json", "--max-new-tokens", "12"])
        post = engine.wait_post()
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["text"] == "return a + b"
    assert out["stats"] | {"seconds": 0} == {"engine": kind, "speculation": "reported", "target_passes": 2,
                                             "drafted": 8, "accepted": 2, "acceptance_rate": 0.25,
                                             "tokens_per_pass": 2.0, "new_tokens": 4, "seconds": 0,
                                             "stop_reason": "eos"}
    assert post["headers"]["Authorization"] == f"Bearer {KEY}"
    assert (post["body"].get("n_predict") or post["body"].get("max_tokens")
            or post["body"]["sampling_params"]["max_new_tokens"]) == 12


def test_complete_engine_failure_is_one_line_without_the_key(source, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", KEY)
    with FakeEngine("vllm", status=401) as engine:
        rc = main(["complete", str(source), "--line", "2", "--col", "5", "--engine", "vllm", "--engine-url",
                   engine.url])
    captured = capsys.readouterr()
    assert rc != 0 and captured.out == ""
    assert "HTTP 401" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert KEY not in captured.err and "Traceback" not in captured.err


@pytest.mark.parametrize("flags,words", [(["--engine", "vllm"], "needs --engine-url"),
                                         (["--engine", "sglang", "--engine-url", "ftp://x"], "must be http"),
                                         (["--engine-url", "http://127.0.0.1:1"], "needs --engine llama-server")])
def test_engine_flags_refused_in_one_line(source, capsys, flags, words):
    rc = main(["complete", str(source), "--line", "2", "--col", "5", *flags])
    err = capsys.readouterr().err
    assert rc != 0 and words in err and len(err.strip().splitlines()) == 1


# -- issue #52: misbehaving engines and paths, one line each ----------------------------------------------------------

def _complete(source, kind: str, url: str, *flags) -> int:
    return main(["complete", str(source), "--line", "2", "--col", "5", "--engine", kind, "--engine-url", url, *flags])


def _one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_json_nested_200000_deep_is_one_line(source, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", KEY)
    with FakeEngine("vllm", raw=[b"data: " + b"[" * 200_000 + b"]" * 200_000 + b"\n\n"]) as engine:
        rc = _complete(source, "vllm", engine.url)
    err = _one_line(capsys.readouterr().err)
    assert rc == 2 and "not JSON" in err


def test_a_401_echoing_the_key_at_the_cut_leaves_no_part_of_it(source, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", KEY)
    echo = "x" * (200 - len("Authorization: Bearer ") - 12) + f"Authorization: Bearer {KEY} rest"
    with FakeEngine("vllm", status=401, status_body=echo.encode()) as engine:
        rc = _complete(source, "vllm", engine.url)
    err = _one_line(capsys.readouterr().err)
    assert rc == 2 and "HTTP 401" in err and KEY[:4] not in err


@pytest.mark.parametrize("served, words", [("vllm", "HTTP 404"), ("llama-server", "HTTP 500")])
def test_the_engines_own_answer_not_did_not_answer(source, capsys, served, words):
    replies = {"/props": (500, b"Internal Server Error", "text/plain")} if served == "llama-server" else {}
    with FakeEngine(served, replies=replies) as engine:  # --engine llama-server at a vLLM: /props is 404
        rc = _complete(source, "llama-server", engine.url)
    err = _one_line(capsys.readouterr().err)
    assert rc == 2 and words in err and "did not answer" not in err


@pytest.mark.parametrize("url, words", [("http://a..b:1/", "not a host name"),
                                        ("http://127.0.0.1:1/a\x00b", "control characters"),
                                        ("http://" + "h" * 100_000 + ":1", "at most 2048 characters"),
                                        ("http://me:hunter2@127.0.0.1:1", "must not hold a user or password")])
def test_unusable_urls_refused_in_one_short_line(source, capsys, url, words):
    rc = _complete(source, "vllm", url)
    err = _one_line(capsys.readouterr().err)
    assert rc == 2 and words in err and len(err) < 300 and "hunter2" not in err


@pytest.mark.parametrize("where", ["folder", "missing", "full"])
def test_trace_json_path_that_cannot_be_written_is_one_line(source, capsys, monkeypatch, tmp_path, where):
    import os

    path = {"folder": str(tmp_path), "missing": str(tmp_path / "no" / "t.json"), "full": "/dev/full"}[where]
    if where == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with FakeEngine("llama-server", ["return a"]) as engine:
        rc = _complete(source, "llama-server", engine.url, "--trace-json", path)
        posts = len(engine.posts)
    err = _one_line(capsys.readouterr().err)
    assert rc == 2 and "--trace-json" in err
    assert posts == (1 if where == "full" else 0)  # a folder or a missing one is refused before the engine is asked


def test_an_engine_slow_to_its_first_byte_completes_with_the_default_bounds(source, capsys):
    """A CPU llama-server evaluates the whole prompt before its first byte: longer than the 8 s between two pieces,
    within the 15 s first-byte bound."""
    with FakeEngine("llama-server", ["return", " a"], first_delay_s=9.0) as engine:
        rc = _complete(source, "llama-server", engine.url, "--json")
    assert rc == 0 and json.loads(capsys.readouterr().out)["text"] == "return a"


def test_engine_bound_flags(source, capsys):
    with FakeEngine("vllm", ["return", " a"], stall_after=0) as engine:
        rc = _complete(source, "vllm", engine.url, "--engine-first-byte-seconds", "0.5")
    assert rc == 2 and "no answer within 0.5 s" in _one_line(capsys.readouterr().err)
    rc = _complete(source, "vllm", "http://127.0.0.1:1", "--engine-first-byte-seconds", "30")
    err = _one_line(capsys.readouterr().err)
    assert rc == 2 and "--engine-first-byte-seconds (30) must not exceed --engine-total-seconds (20)" in err
    rc = main(["complete", str(source), "--line", "2", "--col", "5", "--engine-stall-seconds", "3"])
    assert rc == 2 and "--engine-stall-seconds needs --engine" in _one_line(capsys.readouterr().err)


def test_serve_engine_bound_flags_are_base_settings():
    import argparse

    from lsp_server.commands import engine_settings
    from specdec.backends.remote.cli import add_engine_args
    from specdec.errors import SpecdecError

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    settings = engine_settings(parser.parse_args(["--engine", "vllm", "--engine-url", "http://127.0.0.1:1",
                                                  "--engine-first-byte-seconds", "40", "--engine-total-seconds", "60"]))
    assert (settings.engine_first_byte_seconds, settings.engine_total_seconds) == (40.0, 60.0)
    with pytest.raises(SpecdecError, match="--engine-stall-seconds must be"):
        engine_settings(parser.parse_args(["--engine-stall-seconds", "0"]))
