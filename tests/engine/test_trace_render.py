"""The terminal rendering of a pass trace, on a recorded trace: golden text for the markers (stdout not a
terminal), the ANSI variant's colour codes, and the marked runs joining to the completion's text."""

import json

from specdec.engine.trace import BONUS, CORRECTION, PLAIN, PassRecord, Trace
from specdec.engine.trace_render import REJECTED, render, render_text, segments, wants_colour

VOCAB = {0: "<|endoftext|>", 1: "def", 2: " add", 3: "(a", 4: ", b", 5: "):", 6: "\n", 7: "    return", 8: " a",
         9: " +", 10: " b", 11: " x", 12: " -"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids if i != 0)


def recorded() -> Trace:
    """A completion of `def add(a, b): return a + b` by auto with an adapter: a draft chain fully accepted (bonus),
    a lookup chain cut short (correction), a merged tree (draft model, lookup, index) whose index branch was
    rejected, a plain step, and an index chain ended by the stop token."""
    return Trace(20, "auto", "py-repo@3", [
        PassRecord([], [], "", None, [], 1, PLAIN, 0, 0.0005, 0.0312, prefill=True),
        PassRecord([2, 3, 4], [-1, 0, 1], "draft", None, [0, 1, 2], 5, BONUS, 3, 0.004, 0.021),
        PassRecord([6, 11], [-1, 0], "lookup", None, [0], 7, CORRECTION, 2, 0.0001, 0.02),
        PassRecord([8, 12, 11, 10], [-1, -1, 0, 2], "tree", ["draft-tree", "lookup-tree", "repo", "repo"], [0], 9,
                   CORRECTION, 3, 0.006, 0.025, plan=((-1, -1, 0, 2), (0, 1, 0, 0)), p=[0.9, 0.05, 0.2, 0.6],
                   q=[1.0, 1.0, 1.0, 1.0]),
        PassRecord([], [], "", None, [], 10, PLAIN, 0, 0.0, 0.019),
        PassRecord([6], [-1], "repo", None, [0], 0, BONUS, 1, 0.0002, 0.02),
    ], new_tokens=11, stop_reason="eos", text="def add(a, b):\n    return a + b\n")


GOLDEN = (
    "trace: strategy auto, draft adapter py-repo@3, 20 prompt tokens, 11 new (eos), 6 target passes\n"
    "[draft:…] draft model  [lookup:…] prompt lookup  [index:…] repository index  {bonus:…}  <correction:…>  "
    "~…~ rejected drafts  unmarked: the target alone\n"
    "\n"
    "def[draft: add(a, b]{bonus:):}[lookup:\n]~ x~<correction:    return>[draft: a]~ x b~<correction: +> b[index:\n]\n"
    "\n"
    "pass  drafted  depth    plan  sources           accepted  next        token            draft ms  verify ms\n"
    "   0        0      0       -  prefill                  0  plain       'def'                0.50      31.20\n"
    "   1        3      3       -  draft                    3  bonus       '):'                 4.00      21.00\n"
    "   2        2      2       -  lookup                   1  correction  '    return'         0.10      20.00\n"
    "   3        4      3      4n  draft,index,lookup       1  correction  ' +'                 6.00      25.00\n"
    "   4        0      0       -  -                        0  plain       ' b'                 0.00      19.00\n"
    "   5        1      1       -  index                    1  bonus       ''                   0.20      20.00\n"
    "\n"
    "source       passes  drafted  accepted   alpha      k  expected  measured   (tokens per pass)\n"
    "draft             1        3         3    1.00   3.00      4.00      4.00\n"
    "draft-tree        1        1         1    1.00   1.00      2.00      2.00\n"
    "lookup            1        2         1    0.50   2.00      1.75      2.00\n"
    "lookup-tree       1        1         0    0.00   1.00      1.00      1.00\n"
    "repo              2        3         1    0.50   1.50      1.65      1.50\n"
    "all               4       10         6    0.75   2.25      2.43      2.50\n"
    "every pass, prefill and plain steps included: 6 passes, 2.00 tokens per pass\n")


def test_markers_when_not_a_terminal():
    trace = recorded()
    assert trace.tokens() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 6] and decode(trace.tokens()) == trace.text
    assert render(trace.as_dict(decode), colour=False) == GOLDEN


def test_colours_in_a_terminal():
    text = render_text(recorded().as_dict(decode), colour=True)
    assert text.startswith("def\x1b[32m add(a, b\x1b[0m\x1b[1;33m):\x1b[0m")  # plain, draft green, bonus bold yellow
    assert "\x1b[36m\n\x1b[0m\x1b[2;9m x\x1b[0m\x1b[1;31m    return\x1b[0m" in text  # lookup cyan, rejected dim
    assert text.endswith(" b\x1b[35m\n\x1b[0m")  # the index magenta; the plain step uncoloured
    assert "[" not in text.replace("\x1b[", "")  # no text markers beside the colours


def test_runs_join_to_the_completion_and_survive_json():
    recorded_json = json.loads(json.dumps(recorded().as_dict(decode)))  # what --trace-json wrote, read back
    runs = segments(recorded_json)
    assert "".join(text for style, text in runs if style != REJECTED) == recorded_json["text"]
    assert [style for style, _ in runs if style == REJECTED] == [REJECTED, REJECTED]
    assert render(recorded_json) == GOLDEN
    passes = recorded_json["passes"]
    assert passes[3]["node_text"] == [" a", " -", " x", " b"] and passes[3]["plan"] == {
        "parents": [-1, -1, 0, 2], "ranks": [0, 1, 0, 0]}
    assert passes[3]["p"] == [0.9, 0.05, 0.2, 0.6] and passes[3]["draft_ms"] == 6.0
    assert recorded_json["pieces"] == ["def", " add", "(a", ", b", "):", "\n", "    return", " a", " +", " b", "\n"]


def test_a_stop_rule_cut_inside_a_token_is_rendered_as_cut():
    trace = recorded()
    trace.text, trace.stop_reason = "def add(a, b):\n    ret", "stop"
    trace.new_tokens = 7
    runs = segments(trace.as_dict(decode))
    assert "".join(text for style, text in runs if style != REJECTED) == trace.text
    assert runs[-1] == (CORRECTION, "    ret")


def test_no_colour_off_a_terminal_or_under_no_color(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    assert wants_colour(Tty()) and not wants_colour(object())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_colour(Tty())


def test_the_vscode_views_fixture_is_this_recorded_trace():
    """vscode-client's speculation view is tested on the same trace (src/test/fixtures/trace.json): kept in step."""
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[2] / "vscode-client" / "src" / "test" / "fixtures" / "trace.json"
    trace = recorded()
    trace.probabilities = True
    assert json.loads(fixture.read_text()) == json.loads(json.dumps(trace.as_dict(decode)))


def test_pieces_hold_a_split_character_back_and_never_stall_on_an_invalid_byte():
    """Byte-level tokens: a character split over two tokens goes to the second; an invalid byte (a random model
    emits them) is U+FFFD in the text and must not swallow every later token into the last piece."""
    from specdec.engine.trace import token_pieces

    raw = {1: b"a", 2: "é".encode()[:1], 3: "é".encode()[1:], 4: b"\xff", 5: b"b", 6: b"c"}

    def decode_bytes(ids):
        return b"".join(raw[i] for i in ids).decode("utf-8", errors="replace")

    assert token_pieces([1, 2, 3, 5], decode_bytes) == ["a", "", "é", "b"]
    assert token_pieces([1, 4, 5, 6], decode_bytes) == ["a", "", "\ufffdb", "c"]
    assert token_pieces([1, 2], decode_bytes) == ["a", "\ufffd"]  # cut inside a character: the rest goes last
