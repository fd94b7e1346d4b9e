"""Server settings from `initializationOptions` and `workspace/didChangeConfiguration`.

Keys may be camelCase (as editors send them) or snake_case, at the top level or under a
`specdec` section. A bad value is reported and the previous settings stay in force.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace

from specdec.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.models import DRAFT_QUANT, DTYPES


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT  # "" for no draft model
    strategy: str = "auto"
    dtype: str = "auto"
    draft_quant: str = "int8"
    max_new_tokens: int = 64
    max_draft: int = 8
    temperature: float = 0.0
    top_p: float = 1.0
    debounce_ms: int = 100
    languages: tuple[str, ...] = ()  # empty: every language
    enabled: bool = True
    fim_family: str = ""  # empty: detect from the tokenizer
    max_prefix_tokens: int = 1024
    max_suffix_tokens: int = 64  # PSM re-prefills the suffix on every keystroke: short keeps reuse >= 90%
    snippets_from_open_files: bool = True
    max_snippet_tokens: int = 256
    multiline: bool = True
    prometheus_port: int = 0  # 0: off
    adapters: bool = True  # use the workspace repository's LoRA draft adapter when one is registered

    MODEL_KEYS = ("target", "draft", "dtype", "draft_quant", "adapters")

    def update(self, options: dict | None) -> "Settings":
        """A new Settings with the recognised keys of options applied; raises SettingsError on bad values."""
        if not options:
            return self
        if not isinstance(options, dict):
            raise SettingsError(f"settings must be an object, got {type(options).__name__}")
        if isinstance(options.get("specdec"), dict):
            options = {**options, **options["specdec"]}
        known = {f.name: f for f in fields(self)}
        changes = {}
        for raw_key, value in options.items():
            key = re.sub(r"(?<!^)(?=[A-Z])", "_", raw_key).lower()
            if key not in known or value is None:
                continue
            changes[key] = _coerce(key, value, getattr(self, key))
        new = replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> None:
        from specdec.strategies import STRATEGIES

        if self.strategy not in STRATEGIES:
            raise SettingsError(f"strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        if self.dtype not in DTYPES:
            raise SettingsError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.draft_quant not in DRAFT_QUANT:
            raise SettingsError(f"draftQuant must be one of {', '.join(DRAFT_QUANT)}, not {self.draft_quant!r}")
        for name in ("max_new_tokens", "max_draft", "max_prefix_tokens"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1")
        if self.debounce_ms < 0 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise SettingsError("debounceMs and temperature must be >= 0 and topP in (0, 1]")

    def models_differ(self, other: "Settings") -> bool:
        return any(getattr(self, k) != getattr(other, k) for k in self.MODEL_KEYS)

    def language_enabled(self, language: str) -> bool:
        return self.enabled and (not self.languages or language in self.languages)

    def as_dict(self) -> dict:
        return asdict(self)


def _coerce(key: str, value, current):
    try:
        if isinstance(current, bool):
            if not isinstance(value, bool):
                raise TypeError
            return value
        if isinstance(current, int):
            if isinstance(value, bool) or not float(value).is_integer():
                raise TypeError
            return int(value)
        if isinstance(current, float):
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if isinstance(current, tuple):
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TypeError
            return tuple(value)
        if not isinstance(value, str):
            raise TypeError
        return value
    except (TypeError, ValueError):
        raise SettingsError(f"setting {key} has the wrong type: {value!r}") from None
