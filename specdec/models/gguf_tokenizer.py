"""A tokenizer built from a GGUF's own tokenizer.ggml.* keys (the native forward's, a conversion's), with the special
tokens a code model's FIM needs.

transformers builds a byte-level BPE vocabulary from a GGUF by spelling every token in GPT-2's byte alphabet,
and skips a CONTROL token written in other characters as a mislabel. DeepSeek-Coder's specials are such tokens
(`<｜fim▁begin｜>`, `<｜end▁of▁sentence｜>`: llama.cpp's converter marks `<｜...｜>` as control), so its FIM
markers would come back as byte spellings no prompt can name. Here each such token gets its own text back at
its own id, as a special token, as the model's tokenizer.json has it. Files without such tokens (Qwen's) are
served as transformers builds them.
"""

from __future__ import annotations

import json
from pathlib import Path

CONTROL = 3  # llama.cpp's token type of a control (special) token


def from_gguf(gguf: Path):
    """The tokenizer the GGUF describes (transformers' build, its control tokens restored)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    restored = _restore_control_tokens(tokenizer, gguf)
    return tokenizer if restored is None else restored


def _control_tokens(gguf: Path) -> dict[int, str]:
    """id -> text of the byte-level file's control tokens written outside the byte alphabet (transformers' own
    metadata reader: gguf's takes seconds over a 150k-token vocabulary)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.integrations.gguf.reader import read_gguf_metadata

    metadata, _ = read_gguf_metadata(str(gguf))  # string arrays left as counts: no vocabulary read yet
    kinds = metadata.get("tokenizer.ggml.token_type")
    if metadata.get("tokenizer.ggml.model") != "gpt2" or kinds is None or CONTROL not in set(kinds):
        return {}
    tokens = read_gguf_metadata(str(gguf), ("tokenizer.ggml.tokens",))[0]["tokenizer.ggml.tokens"]
    alphabet = set(bytes_to_unicode().values())
    return {i: text for i, (text, kind) in enumerate(zip(tokens, kinds))
            if kind == CONTROL and not set(text) <= alphabet}


def _restore_control_tokens(tokenizer, gguf: Path):
    """A copy of tokenizer whose vocabulary holds each control token's text at its id (a special token), or None
    when there is nothing to restore."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    control = _control_tokens(gguf)
    if not control:
        return None
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    by_id = {i: text for text, i in vocab.items()}
    spelling = bytes_to_unicode()
    in_merges = {part for merge in state["model"].get("merges", [])
                 for part in (merge.split(" ") if isinstance(merge, str) else merge)}
    added = {entry["id"] for entry in state["added_tokens"]}
    for i, text in control.items():
        spelled = "".join(spelling[b] for b in text.encode("utf-8"))
        if by_id.get(i) != spelled or spelled in in_merges or i in added or text in vocab:
            continue  # not the byte spelling transformers made, or one the merges build on: leave it
        del vocab[spelled]
        vocab[text] = i
        state["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    state["added_tokens"].sort(key=lambda entry: entry["id"])
    specials = {name: getattr(tokenizer, name) for name in ("bos_token", "eos_token", "unk_token", "pad_token")
                if getattr(tokenizer, name, None) is not None}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)), **specials)
