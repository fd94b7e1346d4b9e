"""The window of a document's text around the cursor a request carries: bounded, its start on a grid that holds while
the user types; binary documents are not completed."""

from specdec.completion.window import BINARY_SNIFF, SUFFIX_WINDOW, looks_binary, window


def test_huge_document_window_is_bounded_and_stable_while_typing():
    source = "x" * 10_000_000  # one 10 MB line: no line break to cut at
    prefix, suffix = window(source, 9_000_000)
    assert len(prefix) <= 256_000 and len(suffix) == SUFFIX_WINDOW
    lines = "y = 1\n" * 1_000_000
    starts = set()
    for typed in range(1, 200):
        document = lines + "z" * typed
        prefix, _ = window(document, len(document))
        assert prefix.endswith("z" * typed) and len(prefix) <= 256_000
        starts.add(len(document) - len(prefix))
    assert len(starts) == 1  # the window's start (and the prompt's) stays put while the user types


def test_a_nul_near_the_start_is_a_binary_document():
    assert looks_binary("abc\0def") and looks_binary("x" * (BINARY_SNIFF - 1) + "\0")
    assert not looks_binary("x" * BINARY_SNIFF + "\0") and not looks_binary("def f():\n    return 1\n")
