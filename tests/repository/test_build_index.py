"""Building an index over a generated repository: the filter's files only, the cap, and what queries then see."""

from repos import make_repo

from specdec.engine.drafters.repo_index import RepoIndex
from specdec.repository.build import build_index, document_key


def test_build_indexes_the_selected_files_and_reports_them(tmp_path, tok):
    root = make_repo(tmp_path / "repo", files=6)
    index = RepoIndex()
    report = build_index(root, tok, index, flush_tokens=500)
    assert report.files == 6 and report.over_cap == 0 and report.skipped >= 8  # secrets, binaries, lock files...
    assert sorted(index.keys()) == sorted(document_key(root / f"mod_{i}.py") for i in range(6))
    stats = index.stats()
    assert report.tokens == stats.tokens > 0 and report.bytes == stats.bytes > 0
    assert report.seconds >= report.select_seconds + report.tokenize_seconds
    # the files' text is searchable: a line of mod_3 continues as mod_3 does
    ids = tok("def handler_3(quux_3):\n    zorblax.frob", add_special_tokens=False)["input_ids"]
    following = tok("nicate(quux_3, wibble=0 * 7)", add_special_tokens=False)["input_ids"]
    found = index.query(ids, horizon=4)
    assert found.match_length >= 8 and found.chain(4)[0] == following[:4]


def test_the_cap_holds_over_a_repository_larger_than_it(tmp_path, tok):
    root = make_repo(tmp_path / "repo", files=30, git=False)
    whole = build_index(root, tok, RepoIndex())
    cap = whole.tokens // 3
    index = RepoIndex(max_tokens=cap)
    report = build_index(root, tok, index, flush_tokens=200)
    stats = index.stats()
    assert stats.stored_tokens <= cap and report.tokens == stats.tokens <= cap
    assert 0 < report.files < 30 and report.files + report.over_cap == 30
    assert stats.tokens > cap * 0.8  # filled, not abandoned at the first refusal
