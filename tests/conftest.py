import contextlib
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


# The native suites that run twice (issue #52): on the path the process runs (the CPU's best, or SPECDEC_NATIVE_ISA's)
# and once more with the native ops and the matmuls forced onto AVX2, so a CPU with AVX512 catches what an AVX2-only
# one would; the ids end in [default-isa] and [forced-avx2]. The second skips, saying so, where the process runs on
# AVX2 already. test_native_ops.py, test_native_attention.py and test_w4a8_avx2.py compare the paths themselves.
NATIVE_ISA_SUITES = ("native/test_native_exact.py", "native/test_native_lm.py", "native/test_native_fused_norm.py",
                     "models/test_w4a8.py")
NATIVE_ISA_PARAMS = ("default-isa", "forced-avx2")


def pytest_generate_tests(metafunc):
    try:
        suite = Path(metafunc.definition.path).resolve().relative_to(Path(__file__).resolve().parent).as_posix()
    except ValueError:
        return
    if suite in NATIVE_ISA_SUITES:
        metafunc.parametrize("native_isa", NATIVE_ISA_PARAMS, indirect=True)


@pytest.fixture(autouse=True)
def native_isa(request):
    """No-op but in NATIVE_ISA_SUITES' [forced-avx2] runs: the test runs with the ops and the matmuls on AVX2 (set up
    before the test's other function-scoped fixtures, switched back after)."""
    if getattr(request, "param", None) != "forced-avx2":
        yield None
        return
    with _forced_avx2():
        yield "avx2"


@contextlib.contextmanager
def _forced_avx2():
    from specdec.models import w4a8
    from specdec.native import ops

    loaded = [m for m, runs in ((w4a8, w4a8.load() is not None), (ops, ops.available())) if runs]
    if not loaded:
        reasons = dict.fromkeys(r for r in (w4a8.unavailable_reason(), ops.unavailable_reason()) if r)
        pytest.skip(f"the native code cannot run here: {'; '.join(reasons)}")
    if all(m.isa() == "avx2" for m in loaded):
        pytest.skip("this process runs the native code on AVX2 already (an AVX2-only CPU, or SPECDEC_NATIVE_ISA=avx2): "
                    "its [default-isa] run is the AVX2 run")
    with contextlib.ExitStack() as paths:
        for module in loaded:
            paths.enter_context(module.use_isa("avx2"))
        yield


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Tests never touch the user's cache, data or state dirs, except the real-model tiers' model cache."""
    monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECDEC_STATE_DIR", str(tmp_path / "state"))
    if "SPECDEC_TEST_REAL_CACHE" not in os.environ:
        monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def real_cache(monkeypatch):
    """For the tests of real models and data sets: SPECDEC_CACHE_DIR is the tests' own cache (SPECDEC_TEST_CACHE_DIR,
    else ~/.cache/specdec-tests/specdec-cache, reused between runs), the user's downloads read through links, and
    the test fails if it wrote under the user's cache (tests/cache_audit.py)."""
    import cache_audit

    yield from cache_audit.real_cache(monkeypatch)


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
