"""Server settings from `initializationOptions` and `workspace/didChangeConfiguration`: the one schema.

Each field carries its type (from its default), bounds or choices and a one-line doc in
its metadata, so validation, the cache key and the editors' setting lists all come from
here (`schema()` is the machine-readable form). Keys may be camelCase (as editors send
them) or snake_case, at the top level or under a `specdec` section. A bad value is
refused as a whole, naming the key and its allowed range; the previous settings stay.
Strings are never coerced to numbers and floats must be finite.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace

from specdec.backends.base import engine_problem, url_problem
from specdec.backends.remote.cli import ENGINES
from specdec.backends.remote.http import Bounds
from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompts.fim import ORDERS, TEMPLATES
from specdec.engine.limits import MAX_DRAFT, MAX_NEW_TOKENS, REPO_INDEX_MAX_TOKENS, REPO_INDEX_TOKENS_LIMIT
from specdec.models.choices import DRAFT_QUANT, DTYPES, FORWARDS, INT4_KERNELS, TARGET_QUANT
from specdec.engine.strategies import STRATEGIES

FIM_FAMILIES = ("", *TEMPLATES)  # "": detect from the tokenizer


class SettingsError(ValueError):
    pass


def setting(default, doc: str, *, min: float | None = None, max: float | None = None,
            choices: tuple | None = None, choice_docs: dict[str, str] | None = None, zero: bool = False,
            reload: bool = False, output: bool = True) -> Field:
    """A settings field. choice_docs: a few words for some choices (editors show them in their pickers; "" needs
    one); zero: 0 is allowed besides [min, max] (off / greedy); reload: changing it reloads the models; output: it
    can change a suggestion's text, so it is part of the completion cache key."""
    assert not choice_docs or set(choice_docs) <= set(choices or ()), choice_docs
    meta = {"doc": doc, "min": min, "max": max, "choices": choices, "choice_docs": choice_docs or {}, "zero": zero,
            "reload": reload, "output": output}
    return field(default=default, metadata=meta)


def bound(name: str) -> dict:
    """A remote engine's time bound's range, from the one rule (specdec.backends.remote.http.Bounds)."""
    _, _, low, high = Bounds.LIMITS[name]
    return {"min": low, "max": high, "output": False}


@dataclass(frozen=True)
class Settings:
    target: str = setting(DEFAULT_TARGET, "Target model: hub id, local directory or .gguf.", reload=True)
    draft: str = setting(DEFAULT_DRAFT, "Draft model: hub id, local directory or .gguf; empty for none.",
                         reload=True)
    strategy: str = setting("auto", "Speculation strategy: auto is the repository index and prompt lookup, then the "
                            "draft model.",
                            choices=STRATEGIES, choice_docs={
                                "plain": "No drafter: one target pass per token.",
                                "draft": "The draft model drafts (needs a draft).",
                                "lookup": "Prompt lookup drafts: repeats of the text around the cursor.",
                                "auto": "The repository index or prompt lookup when either finds a repeat, "
                                        "otherwise the draft model (a chain or a tree, whichever this machine "
                                        "verifies faster).",
                                "repo": "The repository index drafts: what followed the text before the cursor in "
                                        "the workspace's other files (needs repoIndex).",
                                "tree": "One token tree per step from the draft model, prompt lookup and the "
                                        "repository index, sized for this machine from its measured verify cost "
                                        "(needs a draft)."})
    engine: str = setting("local", "Where completions are computed: local is specdec's engine in this process; "
                          "llama-server, vllm and sglang are a shared engine at engineUrl (docs/teams.md), its key "
                          "from the environment variable SPECDEC_ENGINE_API_KEY.", choices=ENGINES,
                          choice_docs={"local": "specdec's own engine, in this process.",
                                       "llama-server": "llama.cpp's llama-server at engineUrl (/infill).",
                                       "vllm": "vLLM at engineUrl (/v1/completions).",
                                       "sglang": "SGLang at engineUrl (/generate)."}, reload=True)
    engine_url: str = setting("", "The remote engine's base URL (http://HOST:PORT or https://...), for engine "
                              "llama-server, vllm or sglang; target then names the model it serves.", reload=True)
    engine_connect_seconds: float = setting(Bounds.connect_s, "Seconds to wait at most for a connection to the "
                                            "remote engine.", **bound("connect_s"))
    engine_first_byte_seconds: float = setting(Bounds.first_byte_s, "Seconds to wait at most for the first byte of "
                                               "the remote engine's reply: it evaluates the whole prompt first "
                                               "(seconds on a CPU; docs/teams.md).", **bound("first_byte_s"))
    engine_stall_seconds: float = setting(Bounds.stall_s, "Seconds to wait at most between two pieces of the remote "
                                          "engine's reply, once it started.", **bound("stall_s"))
    engine_total_seconds: float = setting(Bounds.total_s, "Seconds a remote completion may take at most, its first "
                                          "byte included (the other engine bounds fit in it).", **bound("total_s"))
    dtype: str = setting("auto", "Target precision: auto is bf16 where the device computes it natively "
                         "(GPUs, CPUs with AVX512-BF16 or AMX), else fp32.",
                         choices=DTYPES, reload=True)
    draft_quant: str = setting("int8", "Draft model quantization.", choices=DRAFT_QUANT, reload=True)
    target_quant: str = setting("auto", "Target weights: int4 serves the GGUF's own Q4_K codes (the rest int8 per "
                                "channel), int8 every linear per channel, none the dequantized floats; auto is int4 "
                                "where the target was made from a GGUF and runs on CPU, else none. Speculation stays "
                                "exact against whichever target runs.", choices=TARGET_QUANT, reload=True)
    int4_kernel: str = setting("auto", "The int4 target's matmul kernel: w4a8 is specdec's AVX512-VNNI/AVX2 kernel "
                               "(int8 activations, cheaper verify passes; compiled once per machine), aten PyTorch's "
                               "int4 kernel. Speculation stays exact with either.", choices=INT4_KERNELS,
                               choice_docs={"auto": "w4a8 where the CPU and compiler allow it, else aten.",
                                            "w4a8": "specdec's AVX512-VNNI/AVX2 kernel; an error where it cannot run.",
                                            "aten": "PyTorch's int4 CPU kernel, bf16 activations."},
                               reload=True)
    forward: str = setting("auto", "The target's forward, and the draft's where it runs there: native is specdec's "
                           "own (a Qwen2 or Llama GGUF — Qwen2.5-Coder, DeepSeek-Coder, CodeLlama — on CPU, read "
                           "straight from the file; greedy speculation bit-exact), transformers the transformers "
                           "model.",
                           choices=FORWARDS,
                           choice_docs={"auto": "native where it can run, else transformers.",
                                        "native": "specdec's own forward; an error where it cannot run.",
                                        "transformers": "the transformers model, as before."},
                           reload=True)
    max_new_tokens: int = setting(64, "Tokens per completion at most.", min=1, max=MAX_NEW_TOKENS)
    max_draft: int = setting(8, "Drafted tokens per target pass at most.", min=1, max=MAX_DRAFT)
    temperature: float = setting(0.0, "Sampling temperature; 0 is greedy.", min=0.01, max=5.0, zero=True)
    top_p: float = setting(1.0, "Nucleus sampling mass; 1 disables it.", min=0.01, max=1.0)
    debounce_ms: int = setting(100, "Milliseconds to wait after a keystroke, per document.", min=0, max=5000,
                               output=False)
    languages: tuple[str, ...] = setting((), "Language ids to complete; empty for every language.", output=False)
    enabled: bool = setting(True, "Show completions.", output=False)
    fim_family: str = setting("", "Fill-in-the-middle prompt format; empty to detect it from the tokenizer. "
                              "A change rebuilds the prompt without a reload.",
                              choices=FIM_FAMILIES, choice_docs={"": "Detect it from the tokenizer."})
    fim_order: str = setting("", "The prompt's section order: spm (suffix first) keeps the text after the cursor "
                             "cached while you type, so a keystroke prefills only its own tokens; psm (prefix "
                             "first) re-prefills the suffix on every keystroke. Empty: the family's own.",
                             choices=("", *ORDERS), choice_docs={"": "The family's own order.",
                                                                 "psm": "Prefix, suffix, middle.",
                                                                 "spm": "Suffix, prefix, middle."})
    max_prefix_tokens: int = setting(1024, "Prompt tokens before the cursor at most.", min=16, max=32768)
    # PSM re-prefills the suffix on every keystroke: short keeps reuse >= 90%
    max_suffix_tokens: int = setting(64, "Prompt tokens after the cursor at most; re-prefilled on every keystroke, "
                                     "so keep it short.", min=0, max=8192)
    snippets_from_open_files: bool = setting(True, "Put the heads of other open files of the language in the prompt.")
    max_snippet_tokens: int = setting(256, "Tokens of repository context in the prompt at most: heads of other open "
                                      "files, or with a remote engine the repository index's chunks for the cursor.",
                                      min=0, max=4096)
    multiline: bool = setting(True, "Allow multi-line completions.")
    first_line_first: bool = setting(True, "While you type, show a multi-line suggestion once its first line is "
                                     "complete; the rest is generated in the background and served by the next "
                                     "keystroke that matches it or by asking again (VS Code asks by itself).",
                                     output=False)
    max_predict_ms: int = setting(1000, "Milliseconds after a request at which a multi-line suggestion is shown with "
                                  "the lines complete so far, the rest following in the background (llama.vim's "
                                  "t_max_predict_ms); 0 waits for the whole suggestion.", min=50, max=60000, zero=True,
                                  output=False)
    prometheus_port: int = setting(0, "Prometheus metrics on 127.0.0.1 at this port; 0 is off. A port that cannot "
                                   "be bound refuses the change; once it serves, a new port takes effect at restart.",
                                   min=1024, max=65535, zero=True, output=False)
    adapters: bool = setting(True, "Use the workspace repository's LoRA draft adapter that `specdec finetune` "
                             "registered.", reload=True)
    repo_index: bool = setting(True, "Index the workspace's files (the fine-tune's file filter: no secrets, "
                               "binaries, generated or vendored files) in the background, for the auto, repo and "
                               "tree strategies to draft from.", output=False)
    repo_index_max_tokens: int = setting(REPO_INDEX_MAX_TOKENS, "Token ids the repository index holds at most "
                                         "(about 8 bytes each at rest); files beyond it are not indexed.",
                                         min=100_000, max=REPO_INDEX_TOKENS_LIMIT, output=False)
    online_adaptation: bool = setting(False, "Keep refreshing the workspace's draft adapter from the completions "
                                      "you accept and the files you edit: a few LoRA steps in a lower-priority "
                                      "child process while you are idle, stopped while a completion runs, kept "
                                      "only if acceptance does not fall. Needs adapters and a draft model. Costs "
                                      "about 130 CPU-seconds and 5-7 GB of memory per refresh with the default "
                                      "models (README, Online adaptation).", output=False)
    online_every_accepted: int = setting(20, "Accepted completions of a workspace between two online refreshes.",
                                         min=2, max=1000, output=False)
    online_steps: int = setting(8, "Training steps (two samples each) per online refresh.", min=1, max=200,
                                output=False)
    online_idle_seconds: float = setting(10.0, "Seconds without a completion request before an online refresh "
                                         "starts, or resumes after a completion stopped it.", min=1.0, max=600.0,
                                         output=False)

    def update(self, options: dict | None) -> "Settings":
        """A new Settings with the recognised keys of options applied; raises SettingsError naming every bad key."""
        if not options:
            return self
        if not isinstance(options, dict):
            raise SettingsError(f"settings must be an object, got {type(options).__name__}")
        if isinstance(options.get("specdec"), dict):
            options = {**options, **options["specdec"]}
        known = {f.name: f for f in fields(self)}
        changes, errors = {}, []
        for raw_key, value in options.items():
            key = snake(raw_key)
            if key not in known or value is None:
                continue
            try:
                changes[key] = check(known[key], value)
            except SettingsError as exc:
                errors.append(str(exc))
        if errors:
            raise SettingsError("; ".join(errors))
        new = replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> None:
        """Every field against the schema, then the rules that span fields."""
        for f in fields(self):
            check(f, getattr(self, f.name))
        if not self.target.strip():
            raise SettingsError("target must be a model spec (hub id, local directory or .gguf), not ''")
        # the one rule of engine and URL (specdec.backends.base); local keeps a URL the editor left set
        problem = (engine_problem(self.engine, self.engine_url, ("engine", "engineUrl")) if self.engine != "local"
                   else url_problem(self.engine_url, "engineUrl") if self.engine_url.strip() else "")
        if problem:
            raise SettingsError(problem)
        problem = Bounds.of(self).problem()
        if problem:
            raise SettingsError(problem)
        if self.fim_family and self.fim_order and not TEMPLATES[self.fim_family].middle \
                and self.fim_order != TEMPLATES[self.fim_family].order:
            raise SettingsError(f"fimOrder {self.fim_order!r}: {self.fim_family} prompts have no middle marker, only "
                                f"{TEMPLATES[self.fim_family].order!r} order")
        if self.strategy in ("draft", "tree") and not self.draft:
            raise SettingsError(f"strategy {self.strategy!r} needs a draft model: set draft, or use auto or lookup")
        if self.strategy == "repo" and not self.repo_index:
            raise SettingsError("strategy 'repo' needs the repository index: set repoIndex, or use auto or lookup")

    def models_differ(self, other: "Settings") -> bool:
        return any(getattr(self, f.name) != getattr(other, f.name) for f in fields(self) if f.metadata["reload"])

    def output_key(self) -> tuple:
        """The values that can change a suggestion: a cached or typed-ahead one is served only under the same."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.metadata["output"])

    def language_enabled(self, language: str) -> bool:
        return self.enabled and (not self.languages or language in self.languages)

    def as_dict(self) -> dict:
        return asdict(self)


MODEL_KEYS = tuple(f.name for f in fields(Settings) if f.metadata["reload"])  # changing one reloads the models


def snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def kind(f: Field) -> type:
    """The field's Python type, from its default (annotations are strings here)."""
    return type(f.default)


def number(value: float) -> str:
    """A bound in words: integers in full (a token cap of 256000000, not 2.56e+08), other numbers short."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def allowed(f: Field) -> str:
    """The allowed values of a field, in words, for error messages."""
    m = f.metadata
    t = kind(f)
    if m["choices"] is not None:
        return "one of " + ", ".join(repr(c) for c in m["choices"])
    if t is bool:
        return "true or false"
    if t is tuple:
        return "a list of strings"
    if t is str:
        return "a string"
    name = "an integer" if t is int else "a finite number"
    span = f"{name} in [{number(m['min'])}, {number(m['max'])}]" if m["min"] is not None else name
    return f"0 or {span}" if m["zero"] else span


def check(f: Field, value):
    """The value in the field's own type, or SettingsError naming the key and what it allows."""
    t, m, raw = kind(f), f.metadata, value

    def refuse():
        return SettingsError(f"{camel(f.name)} must be {allowed(f)}, not {raw!r}")

    if t is bool:
        if not isinstance(value, bool):
            raise refuse()
        return value
    if t is tuple:
        if isinstance(value, str):  # "python, go" as a convenience for hand-written configs
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise refuse()
        return tuple(value)
    if t is str:
        if not isinstance(value, str) or (m["choices"] is not None and value not in m["choices"]):
            raise refuse()
        return value
    # numbers: never from strings or booleans; JSON may send 32.0 for an integer
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refuse()
    if isinstance(value, float) and not math.isfinite(value):
        raise refuse()
    if t is int:
        if isinstance(value, float) and not value.is_integer():
            raise refuse()
        value = int(value)
    else:
        value = float(value)
    if m["zero"] and value == 0:
        return value
    if (m["min"] is not None and value < m["min"]) or (m["max"] is not None and value > m["max"]):
        raise refuse()
    return value


JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", tuple: "array"}


def schema() -> list[dict]:
    """Every setting as plain data (key, name, type, default, bounds, choices, doc): for package.json and docs
    (`lsp_server.settings_gen` writes them from this)."""
    rows = []
    for f in fields(Settings):
        m = f.metadata
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        assert f.default is not MISSING
        rows.append({"key": camel(f.name), "name": f.name, "type": JSON_TYPES[kind(f)], "default": default,
                     "minimum": m["min"], "maximum": m["max"], "zeroAllowed": m["zero"],
                     "choices": list(m["choices"]) if m["choices"] is not None else None,
                     "choiceDocs": dict(m["choice_docs"]), "doc": m["doc"],
                     "allowed": allowed(f), "reloadsModels": m["reload"], "affectsOutput": m["output"]})
    return rows
