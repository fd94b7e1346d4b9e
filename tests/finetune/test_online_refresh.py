"""One online refresh (finetune/online.py): its data, its secret filter, its score, its keep-or-discard rule."""

from pathlib import Path

import pytest

from repos import SECRETS, make_repo


def holes(repo, tok, count: int, start: int = 0):
    """(path, prefix, suffix) at a line inside each of `count` files of a synthetic repository."""
    out = []
    for i in range(start, start + count):
        text = (repo / f"mod_{i}.py").read_text()
        cut = text.index("\n", text.index("wibble=6")) + 5  # inside the next line's indentation
        out.append((f"mod_{i}.py", text[:cut], text[cut:]))
    return out


def accepted_entries(target, tok, cuts, new_tokens: int = 12) -> list[dict]:
    """What the server sends for accepted completions: the context and the target's own greedy tokens."""
    from specdec.engine.session import greedy_reference
    from specdec.prompts import fim

    template = fim.detect(tok)
    entries = []
    for path, prefix, suffix in cuts:
        prompt = fim.build(tok, template, prefix, suffix, path, 1024, 64).ids
        tokens = greedy_reference(target, prompt, new_tokens, {tok.eos_token_id}) or []
        entries.append({"path": path, "language": "python", "prefix": prefix, "suffix": suffix, "tokens": tokens,
                        "text": tok.decode(tokens)})
    return entries


@pytest.fixture(scope="module")
def setup(pair, tmp_path_factory):
    """The pair, a repository, and 8 accepted completions of the (idiom-trained) target in it."""
    from transformers import AutoModelForCausalLM

    import tiny

    target_dir, draft_dir = pair
    tok = tiny.tokenizer()
    repo = make_repo(tmp_path_factory.mktemp("ws") / "repo", files=10)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    return target_dir, draft_dir, tok, repo, accepted_entries(target, tok, holes(repo, tok, 8))


def job(setup, **fields):
    from specdec_finetune.online import OnlineJob

    target_dir, draft_dir, tok, repo, entries = setup
    edited = [{"path": f"mod_{i}.py", "language": "python", "text": (repo / f"mod_{i}.py").read_text()}
              for i in range(8, 10)]
    base = {"workspace": str(repo), "draft": str(draft_dir), "target": str(target_dir), "dtype": "fp32",
            "steps": 4, "seq_len": 128, "learning_rate": 3e-3, "accepted": entries, "edited": edited}
    return OnlineJob.parse({**base, **fields})


def test_fixed_k_blocks():
    from specdec_finetune.online import fixed_k_blocks

    # the first token is the target's prefill; then drafts of min(k, tokens left - 1): the pass adds one more
    assert fixed_k_blocks([True] * 10, 4) == (7, 7)  # prefill 1, then 4 accepted + 1, then 3 accepted + 1
    assert fixed_k_blocks([True, False, True, True, False, True], 4) == (7, 2)  # 0 of 4, 2 of 3, a pass without
    assert fixed_k_blocks([False] * 5, 4) == (6, 0)  # 0 of 3, 0 of 2, 0 of 1, a pass without a draft
    assert fixed_k_blocks([True], 4) == (0, 0)


def test_the_score_counts_what_the_engine_counts(setup):
    """Along the target's greedy tokens a greedy draft's accepted run is its run of top-1 matches: one
    teacher-forced pass scores exactly what speculative decoding at that fixed k accepts."""
    from transformers import AutoModelForCausalLM

    from specdec.engine.draft_length import DraftLength
    from specdec.engine.drafters.draft_model import DraftModel
    from specdec.engine.sampling import SamplingConfig
    from specdec.engine.session import GenerationConfig, Session
    from specdec.prompts import fim
    from specdec_finetune.online import Sample, greedy_acceptance

    target_dir, draft_dir, tok, repo, _ = setup
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    session = Session(target, tok, DraftModel(draft, DraftLength(k_max=4, adaptive=False)), strategy="draft")
    compared = 0
    for path, prefix, suffix in holes(repo, tok, 6):
        prompt = fim.build(tok, fim.detect(tok), prefix, suffix, path, 1024, 64).ids
        session.reset()
        generation = session.generate(prompt, GenerationConfig(16, SamplingConfig(), max_draft=4))
        if generation.stop_reason != "max_tokens":
            continue
        score = greedy_acceptance(draft, [Sample(prompt + generation.tokens, len(prompt), "accepted")], k=4)
        assert (score["drafted"], score["accepted"]) == (generation.stats.drafted, generation.stats.accepted)
        compared += 1
    assert compared >= 3


def test_secrets_in_an_edited_file_never_reach_the_samples(setup):
    """A document with a finding gives nothing, not even a completion accepted in a clean-looking part of it."""
    from specdec.prompts import fim
    from specdec_finetune.online import build_data

    target_dir, draft_dir, tok, repo, entries = setup
    clean = (repo / "mod_9.py").read_text()
    leaky = "def fetch_leaky(session):\n    return session.get(url)\n" * 3 + f'\nAWS_KEY = "{SECRETS[1]}"\n'
    window = [{**entries[0], "path": "leaky.py", "prefix": "def fetch_leaky(session):\n    ", "suffix": "\n"}]
    in_window = [{**entries[1], "path": "other.py", "prefix": f'TOKEN = "{SECRETS[3]}"\n' + entries[1]["prefix"]}]
    request = job(setup, accepted=window + in_window + entries[2:], edited=[
        {"path": "leaky.py", "language": "python", "text": leaky},
        {"path": "config/.env", "language": "plaintext", "text": "DEBUG=1\nNAME=fetch_leaky_env\n"},
        {"path": "mod_9.py", "language": "python", "text": clean}])
    data = build_data(request, tok, fim.detect(tok))
    assert data.dropped["leaky.py"].startswith("secret") and data.dropped["other.py"].startswith("secret")
    assert data.dropped["config/.env"] == "secret: file name"
    texts = [tok.decode(s.ids) for s in data.train + data.heldout]
    assert not any(marker in t for t in texts for marker in ("fetch_leaky", "AKIA", "ghp_", "AWS_KEY", "TOKEN"))
    # what is clean is used: the other accepted completions and the clean edited file
    assert len(data.train) + len(data.heldout) > len(entries) - 2 and data.edited_files == 1
    assert any(s.kind == "edited" and "quux_9" in tok.decode(s.ids) for s in data.train)


def test_held_out_completions_are_cut_out_of_the_edited_files(setup):
    from specdec.prompts import fim
    from specdec_finetune.online import build_data

    target_dir, draft_dir, tok, repo, entries = setup
    taken = "zorblax.frobnicate(quux_9, wibble=99 * 7)"
    last = {**entries[-1], "path": "mod_9.py", "text": taken}
    text = (repo / "mod_9.py").read_text() + f"    {taken}\n"
    data = build_data(job(setup, accepted=entries[:-1] + [last], steps=40,
                          edited=[{"path": "mod_9.py", "language": "python", "text": text}]), tok, fim.detect(tok))
    assert data.heldout and data.heldout[-1].ids[data.heldout[-1].start :] == last["tokens"][: len(
        data.heldout[-1].ids) - data.heldout[-1].start]
    edited = [tok.decode(s.ids) for s in data.train if s.kind == "edited"]
    assert edited and not any("wibble=99" in t for t in edited)


def test_only_completions_no_refresh_trained_on_are_held_out(setup):
    from specdec.prompts import fim
    from specdec_finetune.online import build_data

    target_dir, draft_dir, tok, repo, entries = setup
    assert len(build_data(job(setup), tok, fim.detect(tok)).heldout) == 2  # a quarter of 8, all new
    data = build_data(job(setup, fresh=1), tok, fim.detect(tok))  # 7 were in the last refresh
    assert len(data.heldout) == 1 and data.heldout[0].ids[data.heldout[0].start :] == entries[-1]["tokens"]
    assert build_data(job(setup, fresh=0), tok, fim.detect(tok)).heldout == []


def test_a_refresh_that_lowers_acceptance_is_discarded(setup):
    """The draft is the target itself (it agrees wherever the shorter training prompt keeps the target's choice);
    a wild learning rate breaks it: not registered."""
    from specdec_adapters.registry import Registry, repo_identity
    from specdec_finetune.online import refresh

    target_dir, draft_dir, tok, repo, entries = setup
    outcome = refresh(job(setup, draft=str(target_dir), learning_rate=5.0, steps=3, draft_quant="none"))
    assert outcome["before"]["acceptance_rate"] > 0.3
    assert outcome["after"]["acceptance_rate"] < outcome["before"]["acceptance_rate"]
    assert outcome["kept"] is False and outcome["adapter"] == "" and outcome["steps"] == 3
    assert Registry().versions(repo_identity(repo)[0]) == []


def test_a_kept_refresh_is_registered_and_the_next_continues_from_it(setup):
    from specdec_adapters.registry import Registry, repo_identity
    from specdec_finetune.online import refresh

    target_dir, draft_dir, tok, repo, entries = setup
    steps = []
    first = refresh(job(setup), on_step=lambda step, loss: steps.append(step))
    assert steps == [1, 2, 3, 4] and first["edited_samples"] > 0 and first["heldout"] == 2
    assert first["after"]["acceptance_rate"] >= first["before"]["acceptance_rate"] and first["kept"]
    meta = Registry().latest(repo_identity(repo)[0])
    assert meta.name == first["adapter"] and meta.training["online"] is True and meta.training["continued_from"] == ""
    assert meta.metrics_after["total"]["acceptance_rate"] == first["after"]["acceptance_rate"]
    second = refresh(job(setup, steps=1))
    assert second["previous"] == first["adapter"]
    assert second["before"]["acceptance_rate"] == pytest.approx(first["after"]["acceptance_rate"])


def test_too_few_accepted_completions_train_nothing(setup):
    from specdec_finetune.online import refresh

    outcome = refresh(job(setup, accepted=setup[4][:1]))
    assert outcome["steps"] == 0 and not outcome["kept"] and "fewer than two" in outcome["skipped"]


def test_the_entry_point_answers_bad_input_in_one_line(tmp_path):
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "specdec_finetune.online"], input='{"workspace": 3}',
                         capture_output=True, text=True, timeout=120)
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert run.returncode == 1 and events[-1]["event"] == "error" and "online job" in events[-1]["message"]


def test_the_refresh_and_the_repository_index_skip_the_same_documents(tmp_path, tok):
    """One rule (specdec/repository/files.py document_reason): every document of a repository, sent as the editor's
    buffer to the repository index and as an edited document to an online refresh, is used by both or by neither."""
    import threading

    from specdec.engine.drafters.repo_index import RepoIndex
    from specdec.prompts import fim
    from specdec.repository.build import document_key
    from specdec.repository.indexer import WorkspaceIndexer
    from specdec_finetune.online import OnlineJob, build_data

    root = make_repo(tmp_path / "repo", files=2)
    (root / "notes.md").write_text("# notes\nnothing to learn\n")  # not source code
    (root / "build").mkdir()
    (root / "build" / "out.py").write_text("x = 1\n")  # vendored (a build folder)
    (root / "bundle.js").write_text("var b = 1;" * 150 + "\n")  # minified: one 1,500-character line
    documents = {p.relative_to(root).as_posix(): p.read_bytes().decode("utf-8", "replace")
                 for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.relative_to(root).parts}
    idle = threading.Event()
    idle.set()
    indexer = WorkspaceIndexer(RepoIndex(), idle=idle, debounce=0.0)
    try:
        indexer.open_root(root)
        indexer.set_tokenizer(tok)
        assert indexer.wait_settled(120), indexer.stats()
        for path, text in documents.items():
            indexer.update(root / path, text)
        assert indexer.wait_settled(120), indexer.stats()
        indexed = {path for path in documents if document_key(root / path) in set(indexer.index.keys())}
    finally:
        indexer.stop(timeout=10)
    job = OnlineJob.parse({"workspace": str(root), "draft": "d", "target": "t",
                           "edited": [{"path": p, "language": "python", "text": t} for p, t in documents.items()]})
    trained = set(documents) - set(build_data(job, tok, fim.detect(tok)).dropped)
    assert trained == indexed, (trained, indexed)
    assert trained == {"mod_0.py", "mod_1.py"}, trained  # and every kind of refusal is among the documents


def test_a_gguf_pair_is_refreshed_on_the_native_target_and_nothing_is_converted_into_the_cache(tmp_path,
                                                                                                 monkeypatch):
    """As `specdec finetune` (tests/finetune/test_budget.py): with a GGUF target the edited files are labelled on
    the native forward from its codes, the draft is dequantized from its GGUF in memory, and the refresh leaves
    the cache as serving made it (no bf16 conversion of either model)."""
    from transformers import AutoModelForCausalLM

    from gguf_files import gguf_pair, gguf_pair_models, gguf_tokenizer
    from specdec.models import store, w4a8
    from specdec.models.loading import load_pair
    from specdec.native.layers import ops_available
    from specdec.native.lm import NativeModel
    from specdec.paths import cache_dir
    from specdec_finetune import online

    if w4a8.load() is None or not ops_available():
        pytest.skip("the native forward cannot run here")

    def cache_files() -> dict[str, int]:
        return {str(p.relative_to(cache_dir())): p.stat().st_size for p in sorted(cache_dir().rglob("*"))
                if p.is_file()}

    target, draft = gguf_pair(tmp_path / "gguf")
    served = load_pair(str(target), str(draft), target_quant="auto")  # a server ran first: what serving caches
    draft_hash, made_by_serving = served.draft.weight_hash, cache_files()
    del served
    assert made_by_serving and all(Path(name).name.startswith("native-") for name in made_by_serving)

    tok = gguf_tokenizer()
    repo = make_repo(tmp_path / "repo", files=10)
    entries = accepted_entries(gguf_pair_models()[0].eval(), tok, holes(repo, tok, 8))
    request = online.OnlineJob.parse({
        "workspace": str(repo), "target": str(target), "draft": str(draft), "draft_hash": draft_hash, "steps": 2,
        "seq_len": 128, "learning_rate": 3e-3, "accepted": entries,
        "edited": [{"path": f"mod_{i}.py", "language": "python", "text": (repo / f"mod_{i}.py").read_text()}
                   for i in (8, 9)]})

    teachers, read_by_transformers = [], []
    real_teach, real_from_pretrained = online.teach, AutoModelForCausalLM.from_pretrained.__func__

    def teach(model, samples, *args, **kwargs):
        teachers.append(model)
        return real_teach(model, samples, *args, **kwargs)

    def from_pretrained(cls, *args, **kwargs):
        read_by_transformers.append(kwargs.get("gguf_file") or args[0])
        return real_from_pretrained(cls, *args, **kwargs)

    def no_conversion(*args, **kwargs):
        raise AssertionError("a GGUF converted for transformers")

    monkeypatch.setattr(online, "teach", teach)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(from_pretrained))
    monkeypatch.setattr(store, "convert_gguf", no_conversion)
    outcome = online.refresh(request)
    assert len(teachers) == 1 and isinstance(teachers[0], NativeModel)
    assert read_by_transformers == ["draft.gguf"]  # the trainable draft, dequantized in memory
    assert outcome["steps"] == 2 and outcome["edited_samples"] > 0 and outcome["heldout"] >= 1
    assert outcome["before"]["drafted"] > 0 and outcome["after"]["drafted"] == outcome["before"]["drafted"]
    assert cache_files() == made_by_serving  # nothing added, nothing rewritten


def test_the_native_teacher_labels_edited_samples_as_the_native_forward_ranks_them(tmp_path):
    """teach() on a native target: each sample's top tokens and their renormalized probabilities are those of its
    own prefill on the native forward."""
    import torch

    from gguf_files import gguf_pair
    from specdec.models import w4a8
    from specdec.native.layers import ops_available
    from specdec.native.loading import load_native
    from specdec_finetune.online import Sample, teach

    if w4a8.load() is None or not ops_available():
        pytest.skip("the native forward cannot run here")
    target, _ = gguf_pair(tmp_path / "gguf")
    model, _ = load_native(str(target), target)
    samples = [Sample([5, 9, 17, 33, 2, 8, 101, 7], 0, "edited"), Sample([40, 41, 42], 0, "edited")]
    teach(model, samples, top=4)
    for sample in samples:
        logits = model.new_cached_lm().extend(sample.ids)[:-1]
        values, ids = logits.topk(4, -1)
        assert torch.equal(sample.teacher[0], ids)
        torch.testing.assert_close(sample.teacher[1], values.softmax(-1))
