"""Which forward a target gets (`--forward` / the `forward` setting): native where a Qwen2 GGUF runs on the
native forward here, transformers otherwise or when asked; native where it cannot run is a one-line error
naming why. A native target loads from the GGUF alone: its tokenizer from the file, no bf16 conversion."""

import argparse

import pytest
from native_models import hf_model

import tiny
from gguf_files import write_qwen2_gguf, write_tiny_gguf
from specdec.errors import SpecdecError
from specdec.native.loading import choose, why_not_native


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "tiny-qwen2.gguf"
    write_qwen2_gguf(hf_model(), path, tokenizer=tiny.tokenizer())
    return path


def native_runs() -> str:
    """'' where W4A8 and the native ops run here, else why not."""
    from specdec.models import w4a8
    from specdec.native.layers import ops_available, ops_unavailable_reason

    if w4a8.load() is None:
        return w4a8.unavailable_reason()
    return "" if ops_available() else ops_unavailable_reason()


def test_transformers_is_never_native(gguf):
    assert choose("transformers", str(gguf)) is None


def test_what_cannot_run_natively_says_why(gguf, tmp_path):
    assert "CPU" in why_not_native(str(gguf), device="cuda")[0]
    assert "targetQuant" in why_not_native(str(gguf), target_quant="none")[0]
    partial = tmp_path / "linears-only.gguf"  # a GGUF without the metadata and norms a model needs
    write_tiny_gguf(tiny.model(hidden=256), partial)
    reason, _ = why_not_native(str(partial))
    assert "lacks" in reason and choose("auto", str(partial)) is None
    with pytest.raises(SpecdecError, match="--forward native cannot run"):
        choose("native", str(partial))
    directory = tiny.save(tmp_path)  # a float checkpoint: transformers' business
    assert "not made from a GGUF" in why_not_native(str(directory))[0]
    with pytest.raises(SpecdecError, match="unknown forward"):
        choose("fastest", str(gguf))


def test_a_qwen2_gguf_loads_natively_where_it_can_run(gguf, tmp_path):
    from specdec.models.loading import load_pair

    reason = native_runs()
    if reason:
        assert choose("auto", str(gguf)) is None
        with pytest.raises(SpecdecError, match="cannot run"):
            choose("native", str(gguf))
        pytest.skip(f"the native forward cannot run here: {reason}")
    pair = load_pair(str(gguf), None, target_quant="auto", forward="native")
    from specdec.native.lm import NativeModel

    assert isinstance(pair.target.model, NativeModel) and pair.target_quant == "int4"
    assert pair.target.tokenizer.get_vocab() == tiny.tokenizer().get_vocab()  # built from the GGUF's keys
    assert not list(tmp_path.glob("**/*.safetensors"))  # nothing converted
    assert pair.target_identity()["quantization"] == "int4:native"
    from specdec.engine.session import GenerationConfig
    from specdec.engine.strategies import make_session

    session = make_session(pair.target.model, pair.target.tokenizer, "lookup")
    out = session.generate(pair.target.tokenizer.encode("def add(a, b):\n    return a"), GenerationConfig(8))
    assert out.stats.target_passes >= 1 and out.stop_reason in ("eos", "max_tokens")


def test_the_flag_and_the_setting():
    from lsp_server.settings import Settings, SettingsError
    from specdec.models.commands import add_model_args

    parser = argparse.ArgumentParser()
    add_model_args(parser)
    assert parser.parse_args([]).forward == "auto"
    assert parser.parse_args(["--forward", "transformers"]).forward == "transformers"
    with pytest.raises(SystemExit):
        parser.parse_args(["--forward", "fast"])
    settings = Settings()
    assert settings.forward == "auto" and settings.models_differ(settings.update({"forward": "native"}))
    with pytest.raises(SettingsError, match="forward must be one of"):
        settings.update({"forward": "fast"})
