"""FIM prompts: family detection, token budgets, and a cut point that survives typing."""

import pytest

from specdec.prompts import fim
from specdec.errors import SpecdecError


def test_detects_qwen_family_and_stop_tokens(tok):
    template = fim.detect(tok)
    assert template.family == "qwen"
    vocab = tok.get_vocab()
    assert {vocab["<|endoftext|>"], vocab["<|file_sep|>"], vocab["<|fim_pad|>"]} <= fim.stop_token_ids(tok, template)


def test_detects_other_families():
    import tiny

    star = tiny.tokenizer(extra_specials=("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
    # the qwen tokens are also present in the tiny vocab, so an explicit override picks the family
    assert fim.detect(star, "starcoder").family == "starcoder"
    with pytest.raises(SpecdecError, match="unknown FIM family"):
        fim.detect(star, "nope")


def test_prompt_layout_psm(tok):
    template = fim.detect(tok)
    p = fim.build(tok, template, "def f(x):\n    return ", "\n\nprint(f(2))\n")
    vocab = tok.get_vocab()
    ids = p.ids
    assert ids[0] == vocab["<|fim_prefix|>"] and ids[-1] == vocab["<|fim_middle|>"]
    cut = ids.index(vocab["<|fim_suffix|>"])
    assert tok.decode(ids[1:cut]) == "def f(x):\n    return "
    assert tok.decode(ids[cut + 1 : -1]) == "\n\nprint(f(2))\n"


def test_budgets_are_respected(tok):
    template = fim.detect(tok)
    prefix = "".join(f"value_{i} = compute({i})\n" for i in range(400))
    suffix = "".join(f"print(value_{i})\n" for i in range(400))
    p = fim.build(tok, template, prefix, suffix, max_prefix_tokens=100, max_suffix_tokens=30)
    assert p.prefix_tokens <= 100 and p.suffix_tokens == 30
    assert len(p.ids) == p.prefix_tokens + p.suffix_tokens + 3
    # the prefix starts on a whole line and ends at the cursor
    assert tok.decode(p.ids[1 : 1 + p.prefix_tokens]).startswith("value_")


def test_prefix_cut_is_stable_while_typing(tok):
    """Consecutive keystrokes keep the prompt's start identical, so the KV cache stays valid."""
    template = fim.detect(tok)
    prefix = "".join(f"item_{i} = make({i})\n" for i in range(300)) + "result = "
    base = fim.build(tok, template, prefix, "", max_prefix_tokens=200).ids
    for typed in ["m", "ma", "mak", "make(", "make(1"]:
        ids = fim.build(tok, template, prefix + typed, "", max_prefix_tokens=200).ids
        shared = next(i for i, (a, b) in enumerate(zip(base + [-1], ids + [-2])) if a != b)
        assert shared >= base.index(tok.get_vocab()["<|fim_suffix|>"]) - 3


def test_huge_file_is_not_tokenized_whole(tok):
    template = fim.detect(tok)
    big = "x = 1\n" * 1_000_000  # 6 MB
    p = fim.build(tok, template, big, big, max_prefix_tokens=64, max_suffix_tokens=16)
    assert p.prefix_tokens <= 64 and p.suffix_tokens <= 16


def test_repo_level_context_then_this_files_header(tok):
    template = fim.detect(tok)
    other = template.file_header.format(path="util.py") + "def helper():\n    pass\n"
    p = fim.build(tok, template, "x = ", "\n", path="main.py", context=other)
    text = tok.decode(p.ids)
    assert text.index("util.py") < text.index("def helper") < text.index("main.py") < text.index("<|fim_prefix|>")


class Spy:
    """The tokenizer, recording how many characters each encode call is handed."""

    def __init__(self, tok):
        self.tok, self.encoded = tok, []

    def encode(self, text, **kwargs):
        self.encoded.append(len(text))
        return self.tok.encode(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_one_enormous_line_is_not_tokenized_whole(tok):
    """Minified code: a single 4 MB line before the cursor, where cutting by whole lines finds no line to cut: no
    tokenizer call sees more than the budget's worth of characters (8 a token), whatever the line's length."""
    spy = Spy(tok)
    p = fim.build(spy, fim.TEMPLATES["qwen"], "ab = cd + " * 400_000, "", max_prefix_tokens=64, max_suffix_tokens=16)
    assert p.prefix_tokens == 64 and spy.encoded and max(spy.encoded) <= 64 * 8


def test_window_is_the_text_the_prompt_holds(tok):
    """What a client sends another server (llama.cpp's /infill) so that it sees what our prompt holds."""
    template = fim.detect(tok)
    prefix = "".join(f"line_{i} = {i}\n" for i in range(200)) + "    total = line_1 +"
    suffix = "".join(f"after_{i}()\n" for i in range(100))
    kept_prefix, kept_suffix = fim.window(tok, prefix, suffix, max_prefix_tokens=120, max_suffix_tokens=20)
    prompt = fim.build(tok, template, prefix, suffix, None, 120, 20)
    assert tok.encode(kept_prefix, add_special_tokens=False) == prompt.ids[1:1 + prompt.prefix_tokens]
    assert tok.encode(kept_suffix, add_special_tokens=False) == prompt.ids[2 + prompt.prefix_tokens:-1]
    assert prefix.endswith(kept_prefix) and kept_prefix.startswith("line_") and suffix.startswith(kept_suffix)
    assert fim.window(tok, "a\nb", "c\n", 120, 20) == ("a\nb", "c\n")  # within budget: all of it


def test_suffix_first_order_keeps_the_cached_prompt_while_typing(tok):
    """fimOrder spm: the text after the cursor comes first, so typing only appends to the prompt before its middle
    marker: two keystrokes' prompts share all but the last tokens (psm: the suffix moves behind every keystroke)."""
    vocab = tok.get_vocab()
    spm = fim.detect(tok, order="spm")
    assert spm.order == "spm" and fim.detect(tok).order == "psm"
    before, after = "def f(x):\n    return x +", "\n\nprint(f(2))\n" * 4
    ids = fim.build(tok, spm, before, after).ids
    assert ids[0] == vocab["<|fim_suffix|>"] and ids[-1] == vocab["<|fim_middle|>"]
    cut = ids.index(vocab["<|fim_prefix|>"])
    assert tok.decode(ids[1:cut]) == after and tok.decode(ids[cut + 1 : -1]) == before

    def shared(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    typed = before + " 1"
    spm_next = fim.build(tok, spm, typed, after).ids
    psm, psm_next = (fim.build(tok, fim.detect(tok), text, after).ids for text in (before, typed))
    assert len(spm_next) - shared(ids, spm_next) <= 4  # the typed tokens and the middle marker
    assert len(psm_next) - shared(psm, psm_next) > len(tok.encode(after, add_special_tokens=False))


def test_an_order_a_family_cannot_write_is_refused(tok):
    with pytest.raises(SpecdecError, match="unknown FIM order"):
        fim.detect(tok, order="pms")
    with pytest.raises(SpecdecError, match="codestral prompts have no middle marker"):
        fim.detect(tok, "codestral", order="psm")
    assert fim.detect(tok, "codestral", order="spm").order == "spm"


def test_the_setting_refuses_an_order_the_family_cannot_write():
    from lsp_server.settings import Settings, SettingsError

    assert Settings().update({"fimOrder": "spm"}).fim_order == "spm"
    with pytest.raises(SettingsError, match="fimOrder 'psm': codestral"):
        Settings().update({"fimFamily": "codestral", "fimOrder": "psm"})
    with pytest.raises(SettingsError, match="fimOrder must be one of"):
        Settings().update({"fimOrder": "middle-first"})
