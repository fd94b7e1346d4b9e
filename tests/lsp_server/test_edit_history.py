"""The recent edits of an open document (issue #51 item 1): didChange deltas coalesced into original/updated hunks."""

from lsp_server.documents import ChunkedText
from lsp_server.edit_history import MAX_HUNKS, EditHistory
from specdec.prompts.next_edit import Hunk

URI = "file:///w/a.py"
TEXT = "def area(w, h):\n    size = w * h\n    return size\n\n\ndef show(n):\n    print(n)\n"


class Typist:
    """Applies edits to a ChunkedText as pygls' Document does and tells the history each one."""

    def __init__(self, history: EditHistory, text: str = TEXT):
        self.history, self.text = history, ChunkedText.of(text)

    def replace(self, old: str, new: str, occurrence: int = 0) -> None:
        start = -1
        for _ in range(occurrence + 1):
            start = str(self.text).index(old, start + 1)
        self.edit(start, start + len(old), new)

    def edit(self, start: int, end: int, inserted: str) -> None:
        before = self.text
        self.text = before.edit(start, end, inserted)
        self.history.change(URI, before, start, end, inserted)

    def type(self, at: int, chars: str) -> None:
        for i, ch in enumerate(chars):
            self.edit(at + i, at + i, ch)


def test_typing_on_a_line_is_one_hunk_with_a_line_of_context_each_side():
    history = EditHistory()
    typist = Typist(history)
    at = str(typist.text).index("size = w * h") + len("size = w * h")
    typist.type(at, " * 2")
    assert history.hunks(URI, "a.py", typist.text) == [
        Hunk("a.py", "def area(w, h):\n    size = w * h\n    return size\n",
             "def area(w, h):\n    size = w * h * 2\n    return size\n")]


def test_an_edit_elsewhere_closes_the_one_under_way_and_both_are_kept_in_order():
    history = EditHistory()
    typist = Typist(history)
    typist.replace("size", "area_", 0)  # the rename starts on line 1
    typist.replace("print(n)", "print(n, sep='')")  # far below: the rename's hunk closes
    hunks = history.hunks(URI, "a.py", typist.text)
    assert [h.updated.splitlines()[1] for h in hunks] == ["    area_ = w * h", "    print(n, sep='')"]
    assert hunks[0].original.splitlines()[1] == "    size = w * h"


def test_a_new_line_inside_the_edit_extends_it_and_the_lines_it_moves_stay_its_context():
    history = EditHistory()
    typist = Typist(history)
    at = str(typist.text).index("    return size")
    typist.type(at, "    size += 1\n")  # a line added above `return`, typed character by character
    (hunk,) = history.hunks(URI, "a.py", typist.text)
    assert hunk.original == "    size = w * h\n    return size\n\n"
    assert hunk.updated == "    size = w * h\n    size += 1\n    return size\n\n"


def test_an_edit_that_changes_nothing_leaves_no_hunk_and_history_is_bounded_and_forgotten():
    history = EditHistory()
    typist = Typist(history)
    at = str(typist.text).index("w * h")
    typist.edit(at, at + 1, "x")
    typist.edit(at, at + 1, "w")  # typed back
    assert history.hunks(URI, "a.py", typist.text) == []
    text = "".join(f"v{i} = {i}\n\n\n" for i in range(MAX_HUNKS + 5))
    typist = Typist(history, text)
    for i in range(MAX_HUNKS + 5):  # lines three apart: each edit closes the one before
        typist.replace(f"v{i} = {i}", f"v{i} = {i + 100}")
    hunks = history.hunks(URI, "a.py", typist.text)
    assert len(hunks) == MAX_HUNKS and f"v{MAX_HUNKS + 4} = {MAX_HUNKS + 104}" in hunks[-1].updated
    history.forget(URI)
    assert history.hunks(URI, "a.py", typist.text) == []


def test_a_paste_is_not_an_edit_to_imitate():
    history = EditHistory()
    typist = Typist(history)
    typist.edit(0, 0, "x = 1\n" * 2000)
    assert history.hunks(URI, "a.py", typist.text) == []


def test_line_of_counts_the_line_breaks_before_an_offset_across_chunks():
    text = "".join(f"line {i}\n" for i in range(5000))
    chunked = ChunkedText.of(text)
    for offset in (0, 5, 6, 7, len(text) // 3, len(text) // 2 + 1, len(text) - 1, len(text)):
        assert chunked.line_of(offset) == text.count("\n", 0, offset), offset
    assert ChunkedText.of("").line_of(0) == 0
