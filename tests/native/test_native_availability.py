"""Where the native ops cannot run, available() is False with a one-line reason and nothing raises: the model
keeps the transformers path. These run on every machine (no build needed for the refusals)."""

import os
import subprocess
import sys

import pytest

from specdec.native import build, ops


@pytest.fixture
def fresh_state(monkeypatch):
    """A loader that has not answered yet in this process (the real answer comes back afterwards)."""
    monkeypatch.setattr(ops, "_state", {})


def test_not_x86_64_is_unavailable_with_the_reason(fresh_state, monkeypatch):
    monkeypatch.setattr(ops.platform, "machine", lambda: "aarch64")
    assert ops.available() is False
    assert ops.unavailable_reason() == "not an x86-64 CPU (aarch64)"
    with pytest.raises(RuntimeError, match="unavailable: not an x86-64 CPU"):
        ops.rms_norm(None, None, 1e-6)


def test_no_compiler_is_unavailable_with_the_reason(fresh_state, monkeypatch):
    monkeypatch.setattr(ops.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert ops.available() is False
    assert ops.unavailable_reason() == "no C++ compiler (c++)"


def test_a_failed_build_is_unavailable_with_the_reason(fresh_state, monkeypatch):
    monkeypatch.setattr(ops.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "load_extension", lambda *a, **k: build.Loaded(None, "its build failed (boom)"))
    assert ops.available() is False
    assert ops.unavailable_reason() == "its build failed (boom)"


@pytest.mark.skipif(not ops.available(), reason=f"native ops unavailable: {ops.unavailable_reason()}")
def test_an_unknown_isa_in_the_environment_is_ignored_with_a_warning():
    code = ("import logging; logging.basicConfig(); from specdec.native import ops; "
            "print(ops.available(), ops.isa() == ops.cpu_isa())")
    env = {**os.environ, "SPECDEC_NATIVE_ISA": "sse9"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
    assert "SPECDEC_NATIVE_ISA=sse9 ignored" in done.stderr

