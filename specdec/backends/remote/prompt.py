"""The FIM prompt as text for engines that take a raw prompt (vLLM, SGLang), with repository context.

The engine tokenizes. The prefix and suffix it gets are the window the local prompt would hold (fim.window,
through tokens.TokenCounter: in the target's tokens where its tokenizer could be built here, else estimated at
CHARS_PER_TOKEN), so the prompt's head, and with it the engine's prefix cache, survives typing. The repository
context's budget is counted the same way. The template is the family's (specdec.prompts.fim): from `fimFamily`,
else from the name of the model the engine serves, else from `target`.
"""

from __future__ import annotations

from specdec.backends.remote.tokens import TokenCounter
from specdec.prompts.fim import TEMPLATES, FimTemplate, in_order
FAMILY_HINTS = (("qwen", "qwen"), ("starcoder", "starcoder"), ("codellama", "codellama"), ("deepseek", "deepseek"),
                ("codestral", "codestral"))


def family_of(*names: str) -> str:
    """The FIM family a model name says (the first name that says one), "qwen" when none does."""
    for name in names:
        low = (name or "").lower()
        for hint, family in FAMILY_HINTS:
            if hint in low:
                return family
    return "qwen"


def chunk_tokens(chunk: dict, counter: TokenCounter) -> int:
    """What a chunk costs in the prompt: its file name and text on lines of their own, and one separator token
    (Qwen's `<|file_sep|>`, which llama-server puts before each `input_extra` chunk too)."""
    return counter.count(f"{chunk.get('filename', '')}\n{chunk.get('text', '')}\n") + 1


def chunks_within(chunks: list[dict], max_tokens: int, counter: TokenCounter | None = None) -> list[dict]:
    """The chunks that fit the token budget, taken best first (a chunk too big for what is left is skipped for
    the next), then laid out best last: the nearest to the code being completed, where a model heeds it most."""
    counter = counter or TokenCounter()
    budget, kept = max_tokens, []
    for chunk in chunks:
        cost = chunk_tokens(chunk, counter)
        if cost <= budget:
            kept.append(chunk)
            budget -= cost
    return kept[::-1]


def build(template: FimTemplate, prefix: str, suffix: str, path: str = "", chunks: list[dict] | None = None,
          repo_name: str = "") -> str:
    """The raw prompt. Families with a file header (Qwen's `<|file_sep|>`) get the repository-level format:
    `<|repo_name|>` and each chunk as a file before the file being completed; the others get the plain FIM."""
    head = template.begin
    if template.file_header and (chunks or path):
        if template.family == "qwen" and repo_name:
            head += f"<|repo_name|>{repo_name}\n"
        for chunk in chunks or []:
            head += template.file_header.format(path=chunk.get("filename", "")) + chunk.get("text", "") + "\n"
        if path:
            head += template.file_header.format(path=path)
    if template.order == "spm":
        return head + template.suffix + suffix + template.prefix + prefix + template.middle
    return head + template.prefix + prefix + template.suffix + suffix + template.middle


def template_for(family: str, order: str = "") -> FimTemplate:
    """The family's template in `order` ("": its own; fim.in_order)."""
    return in_order(TEMPLATES[family], order)
