import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def _this_checkouts_packages() -> None:
    """adapters/, finetune/ and bench/ install as specdec_adapters, specdec_finetune and specdec_bench; an editable
    install maps those names to the checkout it was made from, so the tests of a second checkout (a git worktree)
    would import the first's. Links named after the packages, first on sys.path and on PYTHONPATH (for the child
    processes the server starts), make them this checkout's own; where the install is this checkout they change
    nothing."""
    import atexit
    import shutil
    import tempfile

    root = Path(__file__).resolve().parent.parent
    links = Path(tempfile.mkdtemp(prefix="specdec-packages-"))
    atexit.register(shutil.rmtree, links, True)
    try:
        for name, folder in (("specdec_adapters", "adapters"), ("specdec_finetune", "finetune"),
                             ("specdec_bench", "bench")):
            (links / name).symlink_to(root / folder, target_is_directory=True)
    except OSError:  # no symlinks here (Windows without the privilege): the installed mapping stands
        return
    sys.path.insert(0, str(links))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(links), str(root), os.environ.get("PYTHONPATH"))
                                               if p)


_this_checkouts_packages()


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Tests never touch the user's cache, data or state dirs, except the real-model tiers' model cache."""
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path / "state"))
    if "SPECDEC_TEST_REAL_CACHE" not in os.environ:
        monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def ends_its_processes(monkeypatch):
    """Every process the test starts (and theirs, detached or not) carries a mark in its environment and is ended
    after the test, whatever happened: a timed-out editor test once left its `specdec serve` running for 20 min."""
    import uuid

    from processes import MARK, end_marked

    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    yield
    left = end_marked(mark)
    if left:
        print(f"ended {len(left)} process(es) the test left running: {left}")


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


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A target that knows the repository's idiom (trained here on the same FIM/plain mix), a draft that does not."""
    import tiny
    import torch
    from repos import make_repo

    from specdec.prompts import fim
    from specdec_finetune.dataset import SampleBuilder, split_files
    from specdec_finetune.files import select
    from specdec_finetune.train import collate

    root = tmp_path_factory.mktemp("models")
    tok = tiny.tokenizer()
    idiom = make_repo(root / "idiom", files=12, git=False)
    samples = SampleBuilder(tok, fim.detect(tok), seq_len=128).samples(split_files(select(idiom), 0.0).train, 600, 5)
    target = tiny.model(seed=1)
    optimizer = torch.optim.Adam(target.parameters(), lr=3e-3)
    target.train()
    for step in range(150):
        ids, mask = collate(samples[(step * 4) % 600 : (step * 4) % 600 + 4], tok.pad_token_id)
        target(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    target.eval()
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    return root / "target", tiny.save(root, seed=2, name="draft")
