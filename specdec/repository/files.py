"""Which files of a repository may be read (trained on, indexed for drafting), and why the others may not.

Files come from `git ls-files` (or a walk that honours .gitignore). Binaries, generated,
minified and vendored code, lock files, huge files and anything that looks like a
secret are skipped, each with a reason the report shows. Secrets are never trained on:
by name (.env, keys, credentials) and by content: detect-secrets' detectors (Yelp's maintained
set: cloud keys, tokens, webhooks, credentials in URLs, keyword assignments), a few patterns of
ours it lacks, and an entropy rule for long random-looking string literals; each scan also runs
over the text with adjacent string literals joined, so `"ghp_abc" + "def"` and `"".join(["ghp_abc",
"def"])` are one token again. The keyword rule is detect-secrets' own, read as the file's kind asks
(unquoted values in YAML, TOML, INI, shell and env files, and in every comment), and its
assignment patterns also run over names it does not list (`*_token`, master and signing keys),
where the value must look random.

A file with a finding is dropped whole, not redacted: a secret is often more than the line a
detector flags (a key block's body, a value continued on the next line, a half in another
literal), and a redacted line still teaches the model where the secret sits.
`select()` is the one filter: anything that reads a repository's files (the fine-tune, the
repository index) goes through it, and reads them with `read_file()`; `document_reason()` applies
the same rules to an editor's unsaved text of one file.

Nothing outside the root is read: a path is judged after resolving every symlink on the way (a
tracked folder replaced by a link to elsewhere included), and `read_file()` checks the file it
actually opened. What cannot be read (no permission, gone or renamed since it was listed) is
skipped with its reason; the rest of the repository is read as usual.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import math
import os
import random
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specdec.file_languages import EXTENSIONS

MAX_BYTES = 512 * 1024
HOLDOUT = 0.1  # share of a repository's files held out of fine-tuning and indexing, to measure on
SECRET_NAMES = (".env", ".env.*", "*.env", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "id_rsa*",
                "id_dsa*", "id_ecdsa*", "id_ed25519*", "credentials", "credentials.*", "*.credentials",
                ".netrc", ".npmrc", ".pypirc", ".git-credentials", "secrets.*", "*secret*.json", "*.kdbx",
                "service-account*.json", "*.tfvars")
# Ours, checked before detect-secrets' (which covers URL credentials, Slack, SendGrid, Azure, AWS and more).
SECRET_PATTERNS = {
    "private key block": re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
    "AWS access key": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})\b"),
    "GitLab token": re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    "OpenAI/Anthropic key": re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}\b"),
    "Stripe key": re.compile(r"\b[rs]k_live_[0-9a-zA-Z]{20,}\b"),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "JWT": re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
    "npm token": re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"),  # detect-secrets knows only the .npmrc form
    "Discord webhook": re.compile(r"\bhttps?://(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api/webhooks/\d+/"
                                  r"[A-Za-z0-9_-]{20,}"),  # detect-secrets knows only bot tokens
}
# Secret-sounding names detect-secrets' keyword list lacks; a value assigned to one counts only if it looks
# random (_random_value), since `token_type = "bearer"` or `cache_key = ...` are ordinary code.
EXTRA_KEYWORDS = ("token", "master_?key", "signing_?key", "encryption_?key", "hmac_?key", "access_?key",
                  "session_?key", "credential")
# Files whose values are written unquoted (`password: x`, `export TOKEN=x`): detect-secrets' config patterns.
CONFIG_SUFFIXES = (".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".properties", ".env", ".envrc", ".sh",
                   ".bash", ".zsh", ".ksh", ".fish", ".ps1", ".bat", ".cmd")
# Where a comment starts: a line's start, or after code (`x = 1  # ...`).
_COMMENT = re.compile(r"^\s*(?:#|//|--|/\*|\*|;|%|<!--|(?i:rem)\s)|\s(?:#|//|--)\s")
# A literal list joined with an empty separator: Python `"".join([...])`, JavaScript `[...].join("")`.
_LITERAL = r"""(?:"[^"\n]*"|'[^'\n]*'|`[^`\n]*`)"""
_LITERAL_LIST = rf"""((?:\s*{_LITERAL}\s*,)*\s*{_LITERAL}\s*,?\s*)"""
_JOIN_CALLS = (re.compile(rf"""(?:""|''|``)\s*\.join\(\s*[\[(]{_LITERAL_LIST}[\])]\s*\)"""),
               re.compile(rf"""\[{_LITERAL_LIST}\]\s*\.join\(\s*(?:""|''|``)\s*\)"""))
# A string literal whose content is one long base64/hex-alphabet word: a key, token or blob, not code.
_LITERAL_WORD = re.compile(r"""["'`]([A-Za-z0-9+/_=-]{20,})["'`]""")
_HEX = re.compile(r"[0-9a-fA-F]+")
# Names that make a hex literal a credential rather than a digest (hashes and commit ids are kept).
_SECRET_WORDS = re.compile(r"(?i)token|secret|passw|pwd|api_?key|apikey|auth|credential|private|access_?key")
# Bits per character a base64-alphabet literal needs. A flat threshold catches nearly all random keys of
# realistic length and spares long identifiers that a length-scaled one flagged (docs/finetuning.md).
ENTROPY_BITS = 4.0
# Adjacent string literals, possibly joined by + (or . / .. / &) and across a line break: `"ghp_ab" + "cd"`.
_JOIN = re.compile(r"""["'`][ \t]*(?:\\?\r?\n[ \t]*)?(?:(?:\+|\.\.?|&)[ \t]*(?:\r?\n[ \t]*)?)?["'`]""")
_LIBRARY_LOCK = threading.Lock()
_PLACEHOLDER = re.compile(r"(?i)<[^>]*>?|\$?\{[^}]*\}?|\*+|x+|\.\.\.|pass(?:word|wd)?|secret|changeme")
# A cheap test for the lines detect-secrets' keyword detector could flag (its DENYLIST words).
_KEYWORDS = re.compile(r"(?i)key|pass|pwd|secret|contrase|token|credential")
LOCK_FILES = ("package-lock.json", "yarn.lock", "pnpm-lock.yaml", "Cargo.lock", "poetry.lock", "Pipfile.lock",
              "composer.lock", "Gemfile.lock", "go.sum", "uv.lock", "*.lock")
VENDORED_DIRS = {"node_modules", "vendor", "third_party", "third-party", "external", "dist", "build", ".venv",
                 "venv", "__pycache__", ".git", "site-packages", "target", ".tox", ".mypy_cache"}
GENERATED_MARKERS = ("@generated", "DO NOT EDIT", "Code generated by", "autogenerated", "Auto-generated")
SYSTEM_DIRS = ("/proc", "/sys", "/dev", "/run")  # pseudo-filesystems a walk of `/` never enters


class OutsideRoot(OSError):
    """The path resolves (through a symlink somewhere on the way) to a file outside the repository's root."""


@dataclass
class FileSelection:
    root: Path
    files: list[Path] = field(default_factory=list)  # relative to root
    skipped: dict[str, str] = field(default_factory=dict)  # relative path -> reason

    def reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for reason in self.skipped.values():
            key = reason.split(":")[0]
            counts[key] = counts.get(key, 0) + 1
        return counts


def split_heldout(files: list[Path], holdout: float = HOLDOUT, seed: int = 0) -> tuple[list[Path], list[Path]]:
    """(train, held out): a seeded share of the files, by file, held out of training and indexing. The one split
    the fine-tune, the repository benchmark and the editor replay share, so all hold out the same files."""
    order = sorted(files, key=lambda rel: Path(rel).as_posix())
    random.Random(seed).shuffle(order)
    n_heldout = min(len(order) - 1, max(1, round(len(order) * holdout))) if len(order) > 1 and holdout > 0 else 0
    return order[n_heldout:], order[:n_heldout]


def list_files(root: Path) -> list[Path]:
    """Tracked and untracked-but-not-ignored files, relative to root."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout
        return sorted({Path(p) for p in out.decode("utf-8", "replace").split("\0") if p})
    except (OSError, subprocess.CalledProcessError):
        return _walk(root)


def _walk(root: Path) -> list[Path]:
    """No git: walk the tree, honouring .gitignore files on the way down (common pattern forms)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):  # unreadable folders are passed over (onerror=None)
        here = Path(dirpath)
        rules = _ignore_rules(root, here)
        dirnames[:] = [d for d in dirnames if d not in VENDORED_DIRS and str(here / d) not in SYSTEM_DIRS
                       and not _ignored(root, here / d, rules, True)]
        found += [(here / f).relative_to(root) for f in filenames if not _ignored(root, here / f, rules, False)]
    return sorted(found)


def _ignore_rules(root: Path, folder: Path) -> list[tuple[Path, str, bool]]:
    """(folder, pattern, negated) from every .gitignore between root and folder, outermost first."""
    rules = []
    parts = folder.relative_to(root).parts
    for level in [root.joinpath(*parts[:i]) for i in range(len(parts) + 1)]:
        try:
            lines = read_file(root, (level / ".gitignore").relative_to(root)).decode("utf-8", "replace").splitlines()
        except OSError:  # none, or unreadable (its folder is still walked: each file meets the filter)
            lines = []
        for line in lines:
            line = line.strip()
            if line and not line.startswith("#"):
                negate = line.startswith("!")
                rules.append((level, line.lstrip("!"), negate))
    return rules


def _ignored(root: Path, path: Path, rules, is_dir: bool) -> bool:
    ignored = False
    for base, pattern, negate in rules:
        rel = path.relative_to(base).as_posix()
        pat = pattern.rstrip("/")
        if pattern.endswith("/") and not is_dir:
            continue
        anchored = pat.startswith("/") or "/" in pat
        pat = pat.lstrip("/")
        hit = fnmatch.fnmatch(rel, pat) if anchored else fnmatch.fnmatch(path.name, pat)
        if hit:
            ignored = not negate
    return ignored


def secret_reason(name: str, text: str) -> str | None:
    """Why the file must never be trained on (or indexed), or None."""
    if any(fnmatch.fnmatch(name.lower(), p) for p in SECRET_NAMES):
        return "secret: file name"
    joined = _JOIN.sub("", _join_lists(text))
    for view in (text, joined) if joined != text else (text,):
        for label, pattern in SECRET_PATTERNS.items():
            if pattern.search(view):
                return f"secret: {label}"
        found = _library_finding(view, name) or _entropy_finding(view)
        if found:
            return f"secret: {found}"
    return None


def _join_lists(text: str) -> str:
    """The text with each literal list joined by an empty separator written as the one literal it makes."""
    if ".join(" not in text:
        return text
    for pattern in _JOIN_CALLS:
        text = pattern.sub(lambda m: '"' + "".join(re.findall(r"""["'`]([^"'`\n]*)["'`]""", m.group(1))) + '"', text)
    return text


def shannon_entropy(word: str) -> float:
    """Bits per character of the word's own character distribution."""
    counts: dict[str, int] = {}
    for ch in word:
        counts[ch] = counts.get(ch, 0) + 1
    return -sum(n / len(word) * math.log2(n / len(word)) for n in counts.values())


def _entropy_finding(text: str) -> str | None:
    """A long random-looking literal: base64-alphabet with mixed classes and high entropy, or hex beside a
    secret-sounding name (a bare hex literal is far more often a digest than a credential)."""
    for match in _LITERAL_WORD.finditer(text):
        word = match.group(1)
        if _HEX.fullmatch(word):
            if len(word) >= 32 and shannon_entropy(word) >= 3.0:
                line_start = text.rfind("\n", 0, match.start()) + 1
                if _SECRET_WORDS.search(text[line_start : match.start()]):
                    return "high-entropy hex literal"
            continue
        if max(map(len, re.split(r"[/_-]", word))) < 12 or _sequential(word) or \
                any(run in word for run in ("abcdefghij", "ABCDEFGHIJ", "0123456789")):  # a path, a name, an alphabet
            continue
        classes = sum(bool(re.search(c, word)) for c in ("[a-z]", "[A-Z]", "[0-9]"))
        if classes == 3 and shannon_entropy(word) >= ENTROPY_BITS:
            return "high-entropy literal"
    return None


def _sequential(word: str) -> bool:
    from detect_secrets.filters.heuristic import is_sequential_string

    return is_sequential_string(word)


@functools.lru_cache(maxsize=1)
def _library_detectors() -> tuple:
    """detect-secrets' detectors that need no network or file context: every regex-based one (cloud keys,
    tokens, webhooks, credentials in URLs) and the keyword one, less the public-IP one (not a secret)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector
    from detect_secrets.plugins.ip_public import IPPublicDetector
    from detect_secrets.plugins.keyword import KeywordDetector

    classes = get_mapping_from_secret_type_to_class().values()
    regex = [cls() for cls in classes if issubclass(cls, RegexBasedDetector) and cls is not IPPublicDetector]
    return (*regex, KeywordDetector())  # last: run only on lines that name a secret (it is most of the time)


@functools.lru_cache(maxsize=4)
def _keyword_patterns(extra: bool, config: bool) -> dict:
    """detect-secrets' keyword patterns (regex -> the value's group): its config set (values may go unquoted) or
    its quotes-required one; extra: the same patterns over EXTRA_KEYWORDS instead of its own list."""
    from detect_secrets.plugins import keyword

    patterns = keyword.CONFIG_DENYLIST_REGEX_TO_GROUP if config else keyword.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP
    if not extra:
        return patterns
    ours, theirs = "(" + "|".join(EXTRA_KEYWORDS) + ")", "(" + "|".join(keyword.DENYLIST) + ")"
    assert all(theirs in regex.pattern for regex in patterns), "detect-secrets' keyword patterns changed"
    return {re.compile(regex.pattern.replace(theirs, ours), regex.flags): group for regex, group in patterns.items()}


def _random_value(value: str) -> bool:
    """A key or token rather than a word, a name or a path: one long word of key characters, of two or more
    character classes, not made of name-sized parts, not a run of the alphabet."""
    if not re.fullmatch(r"[A-Za-z0-9+/=_.-]{16,}", value) or max(map(len, re.split(r"[/_.-]", value))) < 12:
        return False
    classes = sum(bool(re.search(c, value)) for c in ("[a-z]", "[A-Z]", "[0-9]"))
    return classes >= 2 and shannon_entropy(value) >= 3.0 and not _sequential(value) and \
        not any(run in value for run in ("abcdefghij", "ABCDEFGHIJ", "0123456789"))


def _keyword_secret(value: str, line: str, extra: bool) -> bool:
    """Whether a keyword pattern's value is a secret, by detect-secrets' false-positive heuristics (templated,
    ${VAR}, sequential, no letters) and ours for placeholders; an unquoted value (config, comments) is its first
    word, which must mix letters with digits or symbols and not be a setting's dashed parts. A UUID counts
    (Heroku's API keys are UUIDs). The library's indirect-reference filter (`password = get_password()`)
    judges the whole line, which spares `connect(password="...")` too: a quoted literal in such a line counts
    unless it has no digit (a docstring's `Server(secret="my_secret_key")`)."""
    from detect_secrets.filters import heuristic

    quoted = any(f"{q}{value}{q}" in line for q in "\"'`")
    if not quoted:
        value = value.split()[0] if value.split() else ""
        mixed = re.search(r"[A-Za-z]", value) and re.search(r"[^A-Za-z]", value)
        setting = max(map(len, re.split(r"[/_.:-]", value))) < 6  # `password_encryption = scram-sha-256`
        if not mixed or setting or heuristic.is_indirect_reference(line):
            return False
    elif heuristic.is_indirect_reference(line) and not re.search(r"[0-9]", value):
        return False  # a literal argument of a call: `Server(secret="my_secret_key")` in a docstring is an example
    if len(value) < 6 or _PLACEHOLDER.fullmatch(value) or heuristic.is_templated_secret(value) \
            or heuristic.is_prefixed_with_dollar_sign(value) or heuristic.is_sequential_string(value) \
            or heuristic.is_not_alphanumeric_string(value):
        return False
    # another list's names (`next_token_ == "MarkAttachmentType"`, `tokenizer_type = "GPT2BPETokenizer"`): a key
    # or token has digits throughout, a class or setting name at most one run of them
    return _random_value(value) and len(re.findall(r"[0-9]+", value)) >= 2 if extra else True


def _library_finding(text: str, name: str = "") -> str | None:
    """The first detect-secrets finding in the text, by line (as the library scans): its regex detectors, then,
    on lines that name a secret, its keyword patterns (as the file's kind reads them, comments as config) over its
    own names and EXTRA_KEYWORDS, with the heuristics of _keyword_secret."""
    config_file = name.lower().endswith(CONFIG_SUFFIXES) or name.lower() in ("dockerfile", "makefile")
    with _LIBRARY_LOCK:  # its plugins keep module-level caches
        detectors = _library_detectors()
        for line in text.splitlines():
            if len(line) > 1000:
                continue
            for detector in detectors[:-1]:
                for value in detector.analyze_string(line):
                    if not _PLACEHOLDER.fullmatch(value):  # user:<password>@host in documentation
                        return detector.secret_type
            if not _KEYWORDS.search(line):
                continue
            comment = _COMMENT.search(line)
            views = [(line, config_file)]
            if comment and not config_file:
                views.append((line[comment.end() :], True))
            for view, config in views:
                for extra in (False, True):
                    for value in detectors[-1].analyze_string(view, _keyword_patterns(extra, config)):
                        if value and _keyword_secret(value, view, extra):
                            return detectors[-1].secret_type
    return None


def within(root: str | Path, real: str) -> bool:
    """Whether the resolved path `real` is the resolved `root` or under it."""
    root = str(root)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def inside(root: Path, rel: Path) -> bool:
    """Whether root/rel, every symlink on the way resolved, stays under root (resolved too)."""
    return within(os.path.realpath(root), os.path.realpath(Path(root) / rel))


def _opened_path(fd: int) -> str | None:
    """The real path of the file an open descriptor refers to (Linux), whatever links led to it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def read_file(root: Path, rel: Path) -> bytes:
    """The bytes of root/rel, only if it is a regular file under root (resolved) once opened. OSError when it is
    not: OutsideRoot when any symlink on the way leads out of the root (checked on the file actually opened, so a
    link swapped in after the check is caught too), else gone, unreadable, a link or not a regular file."""
    root = Path(os.path.realpath(root))
    path = root / rel
    if not inside(root, rel):
        raise OutsideRoot(errno.EACCES, "outside the workspace", str(path))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)  # O_NONBLOCK: a FIFO put in a file's place cannot hang the reader
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        opened = _opened_path(fd)
        if opened is not None and not within(root, opened):
            raise OutsideRoot(errno.EACCES, "outside the workspace", str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def path_reason(root: Path, rel: Path, max_bytes: int = MAX_BYTES, size: int | None = None) -> str | None:
    """Why a file may not be read, judged by its path and size alone (size: of an editor's text, else on disk,
    where OSError escapes for a file that cannot be examined)."""
    path = root / rel
    name = rel.name
    if any(part in VENDORED_DIRS for part in rel.parts[:-1]):
        return "vendored"
    if any(fnmatch.fnmatch(name, p) for p in LOCK_FILES):
        return "lock file"
    if size is None and not inside(root, rel):
        return "outside the workspace"
    if size is None and (path.is_symlink() or not path.is_file()):
        return "not a regular file"
    if any(fnmatch.fnmatch(name.lower(), p) for p in SECRET_NAMES):
        return "secret: file name"
    size = path.stat().st_size if size is None else size
    if size > max_bytes:
        return f"too large: {size} bytes"
    if path.suffix.lower() not in EXTENSIONS or EXTENSIONS[path.suffix.lower()] in ("json", "markdown"):
        return "not source code"
    return None


def content_reason(name: str, data: bytes | str) -> str | None:
    """Why a file may not be read, judged by its content: binary, empty, minified, generated or a secret."""
    if isinstance(data, bytes):
        if b"\0" in data[:8192]:
            return "binary"
        text = data.decode("utf-8", "replace")
    else:
        if "\0" in data[:8192]:
            return "binary"
        text = data
    lines = text.splitlines() or [""]
    if not text.strip():
        return "empty"  # nothing to learn, and no hole to evaluate when held out
    if name.endswith((".min.js", ".min.css")) or max(map(len, lines)) > 1000 or len(text) / len(lines) > 200:
        return "minified"
    if any(marker in text[:2000] for marker in GENERATED_MARKERS):
        return "generated"
    return secret_reason(name, text)


def select(root: Path, max_bytes: int = MAX_BYTES, pause: Callable[[], None] | None = None) -> FileSelection:
    """Every readable file of the repository. pause: called before each file's content is read (a background
    caller yields the CPU there). A file that cannot be read is skipped with why, never the whole selection."""
    root = Path(root).resolve()
    selection = FileSelection(root)
    for rel in list_files(root):
        try:
            reason = path_reason(root, rel, max_bytes)
            if reason is None:
                if pause is not None:
                    pause()
                reason = content_reason(rel.name, read_file(root, rel))
        except OutsideRoot:
            reason = "outside the workspace"
        except OSError as exc:  # no permission, or deleted or renamed since it was listed
            reason = f"unreadable: {exc.strerror or type(exc).__name__}"
        if reason:
            selection.skipped[rel.as_posix()] = reason
        else:
            selection.files.append(rel)
    return selection


def ignored_by_git(root: Path, rel: Path) -> bool:
    """Whether git ignores the path (False outside a git repository, or without git)."""
    try:
        return subprocess.run(["git", "check-ignore", "-q", "--", rel.as_posix()], cwd=root,
                              capture_output=True, check=False).returncode == 0
    except OSError:
        return False


def document_reason(root: Path, rel: Path, text: str, max_bytes: int = MAX_BYTES) -> str | None:
    """select()'s rules for one file's current text (an editor's buffer, saved or not)."""
    if any(part in VENDORED_DIRS for part in rel.parts[:-1]) or ignored_by_git(root, rel):
        return "ignored"
    return path_reason(root, rel, max_bytes, size=len(text.encode("utf-8", "replace"))) or \
        content_reason(rel.name, text)
