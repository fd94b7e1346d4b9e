"""Issue #52 item b: two processes making the same GGUF's cache entry at once (an editor's server and a `specdec
complete`, two editors, one cache folder) both end with the right weights and leave one valid entry, made once.
The bf16 conversion shared its `.partial` folder, so one of two processes failed (or lost the other's files); the
native weights were converted twice, at twice the peak memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tiny
from gguf_files import write_qwen2_gguf
from specdec.paths import models_dir, quantized_dir

TESTS = Path(__file__).resolve().parent.parent
TOKENS = list(range(30, 70))

# Each child waits at a barrier until both have come to the cache (state, never time: a file per child, polled),
# then makes or reads the entry and writes the logits it computes and how many conversions it ran.
CHILD = r"""
import json, os, sys, time
from pathlib import Path
import torch
mode, gguf, out, barrier = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
TOKENS = list(range(30, 70))

def meet():
    (barrier / str(os.getpid())).touch()
    while len(list(barrier.iterdir())) < 2:
        time.sleep(0.02)

conversions = []
if mode == "native":
    from specdec.native import weights_cache
    from specdec.native.lm import NativeModel
    from specdec.native.qwen2 import Qwen2
    real_path, real_read = weights_cache.cache_path, weights_cache.read_qwen2
    weights_cache.cache_path = lambda *a, **k: meet() or real_path(*a, **k)
    weights_cache.read_qwen2 = lambda *a, **k: conversions.append(1) or real_read(*a, **k)
    weights = weights_cache.read_qwen2_cached(gguf)
    logits = NativeModel(Qwen2(weights), 128).new_cached_lm().extend(TOKENS)
else:
    from transformers import AutoModelForCausalLM
    from specdec.models import store
    real_convert = store.convert_gguf
    store.convert_gguf = lambda *a, **k: meet() or real_convert(*a, **k)
    with store.conversion_progress(lambda message, done: conversions.append(1) if done == 0.0 else None):
        folder = store.resolve(str(gguf))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.inference_mode():
        logits = model(torch.tensor([TOKENS])).logits[0]
torch.save(logits, out / f"{os.getpid()}.pt")
(out / f"{os.getpid()}.json").write_text(json.dumps({"conversions": len(conversions)}))
"""


def tiny_gguf(path: Path, tokenizer=None) -> Path:
    """With a tokenizer, its vocabulary (transformers' loader sizes the model by it); else 384 ids, which the
    native output layer's 16-column tiles take."""
    vocab = len(tokenizer) if tokenizer is not None else 384
    write_qwen2_gguf(tiny.model(seed=3, vocab_size=vocab, layers=1, hidden=256), path, tokenizer=tokenizer)
    return path


def run_two(mode: str, gguf: Path, tmp_path: Path) -> list[tuple[torch.Tensor, int]]:
    """Two children making `mode`'s entry at once; (logits, conversions) of each, once both have ended."""
    out, barrier = tmp_path / f"{mode}-out", tmp_path / f"{mode}-barrier"
    out.mkdir()
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, mode, str(gguf), str(out), str(barrier)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    try:
        outputs = [child.communicate(timeout=600)[0].decode(errors="replace") for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    for child, output in zip(children, outputs):
        assert child.returncode == 0, output[-3000:]
    return [(torch.load(out / f"{child.pid}.pt"), json.loads((out / f"{child.pid}.json").read_text())["conversions"])
            for child in children]


def test_two_processes_convert_a_gguf_at_once(tmp_path):
    """The bf16 conversion (a .gguf target on transformers): made once, one folder, the same weights in both."""
    gguf = tiny_gguf(tmp_path / "tiny.gguf", tiny.tokenizer())
    (first, made_a), (second, made_b) = run_two("bf16", gguf, tmp_path)
    assert made_a + made_b == 1 and torch.equal(first, second)
    folders = [p for p in models_dir().iterdir() if p.is_dir()]
    assert len(folders) == 1 and (folders[0] / "config.json").is_file(), folders
    from transformers import AutoModelForCausalLM

    with torch.inference_mode():
        again = AutoModelForCausalLM.from_pretrained(str(folders[0]), dtype=torch.float32)(torch.tensor([TOKENS]))
    assert torch.equal(again.logits[0], first)


def test_two_processes_pack_the_native_weights_at_once(tmp_path, monkeypatch):
    """The native weights cache: packed once, one valid file, both processes' logits those of a fresh conversion."""
    from specdec.models import w4a8

    if w4a8.load() is None:
        pytest.skip(f"the native forward needs W4A8: {w4a8.unavailable_reason()}")
    from specdec.native import gguf_weights, weights_cache

    gguf = tiny_gguf(tmp_path / "tiny.gguf")
    from specdec.native.lm import NativeModel
    from specdec.native.qwen2 import Qwen2

    (first, made_a), (second, made_b) = run_two("native", gguf, tmp_path)
    reference = NativeModel(Qwen2(gguf_weights.read_qwen2(gguf)), 128).new_cached_lm().extend(TOKENS)
    assert made_a + made_b == 1 and torch.equal(first, reference) and torch.equal(second, reference)
    assert [p.name for p in quantized_dir().glob("*.pt")] == [weights_cache.cache_path(gguf).name]
    assert not list(quantized_dir().glob("*.partial"))
    monkeypatch.setattr(weights_cache, "read_qwen2", lambda *a, **k: pytest.fail("converted a third time"))
    assert torch.equal(NativeModel(Qwen2(weights_cache.read_qwen2_cached(gguf)), 128).new_cached_lm().extend(TOKENS),
                       reference)
