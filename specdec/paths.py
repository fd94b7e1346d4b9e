"""Where specdec keeps things on disk (XDG user dirs, overridable for tests and CI)."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir, user_data_dir, user_state_dir


def _dir(env: str, default: str) -> Path:
    path = Path(os.environ.get(env) or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Models and downloaded wheels: large, re-creatable."""
    return _dir("SPECDEC_CACHE_DIR", user_cache_dir("specdec"))


def data_dir() -> Path:
    """Adapters: user-made, not re-creatable."""
    return _dir("SPECDEC_DATA_DIR", user_data_dir("specdec"))


def state_dir() -> Path:
    """Metrics the server persists between runs."""
    return _dir("SPECDEC_STATE_DIR", user_state_dir("specdec"))


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def wheels_dir() -> Path:
    path = cache_dir() / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def quantized_dir() -> Path:
    """Quantized targets' packed tensors (specdec.models.int4_cache): re-creatable from their GGUF."""
    path = cache_dir() / "quantized"
    path.mkdir(parents=True, exist_ok=True)
    return path
