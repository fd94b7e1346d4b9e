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


def plant_more_secrets(root: Path) -> dict[str, str]:
    """Issue #40.11's ten kinds, each in otherwise ordinary code or config: file -> the secret that must not leak."""
    import random
    import string
    import uuid

    rng = random.Random(40)

    def rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    hexdigits, lower = "0123456789abcdef", string.ascii_lowercase + string.digits
    parts = [rand(12) for _ in range(3)]
    secrets = {".github/workflows/ci.yml": rand(40, hexdigits), "assemble.py": "".join(parts),
               "keys.py": rand(64, hexdigits), "sign.ts": rand(64, hexdigits),
               "heroku.py": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "sentry.py": rand(32, lower),
               "admin.py": rand(16), "deploy/staging_env.sh": rand(24), "database.py": rand(18),
               "hooks.py": rand(68, string.ascii_letters + string.digits + "_-")}
    body = "".join(f"    zorblax.frobnicate(step_{i}, wibble={i} * 3)\n" for i in range(12))
    steps = "".join(f"      - run: zorblax frobnicate --step {i}\n" for i in range(12))
    code = {
        ".github/workflows/ci.yml": "name: ci\non: [push]\njobs:\n  build:\n    runs-on: ubuntu-latest\n    env:\n"
                                    f"      GITHUB_TOKEN: {secrets['.github/workflows/ci.yml']}\n    steps:\n{steps}",
        "assemble.py": f'import zorblax\n\nAPI_TOKEN = "".join(["ghp_", "{parts[0]}", "{parts[1]}",\n'
                       f'                     "{parts[2]}"])\n\n\ndef run():\n{body}',
        "keys.py": f'import zorblax\n\nMASTER_KEY = "{secrets["keys.py"]}"\n\n\ndef run():\n{body}',
        "sign.ts": f'import {{ frob }} from "zorblax";\n\nexport const signingKey = "{secrets["sign.ts"]}";\n\n'
                   "export function run(): void {\n" + "".join(f"  frob(step{i}, {i} * 3);\n" for i in range(12))
                   + "}\n",
        "heroku.py": f'import zorblax\n\nHEROKU_API_KEY = "{secrets["heroku.py"]}"\n\n\ndef run():\n{body}',
        "sentry.py": f'import zorblax\n\nsentry_auth_token = "{secrets["sentry.py"]}"\n\n\ndef run():\n{body}',
        "admin.py": f'import zorblax\n\n# admin password: {secrets["admin.py"]}\n\n\ndef run():\n{body}',
        "deploy/staging_env.sh": f"#!/bin/sh\nexport DATABASE_PASSWORD={secrets['deploy/staging_env.sh']}\n"
                                 "export ZORBLAX_HOST=db.internal\n"
                                 + "".join(f"zorblax frobnicate --step {i}\n" for i in range(12)),
        "database.py": f'import psycopg2\nimport zorblax\n\nconn = psycopg2.connect(host="db", user="app", '
                       f'password="{secrets["database.py"]}")\n\n\ndef run():\n{body}',
        "hooks.py": f'import zorblax\n\nWEBHOOK = "https://discord.com/api/webhooks/1234567890123456789/'
                    f'{secrets["hooks.py"]}"\n\n\ndef run():\n{body}',
    }
    for name, text in code.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return secrets


BENIGN = {  # near misses of the rules above: ordinary code and config that must still be trained on
    "tokens.py": 'import os\n\nTOKEN_TYPE = "bearer"\ntokenizer_name = "Qwen/Qwen2.5-Coder-1.5B"\n'
                 'refresh_token_field = "refresh_token_expires_in"\n'
                 'request_id = "3f2b8c1e-9d4a-4f6b-8e2a-1c5d7b9e0f3a"\n'
                 'CACHE_KEY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"\n'
                 'conn = connect(host="db", password=os.environ["DB_PASSWORD"])\n'
                 '# password: must be at least 12 characters long\n'
                 'app = Server(webhook_secret="my_secret_key")  # as in the docs\n'
                 'args["tokenizer_type"] = "GPT2BPETokenizer"\nif next_token_ == "MarkAttachmentType":\n    pass\n',
    "settings.yml": "auth:\n  password_encryption: scram-sha-256\n  token: ${{ secrets.GITHUB_TOKEN }}\n"
                    "  api_key: changeme\n",
    "env.sh": "#!/bin/sh\nexport DATABASE_PASSWORD=$DB_PASSWORD\nexport API_TOKEN=\"${API_TOKEN:-}\"\n",
}


def test_ten_more_kinds_of_planted_secret_reach_neither_the_dataset_nor_the_index(tmp_path, tok):
    """Issue #40.11: each of these reached the dataset (2000 decoded samples); the same filter guards the
    repository index. Round 1's nine are planted beside them, and near misses must still be read."""
    from specdec.engine.drafters.repo_index import RepoIndex
    from specdec.repository.build import build_index, document_key
    from specdec_finetune.run import split_repo

    root = make_repo(tmp_path / "repo", files=4, git=False)
    secrets = {**plant_secrets(root), **plant_more_secrets(root)}
    for name, text in BENIGN.items():
        (root / name).write_text(text)
    _, selection, split = split_repo(str(root), 0.25, 1)
    for name in secrets:
        assert selection.skipped.get(name, "").startswith("secret"), (name, selection.skipped.get(name))
    for name in BENIGN:
        assert Path(name) in selection.files, (name, selection.skipped.get(name))
    samples = SampleBuilder(tok, fim.detect(tok), seq_len=96).samples(split.train + split.heldout, 2000, seed=1)
    text = "".join(tok.decode(s) for s in samples)
    assert "zorblax" in text and "TOKEN_TYPE" in text
    for name, secret in secrets.items():
        leaked = [secret[i : i + 8] for i in range(len(secret) - 7) if secret[i : i + 8] in text]
        assert not leaked, (name, leaked[:3])

    index = RepoIndex()
    build_index(root, tok, index)
    keys = set(index.keys())
    assert document_key(root / "tokens.py") in keys and document_key(root / "mod_0.py") in keys
    assert not keys & {document_key(root / name) for name in secrets}


def test_split_is_by_file_and_deterministic(tmp_path):
    root = make_repo(tmp_path / "repo", files=10)
    a, b = split_files(select(root), 0.2, seed=3), split_files(select(root), 0.2, seed=3)
    assert [f.path for f in a.heldout] == [f.path for f in b.heldout] and len(a.heldout) == 2
    assert not {f.path for f in a.heldout} & {f.path for f in a.train}
