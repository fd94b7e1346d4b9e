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
