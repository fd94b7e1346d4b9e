"""The next-edit benchmark's cases, cut from real repositories' histories (issue #51 item 5).

A commit's hunk gives one case: the file as it read before that hunk (the commit's parent with the commit's earlier
hunks of the same file applied), the commit's earlier hunks (every file's, in the diff's order) as the recent edits,
the cursor on the hunk's first changed line, and the file with the hunk applied as the expected result (kept as
the change: the lines from the cursor to the last changed one, and the text that replaces them). The hunks are git's
own (`git diff-tree -p`, 3 lines of context, as `git log -p` shows them to the server's history).

Deterministic: the commits are `git rev-list --no-merges REV` (newest first) of a pinned revision, and the filters
below are plain rules, so the same git directory and revision give the same cases, byte for byte:

- Python files (`*.py`) modified in place (no rename, no new or deleted file), UTF-8, at most MAX_FILE_LINES lines;
- commits that change at most MAX_COMMIT_HUNKS hunks (a reformat or a vendored update is no next edit);
- a hunk with at least one earlier hunk in its commit (the recent edits the prediction starts from), at most
  MAX_CHANGED_LINES removed and as many added lines (at least one of either), that changes more than whitespace
  and blank lines, and whose changed lines fit the 21-line window around its first changed line;
- at most PER_COMMIT cases a commit (its first qualifying hunks), at most `limit` a repository.

A case keeps what its prompt needs, so the data file stays small: the file's lines within EXCERPT_LINES of the
window (the prompt's file block holds 512 tokens of whole lines around the window, fewer than that), and the most
recent earlier hunks within MAX_HISTORY_CHARS (the prompt keeps 1,024 tokens of them, whole hunks). Re-extract:

    python -m specdec_bench.next_edit_cases GIT_DIR --name OWNER/REPO [--rev REV] [--limit 30] >> cases.jsonl

(`git clone --bare` gives the git directory). bench/data/next_edit_cases.jsonl is SOURCES' three repositories cut
at their pinned revisions, 30 cases each, concatenated in this order (`python -m specdec_bench.next_edit_cases
--sources DIR` rewrites it from DIR/OWNER+REPO, or DIR/OWNER+REPO/repo, git directories); the benchmark takes them
round-robin.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdec.prompts.next_edit import WINDOW_LINES, document_lines, window_around

MAX_FILE_LINES = 1500
MAX_COMMIT_HUNKS = 12
MAX_CHANGED_LINES = 6
PER_COMMIT = 2
EXCERPT_LINES = 40  # the file's lines kept above and below the window
MAX_HISTORY_CHARS = 3000  # of the commit's earlier hunks, the most recent whole ones
DEFAULT_LIMIT = 30
DATA = Path(__file__).parent / "data" / "next_edit_cases.jsonl"
# the repositories bench/data/next_edit_cases.jsonl is cut from, and the revision each was cut at (none is this
# project's, none trains `finetune --edits`)
SOURCES = (("pallets/itsdangerous", "672971d66a2ef9f85151e53283113f33d642dabd"),
           ("psf/requests-html", "075ac162dc62fc532037df0d98954ab840a97516"),
           ("kennethreitz/records", "ea4273695cee6da42edf1cb294d1f2a4505470fc"))

_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class DiffHunk:
    """One hunk of a file's diff with its place: 1-based starts and line counts as the header has them, and its lines
    as (kind, text) with kind ' ', '-' or '+' and the text's newline (none where the diff says so)."""

    path: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[tuple[str, str]] = field(default_factory=list)

    @property
    def original(self) -> str:
        return "".join(text for kind, text in self.lines if kind != "+")

    @property
    def updated(self) -> str:
        return "".join(text for kind, text in self.lines if kind != "-")

    def changed(self) -> tuple[int, int]:
        """(removed lines, added lines)."""
        return sum(k == "-" for k, _ in self.lines), sum(k == "+" for k, _ in self.lines)

    def old_index(self) -> int:
        """0-based index in the old file of the hunk's first line (git names the line before an empty side)."""
        return self.old_start if self.old_count == 0 else self.old_start - 1


@dataclass
class Case:
    id: str  # OWNER/REPO@COMMIT12:PATH#N (the N-th hunk of that file in the commit, from 0)
    repo: str
    commit: str
    path: str
    first_line: int  # the excerpt's first line in the file (0-based)
    text: str  # the excerpt of the file before the hunk
    line: int  # the cursor: the hunk's first changed line, 0-based in the excerpt
    history: list[dict]  # [{"path", "original", "updated"}], oldest first
    replace: list  # [end, text]: the hunk's change, the excerpt's lines [line, end) replaced by text

    def as_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=False)

    @property
    def expected(self) -> str:
        """The excerpt with the hunk applied."""
        lines = document_lines(self.text)
        end, text = self.replace
        return "".join(lines[:self.line]) + text + "".join(lines[end:])

    @classmethod
    def from_json(cls, data: dict) -> "Case":
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


def parse_diff(text: str) -> list[DiffHunk]:
    """`git diff-tree -p` output: every hunk with its file (the `+++` path) in the diff's order. Files that are new,
    deleted, renamed or binary are skipped (the caller asks git for modified files only)."""
    hunks: list[DiffHunk] = []
    lines = text.split("\n")
    path = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            path = None
        elif line.startswith("+++ "):
            target = line[4:].split("\t")[0]
            path = target[2:] if target.startswith("b/") else None
        elif line.startswith("@@") and path is not None:
            m = _HEADER.match(line)
            if m is None:
                i += 1
                continue
            hunk = DiffHunk(path, int(m.group(1)), int(m.group(2) or 1), int(m.group(3)), int(m.group(4) or 1))
            old_left, new_left = hunk.old_count, hunk.new_count
            i += 1
            while i < len(lines) and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file": the previous line has none
                    if hunk.lines:
                        kind, content = hunk.lines[-1]
                        hunk.lines[-1] = (kind, content.removesuffix("\n"))
                    i += 1
                    continue
                kind, content = body[:1] or " ", body[1:] + "\n"
                if kind not in " -+":
                    break
                hunk.lines.append((kind, content))
                if kind != "+":
                    old_left -= 1
                if kind != "-":
                    new_left -= 1
                i += 1
            hunks.append(hunk)
            continue
        i += 1
    return hunks


def apply_hunk(old_lines: list[str], hunk: DiffHunk, offset: int) -> list[str]:
    """old_lines with the hunk applied; offset: lines the file's earlier hunks added (minus removed)."""
    at = hunk.old_index() + offset
    return old_lines[:at] + document_lines(hunk.updated)[:-1 if hunk.updated.endswith("\n") else None] + \
        old_lines[at + hunk.old_count:]


def first_changed(hunk: DiffHunk) -> int:
    """0-based index, among the hunk's old lines, of its first changed line (for an insertion: the line it goes
    before)."""
    seen = 0
    for kind, _ in hunk.lines:
        if kind != " ":
            return seen
        seen += 1
    return seen


def _whitespace_only(hunk: DiffHunk) -> bool:
    removed = [t.strip() for k, t in hunk.lines if k == "-" and t.strip()]
    added = [t.strip() for k, t in hunk.lines if k == "+" and t.strip()]
    return removed == added


def _git(git_dir: str, *args: str) -> str:
    done = subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, check=True)
    return done.stdout.decode("utf-8", errors="replace")


def _file_at(git_dir: str, rev: str, path: str) -> str | None:
    done = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{rev}:{path}"], capture_output=True)
    if done.returncode != 0:
        return None
    try:
        return done.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None


def commit_cases(git_dir: str, name: str, commit: str) -> list[Case]:
    """The qualifying hunks of one commit (module docstring), at most PER_COMMIT."""
    diff = _git(git_dir, "diff-tree", "-p", "--no-color", "--no-ext-diff", "--no-renames", "--diff-filter=M",
                "-U3", f"{commit}^", commit)
    hunks = parse_diff(diff)
    if len(hunks) < 2 or len(hunks) > MAX_COMMIT_HUNKS:
        return []
    cases: list[Case] = []
    files: dict[str, list[str] | None] = {}
    offsets: dict[str, int] = {}
    seen: dict[str, int] = {}
    for index, hunk in enumerate(hunks):
        if hunk.path not in files:
            text = _file_at(git_dir, f"{commit}^", hunk.path) if hunk.path.endswith(".py") else None
            files[hunk.path] = document_lines(text) if text is not None and text.count("\n") <= MAX_FILE_LINES \
                and "\r" not in text else None
            offsets[hunk.path], seen[hunk.path] = 0, 0
        nth = seen[hunk.path]
        seen[hunk.path] += 1
        current = files[hunk.path]
        removed, added = hunk.changed()
        offset = offsets[hunk.path]
        offsets[hunk.path] += added - removed
        if current is None:
            continue
        # the file as it reads before this hunk: its earlier hunks applied (the offset says where they moved it)
        before = current
        after = apply_hunk(current, hunk, offset)
        files[hunk.path] = after
        if (index == 0 or len(cases) >= PER_COMMIT or not (removed <= MAX_CHANGED_LINES and added <= MAX_CHANGED_LINES)
                or removed + added == 0 or _whitespace_only(hunk)):
            continue
        if before[hunk.old_index() + offset:hunk.old_index() + offset + hunk.old_count] != \
                document_lines(hunk.original)[:hunk.old_count]:
            continue  # the hunk does not apply where it says (never, from git; a guard, not a rule)
        line = hunk.old_index() + offset + first_changed(hunk)
        before_text = "".join(before)
        line = min(line, len(document_lines(before_text)) - 1)
        window = window_around(before_text, line)
        change_end = hunk.old_index() + offset + hunk.old_count - len(_trailing_context(hunk))
        if change_end > window.end or line < window.start:
            continue  # the hunk reaches past the window
        lo, hi = max(0, window.start - EXCERPT_LINES), min(len(before), window.end + EXCERPT_LINES)
        tail = len(before) - hi  # the lines after the excerpt: the same in both
        excerpt = "".join(before[lo:hi])
        updated = [text for kind, text in hunk.lines if kind != "-"]  # between its first and last change
        replace = [change_end - lo, "".join(updated[first_changed(hunk):len(updated) - len(_trailing_context(hunk))])]
        case_expected = "".join(after[lo:len(after) - tail])
        history = []
        for earlier in reversed(hunks[:index]):
            if sum(len(h["original"]) + len(h["updated"]) for h in history) + len(earlier.original) + \
                    len(earlier.updated) > MAX_HISTORY_CHARS:
                break
            history.insert(0, {"path": earlier.path, "original": earlier.original, "updated": earlier.updated})
        if not history:
            continue
        case = Case(f"{name}@{commit[:12]}:{hunk.path}#{nth}", name, commit, hunk.path, lo, excerpt, line - lo,
                    history, replace)
        if case.expected == case_expected:  # the change alone gives the file after the hunk (a guard)
            cases.append(case)
    return cases


def _trailing_context(hunk: DiffHunk) -> list[tuple[str, str]]:
    out = []
    for kind, text in reversed(hunk.lines):
        if kind != " ":
            break
        out.append((kind, text))
    return out


def extract(git_dir: str, name: str, rev: str = "HEAD", limit: int = DEFAULT_LIMIT) -> list[Case]:
    """Up to `limit` cases from the newest non-merge commits of `rev` (module docstring)."""
    cases: list[Case] = []
    for commit in _git(git_dir, "rev-list", "--no-merges", rev).split():
        if len(cases) >= limit:
            break
        if not _git(git_dir, "rev-list", "--parents", "-n1", commit).split()[1:]:
            continue  # the root commit: no parent to diff against
        cases.extend(commit_cases(git_dir, name, commit)[:limit - len(cases)])
    return cases


def interleave(groups: list[list]) -> list:
    """The groups' items round-robin (a --limit then samples every repository)."""
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_bench.next_edit_cases",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir", nargs="?", help="a repository's git directory (a bare clone, or a work tree's .git)")
    parser.add_argument("--name", help="OWNER/REPO, as the cases name it")
    parser.add_argument("--rev", default="HEAD", help="the revision whose history is cut (pin a commit)")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT)
    parser.add_argument("--sources", metavar="DIR", help=f"rewrite {DATA.name} from DIR/OWNER+REPO git directories "
                                                         "at SOURCES' revisions")
    args = parser.parse_args(argv)
    if args.sources:
        DATA.write_text(write_sources(args.sources, args.limit))
        print(f"wrote {DATA}", file=sys.stderr)
        return 0
    if not args.git_dir or not args.name:
        parser.error("GIT_DIR and --name, or --sources DIR")
    rev = _git(args.git_dir, "rev-parse", args.rev).strip()
    for case in extract(args.git_dir, args.name, rev, args.limit):
        sys.stdout.write(case.as_json() + "\n")
    return 0


def write_sources(folder: str, limit: int = DEFAULT_LIMIT) -> str:
    """The data file's text: each of SOURCES cut at its revision from FOLDER/OWNER+REPO, in SOURCES' order."""
    def git_dir(name: str) -> str:
        place = Path(folder) / name.replace("/", "+")
        return str(place / "repo" if (place / "repo").is_dir() else place)  # a mirror's layout, or the git dir

    return "".join(case.as_json() + "\n" for name, rev in SOURCES
                   for case in extract(git_dir(name), name, rev, limit))


def load(path: str | Path = DATA) -> list[Case]:
    """A cases file's cases, each repository's in its order, taken round-robin across repositories."""
    groups: dict[str, list[Case]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            case = Case.from_json(json.loads(line))
            groups.setdefault(case.repo, []).append(case)
    return interleave(list(groups.values()))


if __name__ == "__main__":
    raise SystemExit(main())
