"""The llama.cpp anchor of `specdec bench`: request shape and response parsing against a recorded reply."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.backends import llama_server
from specdec_bench import llama

RECORDED = json.loads((Path(__file__).parent.parent / "data" / "llama_completion.json").read_text())


def test_request_is_greedy_exact_ids_with_the_prompt_cache():
    body = llama_server.completion_request([1, 2, 3], 48)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 48
    assert body["temperature"] == 0 and body["top_k"] == 1 and body["cache_prompt"] and body["return_tokens"]


def test_recorded_response_parses_to_tokens_and_timings():
    response = RECORDED["response"]
    result = llama_server.parse_completion(response, 1.5, stops={151643})
    assert result.tokens == response["tokens"] and len(result.tokens) == 24
    assert result.prompt_tokens == response["timings"]["prompt_n"] and result.seconds == 1.5
    assert result.predicted_ms == pytest.approx(response["timings"]["predicted_ms"])
    cut = llama_server.parse_completion(response, 1.0, stops={response["tokens"][5]})
    assert cut.tokens == response["tokens"][:5]  # our stop ids end the completion, as in our own strategies


def test_speculation_flags_of_this_llama_cpp():
    assert llama.server_args("llama-plain", None) == []
    # b11434 loads -md without drafting unless --spec-type draft-simple names it
    # the sweep's winners (docs/benchmarks.md): llama.cpp's own draft length, 2 draft threads; its default speculation
    assert llama.server_args("llama-draft", Path("d.gguf")) == ["-md", "d.gguf", "--spec-type", "draft-simple",
                                                                "-td", "2"]
    assert llama.server_args("llama-ngram", None) == ["--spec-default"]
    from specdec_bench.llama_sweep import CONFIGS, DRAFT

    assert [a.replace(DRAFT, "d.gguf") for a in CONFIGS["draft-n3-td2"]] == llama.server_args("llama-draft",
                                                                                              Path("d.gguf"))
    assert CONFIGS["spec-default"] == llama.server_args("llama-ngram", None)
    with pytest.raises(ValueError, match="needs the draft"):
        llama.server_args("llama-draft", None)


def test_missing_binary_is_reported_not_guessed(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(tmp_path / "nope"))
    assert llama_server.find_server() is None


@pytest.mark.slow
def test_real_llama_server_completes_the_recorded_prompt():

    binary = llama_server.find_server()
    if binary is None:
        pytest.skip(f"llama.cpp is not installed: {llama_server.INSTALL_HINT}")
    gguf = Path.home() / ".cache/specdec/models/gguf/qwen2.5-coder-1.5b-q4_k_m.gguf"
    with llama_server.LlamaServer(binary, gguf) as server:
        result = server.complete(RECORDED["prompt"], 24, stops=set())
    assert result.tokens == RECORDED["response"]["tokens"]  # greedy: the same tokens as when it was recorded


def test_the_server_process_reports_its_own_peak_rss(tmp_path):
    """The llama.cpp rows show llama-server's peak memory, not the benchmark's (a stand-in server here)."""
    from fake_llama_server import executable

    model = tmp_path / "model.gguf"
    model.write_text("{}")
    with llama_server.LlamaServer(executable(tmp_path), model) as server:
        assert server.peak_rss_mb() > 1  # a Python process at least
    assert server.peak_rss_mb() is None and server.log is None


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_dies_with_the_benchmark_that_started_it_even_when_killed():
    # the parent starts a child the way LlamaServer does, prints its pid and waits; SIGKILL gives it no cleanup
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from specdec.backends.llama_server import die_with_parent\n"
        "child = subprocess.Popen(['sleep', '60'], preexec_fn=die_with_parent())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie (init has not reaped it yet) is dead


# -- issue #40 item 3: an anchor that dies (llama.cpp's AMX repack on some Intel CPUs) ---------------------------
def fake_model(tmp_path, **config) -> Path:
    model = tmp_path / "model.gguf"  # the stand-in's "model" is its config
    model.write_text(json.dumps({"default": [50, 51, 52, 53], **config}))
    return model


@pytest.mark.parametrize("where", ["start", "completion"])
def test_an_anchor_that_dies_with_repacking_runs_again_without_it(tmp_path, where):
    from fake_llama_server import executable

    anchor = llama.LlamaAnchor(executable(tmp_path), fake_model(tmp_path, crash=where))
    try:
        assert anchor.start() and anchor.note == ("repack off" if where == "start" else "")
        result = anchor.complete([1, 2, 3], 3, stops=set())
        assert result is not None and result.tokens == [50, 51, 52]  # the same request, answered after the restart
        assert not anchor.repack and anchor.note == "repack off" and not anchor.failed
        assert "died with SIGILL" in anchor.repack_failure
        assert anchor.server.process.poll() is None
    finally:
        anchor.close()
    assert anchor.server is None


@pytest.mark.parametrize("where", ["start", "completion"])
def test_an_anchor_that_always_dies_says_why(tmp_path, where):
    from fake_llama_server import executable

    anchor = llama.LlamaAnchor(executable(tmp_path), fake_model(tmp_path, crash=where, crash_always=True))
    try:
        if where == "start":
            assert not anchor.start()
        else:
            assert anchor.start() and anchor.complete([1], 2, stops=set()) is None
        assert anchor.failed.startswith("llama-server died with SIGILL") and "(with repacking on and off)" in anchor.failed
        assert "illegal instruction" in anchor.failed  # its last log line
        assert anchor.server is None
    finally:
        anchor.close()


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    import tiny

    root = tmp_path_factory.mktemp("models")
    return tiny.saved_pair(root)


@pytest.mark.parametrize("always", [False, True], ids=["repack-off-works", "always-dies"])
def test_the_benchmark_keeps_its_own_rows_when_the_anchor_dies(tiny_models, tmp_path, monkeypatch, capsys, always):
    """`specdec bench --strategies plain,draft,llama-plain` on a llama-server that dies with SIGILL: retried
    without repacking and marked so in the table, or skipped with the reason; our rows print either way."""
    from fake_llama_server import executable

    from specdec.cli import main
    from specdec.models import store

    model = fake_model(tmp_path, crash="start", crash_always=always)
    monkeypatch.setattr(store, "target_gguf", lambda spec: model)
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(executable(tmp_path)))
    code = tmp_path / "lib.py"
    code.write_text("".join(f"def scaled_{i}(value):\n    return value * {i} + offset\n\n" for i in range(30)))
    out = tmp_path / "bench.json"
    status = main(["bench", "--target", str(tiny_models[0]), "--draft", str(tiny_models[1]), "--strategies",
                   "plain,draft,llama-plain", "--files", str(code), "--holes", "1", "--max-new-tokens", "4",
                   "--dtype", "fp32", "--output", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    result = json.loads(out.read_text())
    table = printed[printed.index("\nOverall"):]
    assert [line.split()[0] for line in table.splitlines()[3:5]] == ["plain", "draft"]  # our rows, in the table
    if always:
        assert sorted(r["strategy"] for r in result["rows"]) == ["draft", "plain"]
        assert result["skipped"]["llama-plain"].startswith("llama-server died with SIGILL")
        assert "skipped llama-plain: llama-server died with SIGILL" in table
        assert "llama-plain (repack off)" not in table
    else:
        llama_rows = [r for r in result["rows"] if r["strategy"] == "llama-plain"]
        assert len(llama_rows) == 1 and llama_rows[0]["llama_repack"] is False and llama_rows[0]["new_tokens"] == 4
        assert result["llama"] == {"llama-plain": {"repack": False, "repack_failure": result["llama"]["llama-plain"]
                                                   ["repack_failure"]}} and not result["skipped"]
        assert "died with SIGILL" in result["llama"]["llama-plain"]["repack_failure"]
        assert "\nllama-plain (repack off) " in table
        assert "llama-plain: llama-server ran with weight repacking off (LLAMA_ARG_REPACK=0)" in table


def test_the_llama_draft_row_speculates(tiny_models, tmp_path, monkeypatch, capsys):
    """`specdec bench --strategies plain,llama-draft`: the server is started with the draft and the flag that makes
    this llama.cpp draft with it (the stand-in, like b11434, drafts only under --spec-type), and the row carries
    llama.cpp's draft_n / draft_n_accepted."""
    from fake_llama_server import executable

    from specdec.cli import main
    from specdec.models import store

    argv_log = tmp_path / "argv.json"
    model = fake_model(tmp_path, argv_log=str(argv_log))
    monkeypatch.setattr(store, "target_gguf", lambda spec: model)
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(executable(tmp_path)))
    code = tmp_path / "lib.py"
    code.write_text("".join(f"def scaled_{i}(value):\n    return value * {i} + offset\n\n" for i in range(30)))
    out = tmp_path / "bench.json"
    status = main(["bench", "--target", str(tiny_models[0]), "--draft", str(tiny_models[1]), "--strategies",
                   "plain,llama-draft", "--files", str(code), "--holes", "1", "--max-new-tokens", "4",
                   "--max-draft", "6", "--dtype", "fp32", "--output", str(out)])
    assert status == 0, capsys.readouterr().out
    argv = json.loads(argv_log.read_text())
    assert argv[argv.index("-md") + 1] == str(model) and argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert argv[argv.index("-td") + 1] == "2" and "--spec-draft-n-max" not in argv  # llama.cpp's own length (sweep)
    rows = [r for r in json.loads(out.read_text())["rows"] if r["strategy"] == "llama-draft"]
    assert len(rows) == 1 and rows[0]["drafted"] == 4 and rows[0]["accepted"] == 2
