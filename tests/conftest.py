import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Tests never touch the user's cache, data or state dirs, except the real-model tiers' model cache."""
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path / "state"))
    if "SPECDEC_TEST_REAL_CACHE" not in os.environ:
        monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tok():
    import tiny

    return tiny.tokenizer()


@pytest.fixture(scope="session")
def target():
    import tiny

    return tiny.model(seed=1)


@pytest.fixture(scope="session")
def unrelated_draft():
    import tiny

    return tiny.model(seed=2, layers=1, hidden=32)
