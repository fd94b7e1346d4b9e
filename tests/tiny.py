"""Tiny random-init models and a tokenizer built in-process: the fast tier needs no download."""

from __future__ import annotations

import functools

import torch

SPECIALS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|file_sep|>",
            "<|repo_name|>", "<|im_end|>"]

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i)\n",
    "function add(a, b) {\n  return a + b;\n}\n",
    "if (x > 0) { return x; } else { return -x; }\n",
    "import os\nimport sys\n\ndef main():\n    pass\n",
    "fn main() {\n    let x = 5;\n    println!(\"{}\", x);\n}\n",
    "func main() {\n\tfmt.Println(\"hello\")\n}\n",
]


@functools.lru_cache(maxsize=4)
def tokenizer(vocab_size: int = 400, extra_specials: tuple[str, ...] = (), specials: tuple[str, ...] | None = None):
    """specials: instead of Qwen's (the first is the EOS, the last the padding)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    base = SPECIALS if specials is None else list(specials)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=base + list(extra_specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 5, trainer)
    if specials is not None:
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=base[0], pad_token=base[-1])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|fim_pad|>")


def model(seed: int = 0, vocab_size: int | None = None, layers: int = 2, hidden: int = 64, init: float = 0.3,
          attn_implementation: str | None = None):
    """A Qwen2-architecture causal LM with random weights; a wide init spreads logits so argmax is stable.
    attn_implementation: "sdpa" or "eager" (None: transformers' default, sdpa)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    vocab_size = vocab_size or len(tokenizer())
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, initializer_range=init, tie_word_embeddings=False,
                         eos_token_id=0, bos_token_id=0, pad_token_id=4)
    torch.manual_seed(seed)
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    m = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **extra)
    m.generation_config.pad_token_id = 4
    return m.eval()


def save(tmp_path, seed: int = 0, name: str = "tiny", **kwargs):
    """Write a tiny model + tokenizer as a local model directory (a model spec)."""
    path = tmp_path / name
    model(seed, **kwargs).save_pretrained(path)
    tokenizer().save_pretrained(path)
    return path


def saved_pair(root):
    """(target dir, draft dir): the tests' usual tiny pair saved under `root` (a 1-layer, 32-wide draft)."""
    return save(root, seed=1, name="target"), save(root, seed=2, name="draft", layers=1, hidden=32)
