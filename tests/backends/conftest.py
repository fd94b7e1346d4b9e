import pytest

import tiny


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A model spec whose tokenizer (and only that) is here: a directory with tokenizer.json."""
    path = tmp_path_factory.mktemp("target") / "tiny"
    tiny.tokenizer().save_pretrained(path)
    return path
