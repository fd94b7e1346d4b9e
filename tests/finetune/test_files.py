"""Which repository files a fine-tune reads, and that no secret reaches its samples."""

from pathlib import Path

import pytest

from specdec_finetune.dataset import SampleBuilder, split_files
from specdec_finetune.files import select
from specdec.prompts import fim
from repos import SECRETS, make_repo


@pytest.mark.parametrize("git", [True, False])
def test_selection_skips_secrets_vendored_generated_and_ignored(tmp_path, git):
    root = make_repo(tmp_path / "repo", files=3, git=git)
    selection = select(root)
    chosen = {p.as_posix() for p in selection.files}
    assert chosen == {"mod_0.py", "mod_1.py", "mod_2.py"}
    skipped = selection.skipped
    for path in (".env", "settings.py", "deploy/id_rsa", "ci.py"):
        assert skipped[path].startswith("secret"), (path, skipped.get(path))
    assert skipped["app.min.js"] == "minified" and skipped["gen.py"] == "generated"
    assert skipped["logo.py"] == "binary" and skipped["package-lock.json"] == "lock file"
    assert skipped["pkg/__init__.py"] == "empty"
    assert "ignored/skip.py" not in chosen and "debug.log" not in chosen
    assert "node_modules/x/index.js" not in chosen


def test_planted_secrets_never_reach_samples(tmp_path, tok):
    root = make_repo(tmp_path / "repo", files=4)
    split = split_files(select(root), holdout=0.25, seed=1)
    samples = SampleBuilder(tok, fim.detect(tok), seq_len=96).samples(split.train + split.heldout, 200, seed=1)
    text = "".join(tok.decode(s) for s in samples)
    assert "zorblax" in text
    assert not any(secret in text for secret in SECRETS)
    assert "<|fim_middle|>" in text  # FIM samples are in the family's format


def plant_secrets(root: Path) -> dict[str, str]:
    """Issue #30.14's nine kinds, each in otherwise ordinary code: file -> the secret part that must not leak."""
    import random
    import string

    rng = random.Random(30)

    def rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    pgp_body = "\n".join(rand(64, string.ascii_letters + string.digits + "+/") for _ in range(6))
    secrets = {"signing.py": pgp_body, "storage.py": rand(40, string.ascii_letters + string.digits + "/+"),
               "db.py": rand(14), "publish.py": rand(36), "hub.py": rand(40, "0123456789abcdef"),
               "notify.py": rand(24), "mail.py": rand(22) + "." + rand(43),
               "blob.py": rand(86, string.ascii_letters + string.digits + "+/") + "==", "gh.py": rand(36)}
    gh = secrets["gh.py"]
    code = {
        "signing.py": f'KEY = """\n-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{pgp_body}\n'
                      f'-----END PGP PRIVATE KEY BLOCK-----\n"""\n',
        "storage.py": f'client = boto3.client("s3", aws_secret_access_key="{secrets["storage.py"]}")\n',
        "db.py": f'DATABASE_URL = "postgresql://app:{secrets["db.py"]}@db.internal:5432/app"\n',
        "publish.py": f'NPM_TOKEN = "npm_{secrets["publish.py"]}"\n',
        "hub.py": f'GITHUB_TOKEN = "{secrets["hub.py"]}"\n',
        "notify.py": f'WEBHOOK = "https://hooks.slack.com/services/T0{rand(8).upper()}/B0{rand(8).upper()}/'
                     f'{secrets["notify.py"]}"\n',
        "mail.py": f'sg = SendGridAPIClient("SG.{secrets["mail.py"]}")\n',
        "blob.py": f'CONN = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={secrets["blob.py"]};'
                   f'EndpointSuffix=core.windows.net"\n',
        "gh.py": f'TOKEN = ("ghp_{gh[:10]}" + "{gh[10:22]}"\n         "{gh[22:]}")\n',
    }
    for name, line in code.items():
        body = "".join(f"    zorblax.frobnicate(step_{i}, wibble={i} * 3)\n" for i in range(12))
        (root / name).write_text(f"import zorblax\n\n{line}\n\ndef run_{name[:-3]}():\n{body}")
    return {name: secret.replace("\n", "") for name, secret in secrets.items()}


def test_nine_kinds_of_planted_secret_never_reach_the_finetune_dataset(tmp_path, tok):
    """Issue #30.14: each of these reached the dataset (2000 decoded samples); digests must not be dropped."""
    from specdec_finetune.run import split_repo

    root = make_repo(tmp_path / "repo", files=4, git=False)
    secrets = plant_secrets(root)
    (root / "test_digest.py").write_text(
        'import hashlib\n\n\ndef test_empty_digest():\n    assert hashlib.sha256(b"").hexdigest() == (\n'
        '        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")\n'
        '    COMMIT = "9fceb02d0ae598e95dc970b74767f19372d61af8"\n')
    _, selection, split = split_repo(str(root), 0.25, 1)  # the path `specdec finetune` takes
    for name in secrets:
        assert selection.skipped.get(name, "").startswith("secret"), (name, selection.skipped.get(name))
    assert Path("test_digest.py") in selection.files and Path("mod_0.py") in selection.files
    samples = SampleBuilder(tok, fim.detect(tok), seq_len=96).samples(split.train + split.heldout, 2000, seed=1)
    text = "".join(tok.decode(s) for s in samples)
    assert "zorblax" in text
    for name, secret in secrets.items():
        leaked = [secret[i : i + 8] for i in range(len(secret) - 7) if secret[i : i + 8] in text]
        assert not leaked, (name, leaked[:3])


def test_split_is_by_file_and_deterministic(tmp_path):
    root = make_repo(tmp_path / "repo", files=10)
    a, b = split_files(select(root), 0.2, seed=3), split_files(select(root), 0.2, seed=3)
    assert [f.path for f in a.heldout] == [f.path for f in b.heldout] and len(a.heldout) == 2
    assert not {f.path for f in a.heldout} & {f.path for f in a.train}
