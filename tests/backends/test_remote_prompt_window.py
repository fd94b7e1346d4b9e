"""The prefix and suffix a remote engine gets are the window the local prompt holds (fim.window under
maxPrefixTokens / maxSuffixTokens, in the target's tokens once its tokenizer is built here; the character estimate
until then), and a GGUF's tokenizer is built once and read from the cache after."""

from __future__ import annotations

import pytest

import tiny
from gguf_files import write_qwen2_gguf
from lsp_server.settings import Settings
from specdec.backends import make_backend
from specdec.backends.remote import tokens
from specdec.backends.remote.tokens import ESTIMATE, TokenCounter, target_tokenizer
from specdec.prompts import fim
from tests.backends.test_remote_engines import PIECES, Request
from tests.fake_engines import FakeEngine

GREEK = "".join(f"λόγος_{i} = ἀριθμός_{i} + μέτρον\n" for i in range(40))  # ~2 tokens a character, not 1/3
CODE = "".join(f"value_{i} = compute(value_{i - 1}, {i})\n" for i in range(1, 200))
TYPED = "    total = value_1 +"
SUFFIX = "".join(f"    check(τιμή_{i})\n" for i in range(60))
PATH = "src/calc.py"


def sent(kind: str, body: dict) -> tuple[str, str]:
    """(prefix, suffix) as the engine got them: llama-server's pieces, or read back out of the raw FIM prompt."""
    if kind == "llama-server":
        return body["input_prefix"] + body["prompt"], body["input_suffix"]
    prompt = body["prompt"] if kind == "vllm" else body["text"]
    head = f"<|file_sep|>{PATH}\n<|fim_prefix|>"
    assert prompt.startswith(head) and prompt.endswith("<|fim_middle|>")
    prefix, suffix = prompt[len(head):-len("<|fim_middle|>")].split("<|fim_suffix|>")
    return prefix, suffix


def completed(kind: str, settings: dict, prefix: str, suffix: str, monkeypatch, build_first: bool = True):
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", "k")
    with FakeEngine(kind, PIECES) as engine:
        backend = make_backend(kind, engine.url)
        backend.load(Settings().update({"engine": kind, "engineUrl": engine.url, **settings}))
        if build_first:
            backend.token_counter()  # as RemoteHost.load does on the server's loading thread
        backend.complete(Request(prefix=prefix, suffix=suffix, path=PATH))
        return backend, engine.wait_post()["body"]


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_the_engine_gets_the_local_prompts_window_in_the_targets_tokens(target, monkeypatch, kind):
    tokenizer, why = target_tokenizer(str(target))
    assert tokenizer is not None, why
    prefix, suffix = GREEK + CODE + TYPED, SUFFIX
    backend, body = completed(kind, {"target": str(target), "maxPrefixTokens": 200, "maxSuffixTokens": 40},
                              prefix, suffix, monkeypatch)
    assert backend.token_counter().exact
    kept_prefix, kept_suffix = sent(kind, body)
    assert (kept_prefix, kept_suffix) == fim.window(tokenizer, prefix, suffix, 200, 40)
    # ... which is the text of the local prompt's own prefix and suffix ids
    local = fim.build(tokenizer, fim.detect(tokenizer), prefix, suffix, None, 200, 40)
    prefix_ids = local.ids[1:1 + local.prefix_tokens]
    suffix_ids = local.ids[2 + local.prefix_tokens:-1]
    assert (tokenizer.decode(prefix_ids), tokenizer.decode(suffix_ids)) == (kept_prefix, kept_suffix)
    assert tokenizer.encode(kept_prefix, add_special_tokens=False) == prefix_ids  # whole lines: token for token
    assert prefix.endswith(kept_prefix) and kept_prefix.startswith("value_") and suffix.startswith(kept_suffix)
    if kind == "llama-server":
        assert body["prompt"] == TYPED and body["input_prefix"].endswith("\n")  # split at the cursor's line


@pytest.mark.parametrize("kind", ["llama-server", "vllm"])
def test_budgets_the_character_estimate_gets_wrong_are_held(target, monkeypatch, kind):
    """Greek identifiers cost ~2 tokens a character: 3 characters a token would send six times the budget."""
    tokenizer, _ = target_tokenizer(str(target))
    prefix, suffix = CODE + GREEK + "ὄνομα = ", SUFFIX
    estimated = TokenCounter().window(prefix, suffix, 120, 30)
    assert len(tokenizer.encode(estimated[0], add_special_tokens=False)) > 2 * 120  # the estimate's cut: too much
    assert len(tokenizer.encode(estimated[1], add_special_tokens=False)) > 2 * 30
    _, body = completed(kind, {"target": str(target), "maxPrefixTokens": 120, "maxSuffixTokens": 30}, prefix, suffix,
                        monkeypatch)
    kept_prefix, kept_suffix = sent(kind, body)
    assert len(tokenizer.encode(kept_prefix, add_special_tokens=False)) <= 120
    assert 30 - 3 <= len(tokenizer.encode(kept_suffix, add_special_tokens=False)) <= 30
    # the budget's last token falls inside a Greek letter's bytes: that letter is left out, never sent as U+FFFD
    assert suffix.startswith(kept_suffix) and "\ufffd" not in kept_suffix
    assert kept_prefix.startswith("λόγος_") and prefix[:-len(kept_prefix)].endswith("\n")  # whole lines


def test_without_a_tokenizer_the_window_is_the_same_rule_at_the_estimate(tmp_path, monkeypatch):
    prefix, suffix = CODE + TYPED, SUFFIX
    _, body = completed("vllm", {"target": str(tmp_path / "nowhere"), "maxPrefixTokens": 100, "maxSuffixTokens": 20},
                        prefix, suffix, monkeypatch)
    kept_prefix, kept_suffix = sent("vllm", body)
    assert (kept_prefix, kept_suffix) == fim.window(ESTIMATE, prefix, suffix, 100, 20)
    assert len(kept_suffix) == 20 * tokens.CHARS_PER_TOKEN and len(kept_prefix) <= 100 * tokens.CHARS_PER_TOKEN
    assert prefix[:-len(kept_prefix)].endswith("\n")  # whole lines above the cursor, as the local prompt's
    # the cut stays put while the user types on: the head of the prompt (the engine's prefix cache) holds
    _, typed_on = completed("vllm", {"target": str(tmp_path / "nowhere"), "maxPrefixTokens": 100,
                                     "maxSuffixTokens": 20}, prefix + " value_2", suffix, monkeypatch)
    assert sent("vllm", typed_on)[0] == kept_prefix + " value_2"


def test_while_the_tokenizer_is_being_built_a_completion_uses_the_estimate(target, monkeypatch):
    """A completion never waits for the tokenizer (the server builds it on its loading thread)."""
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", "k")
    prefix, suffix = CODE + TYPED, SUFFIX
    with FakeEngine("llama-server", PIECES) as engine:
        backend = make_backend("llama-server", engine.url)
        backend.load(Settings().update({"engine": "llama-server", "engineUrl": engine.url, "target": str(target),
                                        "maxPrefixTokens": 100, "maxSuffixTokens": 20}))
        with backend._counter_lock:  # what the loading thread holds while it builds
            backend.complete(Request(prefix=prefix, suffix=suffix, path=PATH))
            during = sent("llama-server", engine.wait_post()["body"])
        backend.token_counter()
        backend.complete(Request(prefix=prefix, suffix=suffix, path=PATH))
        after = sent("llama-server", engine.wait_post()["body"])
    tokenizer, _ = target_tokenizer(str(target))
    assert during == fim.window(ESTIMATE, prefix, suffix, 100, 20)
    assert after == fim.window(tokenizer, prefix, suffix, 100, 20) != during


# -- the GGUF's tokenizer, built once ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    tokenizer = tiny.tokenizer()
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    write_qwen2_gguf(tiny.model(vocab_size=len(tokenizer), layers=1, hidden=256), path, tokenizer=tokenizer)
    return path


def test_a_ggufs_tokenizer_is_built_once_and_read_from_the_cache_after(gguf, monkeypatch):
    from specdec.models import gguf_tokenizer
    from specdec.paths import cache_dir

    kept = cache_dir() / "models" / "someone-elses-model.bin"  # the cache's other files are left alone
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_bytes(b"weights")
    built = []
    from_gguf = gguf_tokenizer.from_gguf
    monkeypatch.setattr(gguf_tokenizer, "from_gguf", lambda path: built.append(path) or from_gguf(path))
    first, why = target_tokenizer(str(gguf))  # a bare GGUF as target
    assert first is not None, why
    assert built == [gguf]
    folder = tokens.cached_tokenizer_dir(gguf)
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    assert folder.parent == cache_dir() / "tokenizers"

    monkeypatch.setattr(gguf_tokenizer, "from_gguf", lambda path: pytest.fail("built again: the cache was not read"))
    second, why = target_tokenizer(str(gguf))
    assert second is not None, why
    text = "<|fim_prefix|>def add(a, b):\n    return a + b<|fim_suffix|>\n<|fim_middle|>λόγος"
    assert second.encode(text, add_special_tokens=False) == first.encode(text, add_special_tokens=False)
    assert second.get_vocab() == first.get_vocab()
    assert (second.eos_token, second.pad_token) == (first.eos_token, first.pad_token) == ("<|endoftext|>",
                                                                                         "<|fim_pad|>")
    assert set(second.all_special_tokens) == set(first.all_special_tokens)
    assert fim.detect(second).family == "qwen" and fim.stop_token_ids(second, fim.detect(second)) == \
        fim.stop_token_ids(first, fim.detect(first))
    assert kept.read_bytes() == b"weights" and [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_another_gguf_is_another_cache_entry(gguf, tmp_path):
    """Keyed by the file's content: the same bytes elsewhere share the entry, other bytes get their own."""
    copy = tmp_path / "elsewhere" / gguf.name
    copy.parent.mkdir()
    copy.write_bytes(gguf.read_bytes())
    assert tokens.cached_tokenizer_dir(copy) == tokens.cached_tokenizer_dir(gguf)
    other = tmp_path / gguf.name
    data = bytearray(gguf.read_bytes())
    data[-1] ^= 0xFF  # the last byte is sampled (specdec.models.file_digest)
    other.write_bytes(bytes(data))
    assert tokens.cached_tokenizer_dir(other) != tokens.cached_tokenizer_dir(gguf)
