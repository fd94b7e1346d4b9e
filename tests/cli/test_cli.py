"""`specdec complete` and `specdec models` on tiny local models: JSON shape and one-line errors."""

import json
import subprocess
import sys

import pytest

import tiny
from specdec.cli import main


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tiny.saved_pair(root)


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "demo.py"
    path.write_text("def add(a, b):\n    return \n\nprint(add(1, 2))\n")
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("strategy", ["plain", "draft", "lookup", "auto", "repo", "tree"])
def test_complete_json(capsys, models, source, strategy):
    target, draft = models
    code, out, err = run(capsys, "complete", source, "--line", 2, "--col", 12, "--target", target, "--draft", draft,
                         "--strategy", strategy, "--max-new-tokens", 12, "--dtype", "fp32", "--json")
    assert code == 0, err
    result = json.loads(out)
    stats = result["stats"]
    assert {"target_passes", "drafted", "accepted", "acceptance_rate", "tokens_per_pass", "new_tokens",
            "seconds"} <= stats.keys()
    assert isinstance(result["text"], str) and 0 < stats["new_tokens"] <= 12
    if strategy == "plain":
        assert stats["drafted"] == 0 and stats["tokens_per_pass"] == 1.0


def test_speculation_does_not_change_the_text(capsys, models, source):
    target, draft = models
    texts = set()
    (source.parent / "other.py").write_text(source.read_text())  # what `repo` indexes: the file's folder
    for strategy in ("plain", "auto", "repo", "tree"):
        code, out, _ = run(capsys, "complete", source, "--line", 2, "--col", 12, "--target", target, "--draft", draft,
                           "--strategy", strategy, "--max-new-tokens", 16, "--dtype", "fp32", "--draft-quant", "none",
                           "--json")
        texts.add(json.loads(out)["text"])
    assert len(texts) == 1


def test_complete_prints_nothing_of_its_dependencies(models, source):
    """Issue #40 item 4: transformers' deprecations and load bars reached every `specdec complete`'s stderr. In a
    process of its own: transformers logs each deprecation once per process, so in-process runs would hide it.
    `tree` runs the most paths: the target's and the draft model's caches, tree-masked passes."""
    target, draft = models
    run = subprocess.run([sys.executable, "-m", "specdec.cli", "complete", str(source), "--line", "2", "--col", "12",
                          "--target", str(target), "--draft", str(draft), "--strategy", "tree",
                          "--max-new-tokens", "12", "--dtype", "fp32", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["stats"]["new_tokens"] > 0
    assert run.stderr == ""


@pytest.mark.parametrize("line,col,message", [(0, 1, "line 0 is outside"), (9, 1, "line 9 is outside"),
                                              (2, 40, "column 40 is outside line 2")])
def test_bad_positions(capsys, models, source, line, col, message):
    code, out, err = run(capsys, "complete", source, "--line", line, "--col", col, "--target", models[0])
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_missing_and_binary_files(capsys, models, tmp_path):
    code, _, err = run(capsys, "complete", tmp_path / "nope.py", "--line", 1, "--col", 1)
    assert code == 2 and "no such file" in err
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x7fELF\x00\x01\x02")
    code, _, err = run(capsys, "complete", binary, "--line", 1, "--col", 1)
    assert code == 2 and "binary" in err


def test_missing_model_is_one_line(capsys, source):
    code, _, err = run(capsys, "complete", source, "--line", 1, "--col", 1, "--target", "nobody/nothing",
                       "--strategy", "plain")
    assert code == 2 and "not available locally" in err and err.count("\n") == 1


def test_mismatched_tokenizer_refused(capsys, models, source, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    other = tmp_path / "other"
    tiny.model(seed=3, vocab_size=300).save_pretrained(other)
    tiny.tokenizer(vocab_size=300).save_pretrained(other)
    code, _, err = run(capsys, "complete", source, "--line", 2, "--col", 12, "--target", models[0], "--draft", other,
                       "--strategy", "draft")
    assert code == 2 and "do not share a tokenizer" in err


def test_models_list_empty_and_json(capsys):
    code, out, _ = run(capsys, "models", "list")
    assert code == 0 and "no models cached" in out
    code, out, _ = run(capsys, "models", "list", "--json")
    assert json.loads(out) == []


def test_bench_on_local_files_records_what_auto_dtype_resolved_to(capsys, models, tmp_path, monkeypatch):
    """`specdec bench --files` on tiny models: every hole runs every strategy, and the JSON says
    which dtype `--dtype auto` chose on this machine, since the numbers depend on it."""
    from specdec import hardware

    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": False)
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", str(tmp_path / "no-llama-server"))
    code = tmp_path / "lib.py"
    code.write_text("".join(f"def scaled_{i}(value):\n    return value * {i} + offset\n\n" for i in range(30)))
    out = tmp_path / "bench.json"
    status, printed, err = run(capsys, "bench", "--target", models[0], "--draft", models[1], "--strategies",
                             "plain,draft,llama-plain", "--files", code, "--holes", 1, "--max-new-tokens", 6,
                             "--draft-suffix-tokens", 4, "--output", out)
    assert status == 0 and "(float32)" in printed, err
    assert "llama.cpp is not installed: skipping llama-plain" in printed and "pip install" in printed
    result = json.loads(out.read_text())
    assert result["config"]["dtype"] == "auto" and result["target_dtype"] == "float32"
    assert result["config"]["draft_suffix_tokens"] == 4  # the draft read 4 suffix tokens of each prompt
    draft_row = next(r for r in result["rows"] if r["strategy"] == "draft")
    assert 0 < draft_row["draft_prefill_computed"] < draft_row["prefill_computed"]  # the target's: the whole suffix
    assert sorted(r["strategy"] for r in result["rows"]) == ["draft", "plain"]
    assert all(r["new_tokens"] >= 1 and r["equals_plain"] for r in result["rows"])
    # bandwidth: the machine's, measured by the run, and each row's weight bytes x tokens/s (gpt-fast's figure)
    assert "machine memory bandwidth" in printed and "GB/s" in printed
    assert result["machine_bandwidth"]["read_gbps"] > 0
    from specdec.models.loading import load

    model = load(models[0], "fp32").model
    params = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])  # as gpt-fast
    for row in result["rows"]:
        assert row["weight_bytes"] == params and row["peak_rss_mb"] > 0
        assert row["bandwidth_gbps"] == pytest.approx(params * row["tokens_per_second"] / 1e9)


@pytest.mark.parametrize("flag,value,message", [("--max-new-tokens", 0, "--max-new-tokens 0 is out of range"),
                                                ("--max-draft", 0, "--max-draft 0 is out of range"),
                                                ("--temperature", "nan", "--temperature nan is out of range"),
                                                ("--top-p", 0, "--top-p 0.0 is out of range")])
def test_bad_generation_arguments_refused_before_loading(capsys, source, monkeypatch, flag, value, message):
    import specdec.models.loading as loading

    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: pytest.fail("models loaded"))
    code, out, err = run(capsys, "complete", source, "--line", 1, "--col", 1, flag, value)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_bench_draft_suffix_tokens_takes_a_count_or_all(capsys):
    with pytest.raises(SystemExit) as exit:
        run(capsys, "bench", "--draft-suffix-tokens", "-1")
    assert exit.value.code == 2 and "expected a non-negative integer or 'all', got '-1'" in capsys.readouterr().err


def test_directory_is_not_a_missing_file(capsys, tmp_path):
    code, _, err = run(capsys, "complete", tmp_path, "--line", 1, "--col", 1)
    assert code == 2 and "is a directory" in err and err.count("\n") == 1


def test_device_flag(capsys, models, source, tmp_path):
    """`--device` is accepted by every command that runs the engine; a GPU this machine lacks is one line, a
    misspelt device is argparse's refusal, and `--device cpu` runs."""
    import torch

    target, draft = models
    lib = tmp_path / "lib.py"
    lib.write_text("".join(f"def scaled_{i}(value):\n    return value * {i} + offset\n\n" for i in range(30)))
    common = ["--line", 2, "--col", 12, "--target", target, "--draft", draft, "--max-new-tokens", 4, "--dtype",
              "fp32", "--json"]
    code, out, err = run(capsys, "complete", source, *common, "--device", "cpu")
    assert code == 0 and json.loads(out)["stats"]["new_tokens"] >= 1, err
    if not torch.cuda.is_available():
        for command in (["complete", source, *common], ["bench", "--target", target, "--files", lib, "--holes", 1]):
            code, out, err = run(capsys, *command, "--device", "cuda")
            assert code == 2 and "device cuda: this machine has 0 CUDA device(s)" in err and err.count("\n") == 1
    for command in (["complete", source, "--line", 1, "--col", 1], ["bench"], ["finetune", source.parent]):
        with pytest.raises(SystemExit) as exit:
            run(capsys, *command, "--device", "gpu")
        assert exit.value.code == 2 and "argument --device: 'gpu': use one of auto, cpu, cuda" in capsys.readouterr().err


def test_complete_trace_prints_the_marked_completion_and_writes_the_records(capsys, models, source, tmp_path):
    """--trace: the completion, then the trace (markers: stdout is not a terminal here); --trace-json FILE: the
    records, whose tokens decode to the completion."""
    target, draft = models
    out_file = tmp_path / "trace.json"
    common = ["complete", source, "--line", 2, "--col", 12, "--target", target, "--draft", draft, "--strategy", "auto",
              "--max-new-tokens", 12, "--dtype", "fp32"]
    code, out, err = run(capsys, *common, "--trace", "--trace-json", out_file)
    assert code == 0, err
    recorded = json.loads(out_file.read_text())
    assert out.startswith(recorded["text"]) and "\ntrace: strategy auto, draft adapter none," in out
    assert "\x1b[" not in out and "pass  drafted" in out and "\nall " in out
    # the engine's text: its tokens' decoding, cut where the stop rules cut (inside the last token, at a line break)
    assert tiny.tokenizer().decode(recorded["tokens"]).startswith(recorded["text"]) and recorded["probabilities"]
    assert len(recorded["passes"]) == recorded["summary"]["target_passes"] and recorded["passes"][0]["prefill"]
    assert all(len(p["p"]) == len(p["q"]) == len(p["tokens"]) for p in recorded["passes"])
    code, out, err = run(capsys, *common, "--json", "--trace")  # stdout stays one JSON line; the trace goes to stderr
    assert code == 0 and json.loads(out)["text"] == recorded["text"] and "trace: strategy auto" in err
    code, _, err = run(capsys, *common, "--trace-json", tmp_path / "nowhere" / "trace.json")
    assert code != 0 and "--trace-json" in err and "does not exist" in err and len(err.strip().splitlines()) == 1


def test_complete_answers_what_the_server_shows_at_the_cursor(capsys, models, tmp_path, monkeypatch):
    """Issue #49 item 3: `specdec complete` stops and trims by the completion wing's rules (specdec/completion/syntax.py)
    as the server does, so the command and the editor answer alike. The cursor is at the indentation of a line of
    code: the model's line is cut at its line break (the single-line stop) and `finalize` puts the break and the
    indentation back (a new line above the code). The engine's raw text, which the command printed before, is not
    that suggestion. The file is named relative to the workspace (the prompt names it), as the server names it."""
    import asyncio

    from lsp_server.hosts import ModelHost
    from lsp_server.metrics import MetricsStore
    from lsp_server.service import CompletionService, EditorRequest
    from lsp_server.settings import Settings
    from specdec.completion.window import window
    from specdec.engine.session import GenerationConfig

    target, _ = models
    text = "def add(a, b):\n    return a + b\n"
    (tmp_path / "demo.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "complete", "demo.py", "--line", 2, "--col", 5, "--target", target, "--strategy",
                         "plain", "--max-new-tokens", 32, "--dtype", "fp32", "--json")
    assert code == 0, err
    result = json.loads(out)

    host = ModelHost()
    settings = Settings().update({"target": str(target), "draft": "", "strategy": "plain", "dtype": "fp32",
                                  "adapters": False, "maxNewTokens": 32, "maxSuffixTokens": 256, "debounceMs": 0})
    host.load(settings)
    assert host.state == "ready", host.error
    prefix, suffix = window(text, text.index("return"))  # what lsp_server/cursor.py sends for that position
    request = EditorRequest.at((tmp_path / "demo.py").as_uri(), "python", str(tmp_path), prefix, suffix,
                               invoked=True, path="demo.py")
    suggestion = asyncio.run(CompletionService(host, MetricsStore(tmp_path / "m.jsonl"), settings).complete(request))
    assert suggestion is not None and suggestion.source == "model"
    assert result["text"] == suggestion.text and result["stats"]["stop_reason"] == "stop"
    raw = host.executor.submit(host.completer.complete, prefix, suffix, GenerationConfig(32), "demo.py").result(60)
    assert "\n" in raw.text and suggestion.text.endswith("\n    ") and raw.text != suggestion.text
