"""Next-edit prompts (specdec/prompts/next_edit.py): the exact token layout, a unified diff's hunks, the window, the
smallest edit between two windows and the window's stop rule."""

import copy

import pytest

from specdec.errors import SpecdecError
from specdec.prompts import fim
from specdec.prompts.next_edit import (Edit, Hunk, NextEditor, Window, build, document_lines, markers, minimal_edit,
                                       parse_unified_diff, read_history, window_around, window_stop)

DOC = "".join(f"line {i}\n" for i in range(40))


def test_the_prompt_is_the_documented_blocks_token_by_token(tok):
    template = fim.detect(tok)
    sep = tok.get_vocab()["<|file_sep|>"]
    nl = tok.encode("\n")

    def enc(text):
        return tok.encode(text, add_special_tokens=False)

    text = "a = 1\nb = 2\nc = 3\nd = 4\n"
    window = Window(1, 3, "b = 2\nc = 3\n")
    hunks = [Hunk("x.py", "old = 0\n", "new = 0\n"), Hunk("", "p", "q")]
    prompt = build(tok, template, "demo.py", text, window, hunks, context="CTX", max_file_tokens=1000)
    expected = (enc("CTX")
                + [sep] + enc("demo.py") + nl + enc(text)  # the file around the window: all of it fits
                + [sep] + enc("original/x.py") + nl + enc("old = 0\n")  # oldest edit first
                + [sep] + enc("updated/x.py") + nl + enc("new = 0\n")
                + [sep] + enc("original/demo.py") + nl + enc("p\n")  # no path: the document's; a newline added
                + [sep] + enc("updated/demo.py") + nl + enc("q\n")
                + [sep] + enc("original/demo.py") + nl + enc("b = 2\nc = 3\n")  # the current window, as it is
                + [sep] + enc("updated/demo.py") + nl)  # the model writes from here
    assert prompt.ids == expected
    assert prompt.hunks == 2 and prompt.file_lines == (0, 5)


def test_budgets_keep_the_most_recent_hunks_and_the_lines_nearest_the_window(tok):
    template = fim.detect(tok)
    window = window_around(DOC, 20, size=3)
    hunks = [Hunk("a.py", f"v{i} = 0\n" * 4, f"v{i} = 1\n" * 4) for i in range(6)]
    one = len(build(tok, template, "d.py", DOC, window, hunks[-1:], max_file_tokens=0).ids) - \
        len(build(tok, template, "d.py", DOC, window, [], max_file_tokens=0).ids)
    prompt = build(tok, template, "d.py", DOC, window, hunks, max_history_tokens=2 * one + 1, max_file_tokens=60)
    assert prompt.hunks == 2
    assert tok.decode(prompt.ids).count("v5 = 1") == 4 and "v3" not in tok.decode(prompt.ids)
    start, end = prompt.file_lines
    assert start < 19 and end > 22 and abs((19 - start) - (end - 22)) <= 1  # above and below in turn
    assert build(tok, template, "d.py", DOC, window, [], max_file_tokens=0).file_lines == (19, 19)


def test_a_family_without_a_file_separator_is_refused(tok):
    with pytest.raises(SpecdecError, match="file separator"):
        build(tok, fim.TEMPLATES["codellama"], "a.py", "x\n", Window(0, 1, "x\n"))


GIT_DIFF = """diff --git a/src/app.py b/src/app.py
index 3b18e51..a9c1d2e 100644
--- a/src/app.py
+++ b/src/app.py
@@ -1,4 +1,4 @@
 def total(items):
-    count = 0
+    n = 0
     for item in items:
-        count += item
+        n += item
@@ -10,2 +10,3 @@ def main():
     run()
+    stop()
 
--- a/README
+++ b/README
@@ -1 +1 @@
-old
\\ No newline at end of file
+new
\\ No newline at end of file
"""


def test_a_unified_diff_becomes_original_and_updated_hunks():
    hunks = parse_unified_diff(GIT_DIFF)
    assert hunks == [
        Hunk("src/app.py", "def total(items):\n    count = 0\n    for item in items:\n        count += item\n",
             "def total(items):\n    n = 0\n    for item in items:\n        n += item\n"),
        Hunk("src/app.py", "    run()\n\n", "    run()\n    stop()\n\n"),  # an empty context line without its space
        Hunk("README", "old", "new"),
    ]
    deleted = "--- a/gone.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n"
    assert parse_unified_diff(deleted) == [Hunk("gone.py", "a\nb\n", "")]


@pytest.mark.parametrize("text, message", [
    ("just some text\n", "not a unified diff"),
    ("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n", "do not add up"),
    ("--- a/x\n+++ b/x\n@@ bad @@\n", "not a hunk header"),
])
def test_a_bad_diff_is_one_line(text, message):
    with pytest.raises(SpecdecError, match=message) as info:
        parse_unified_diff(text, "--history d.diff")
    assert "\n" not in str(info.value) and str(info.value).startswith("--history d.diff")


def test_an_unreadable_history_is_one_line(tmp_path):
    for path, message in ((tmp_path / "none.diff", "no such file"), (tmp_path, "is a folder")):
        with pytest.raises(SpecdecError, match=message):
            read_history(str(path))
    binary = tmp_path / "b.diff"
    binary.write_bytes(b"\xff\xfe@@")
    with pytest.raises(SpecdecError, match="not UTF-8"):
        read_history(str(binary))
    good = tmp_path / "g.diff"
    good.write_text(GIT_DIFF)
    assert len(read_history(str(good))) == 3


def test_the_window_is_the_lines_around_the_cursor_shifted_at_the_ends():
    assert window_around(DOC, 20) == Window(10, 31, "".join(document_lines(DOC)[10:31]))
    assert window_around(DOC, 2).start == 0 and window_around(DOC, 2).lines == 21
    assert window_around(DOC, 39) == Window(19, 40, "".join(document_lines(DOC)[19:40]))
    assert window_around(DOC, 40).end == 41  # the empty line after the last newline: a window of its own
    assert window_around("a\nb", 1) == Window(0, 2, "a\nb")
    with pytest.raises(SpecdecError, match="outside the file"):
        window_around("a\n", 5)


WINDOW = Window(10, 13, "def f(count):\n    return count\n\n")


@pytest.mark.parametrize("updated, edit", [
    (WINDOW.text, None),  # unchanged
    ("def f(count):\n    return count\n", Edit(12, 0, 13, 0, "")),  # the empty last line deleted
    ("def f(n):\n    return count\n\n", Edit(10, 6, 10, 11, "n")),  # replace inside a line
    ("def f(count):\n    return count + 1\n\n", Edit(11, 16, 11, 16, " + 1")),  # insert inside a line
    ("def f(count):\n    x = 1\n    return count\n\n", Edit(11, 0, 11, 0, "    x = 1\n")),  # insert a line
    ("def f(count):\n\n", Edit(11, 0, 12, 0, "")),  # delete a line
    ("def g(n):\n    return n\n\n", Edit(10, 4, 11, 16, "g(n):\n    return n")),  # over several lines
    ("def f(count):\n    return count\n\nf(1)\n", Edit(13, 0, 13, 0, "f(1)\n")),  # a line after the window's last
])
def test_the_smallest_edit_between_two_windows(updated, edit):
    assert minimal_edit(WINDOW, updated) == edit


def test_a_window_without_its_last_newline_keeps_it():
    assert minimal_edit(Window(0, 1, "x = 1\n"), "x = 1") is None
    assert minimal_edit(Window(0, 1, "x = 1"), "x = 1\n") is None
    assert minimal_edit(Window(0, 1, "x = 1"), "x = 2\n") == Edit(0, 4, 0, 5, "2")
    edit = minimal_edit(Window(3, 4, "a\n"), "b\n")
    assert edit.as_json() == {"range": {"start": {"line": 3, "character": 0}, "end": {"line": 3, "character": 1}},
                              "text": "b"}


def test_the_window_stops_a_margin_past_its_line_count():
    stop = window_stop(Window(0, 2, "a\nb\n"), margin=1)
    assert stop("a\nb\nc\n") is None and stop("a\nb\nc\nd") is None
    assert stop("a\nb\nc\nd\ne") == len("a\nb\nc\n")


class Capped:
    """A target with a fixed cache, as the native forward has."""

    capacity = 0


class FakeSession:
    def __init__(self, tok, capacity):
        self.tokenizer, self.target, self.stop_token_ids, self.drafter, self.strategy = tok, Capped(), frozenset(), \
            None, "plain"
        self.target.capacity = capacity

    def derive(self, **changes):  # Session.derive: another session over the same target
        other = copy.copy(self)
        other.__dict__.update(changes)
        return other


def test_a_small_cache_drops_the_file_block_then_the_history_then_refuses(tok):
    hunks = [Hunk("a.py", "x = 0\n" * 10, "x = 1\n" * 10)]
    full = NextEditor.for_session(FakeSession(tok, 10_000), "plain").prompt(DOC, 20, "d.py", hunks)
    editor = NextEditor.for_session(FakeSession(tok, len(full.ids) + 20 - 1), "plain")
    cut = editor.prompt(DOC, 20, "d.py", hunks, max_new_tokens=20)
    assert cut.file_lines == (10, 10) and cut.hunks == 1  # no file block
    window_only = build(tok, fim.detect(tok), "d.py", DOC, window_around(DOC, 20), [], max_file_tokens=0)
    editor.session.target.capacity = len(window_only.ids) + 20
    assert editor.prompt(DOC, 20, "d.py", hunks, max_new_tokens=20).ids == window_only.ids
    editor.session.target.capacity -= 1
    with pytest.raises(SpecdecError, match="do not fit the model's cache"):
        editor.prompt(DOC, 20, "d.py", hunks, max_new_tokens=20)


def test_the_session_stops_at_the_separator_and_the_drafter_finds_the_window(tok):
    from specdec.engine.drafters.edit_window import EditWindow, window_tokens

    session = FakeSession(tok, 10_000)
    editor = NextEditor.for_session(session, "edit")
    assert session.stop_token_ids == frozenset() and session.drafter is None  # handed in, left as it was
    assert editor.session.target is session.target  # derived: the same target
    session = editor.session
    assert tok.get_vocab()["<|file_sep|>"] in session.stop_token_ids and session.strategy == "edit"
    assert isinstance(session.drafter, EditWindow)  # no drafter behind it: the window copy alone
    prompt = editor.prompt(DOC, 20, "d.py")
    assert tok.decode(window_tokens(prompt.ids, markers(tok, fim.detect(tok)))) == prompt.window.text
