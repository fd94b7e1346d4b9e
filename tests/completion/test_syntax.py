"""The completion policy's syntax rules (specdec/completion/syntax.py): language detection, strings/comments, line
modes, stops and trimming."""

import pytest

from specdec.completion import syntax


def ctx(language, text):
    prefix, suffix = text.split("|", 1)
    return syntax.analyze(language, prefix, suffix)


@pytest.mark.parametrize("language_id,uri,expected", [
    ("python", "file:///a/x.txt", "python"),
    ("", "file:///a/main.go", "go"),
    ("plaintext", "file:///a/lib.rs", "rust"),
    ("lua", "file:///a/init.lua", "lua"),
    (None, "file:///a/README", "plaintext"),
    ("", "file:///a/App.tsx", "typescriptreact"),
])
def test_detect_language(language_id, uri, expected):
    assert syntax.detect_language(language_id, uri) == expected


@pytest.mark.parametrize("language", ["python", "javascript", "typescript", "go", "rust", "java", "cpp"])
def test_bundled_grammars_load_offline(language):
    assert syntax.parser_for(language) is not None


def test_language_without_grammar_degrades():
    assert syntax.parser_for("lua") is None
    c = ctx("lua", "local x = |")
    assert not c.in_string_or_comment and not c.multiline


@pytest.mark.parametrize("language,text,inside", [
    ("python", 'x = "hel|lo"\n', True),
    ("python", "x = 1  # com|ment\n", True),
    ("python", 'x = "hello"|\n', False),
    ("python", "def f(|):\n", False),
    ("javascript", "const s = `temp|late`;\n", True),
    ("go", "// doc com|ment\nfunc f() {}\n", True),
    ("rust", 'let s = "ab|c";\n', True),
    ("java", "int x = 1; /* blo|ck */\n", True),
    ("cpp", "int main() { return |0; }\n", False),
])
def test_strings_and_comments(language, text, inside):
    assert ctx(language, text).in_string_or_comment is inside


@pytest.mark.parametrize("language,text,multiline", [
    ("python", "def f(x):\n    |\n", True),  # blank line in a body
    ("python", "def f(x):|\n", True),  # after a block opener
    ("python", "x = foo(|)\n", False),  # mid-line
    ("python", "x = |\n", False),  # rest of the line
    ("go", "func f() {|\n}\n", True),
    ("javascript", "if (x) {\n  |\n}\n", True),
])
def test_line_mode(language, text, multiline):
    assert ctx(language, text).multiline is multiline


def test_single_line_stops_at_newline():
    stop = syntax.stop_predicate(ctx("python", "x = |\n"))
    assert stop("compute(1)") is None
    assert stop("compute(1)\ny = 2") == len("compute(1)")


def test_python_block_stops_on_dedent():
    c = ctx("python", "def f(x):\n    |\n\nprint(f(1))\n")
    stop = syntax.stop_predicate(c)
    body = "y = x + 1\n    return y\n"
    assert stop(body) is None  # the next line's indentation is not known yet
    text = body + "print(y)"
    assert stop(text) == len(body) - 1


def test_brace_block_stops_when_it_closes_the_enclosing_block():
    c = ctx("go", "func f() int {\n\t|\n}\n")
    stop = syntax.stop_predicate(c)
    text = "x := 1\n\tif x > 0 {\n\t\treturn x\n\t}\n\treturn 0\n}\nfunc g() {"
    cut = stop(text)
    assert text[:cut] == "x := 1\n\tif x > 0 {\n\t\treturn x\n\t}\n\treturn 0"


def test_stops_where_the_suffix_already_continues():
    c = ctx("python", "def f(x):\n    |\n    return y\n")
    text = "y = x * 2\n    return y\n"
    assert text[: syntax.stop_predicate(c)(text)] == "y = x * 2"


def test_finalize_drops_half_line_and_suffix_overlap():
    multi = ctx("python", "def f(x):\n    |\n")
    assert syntax.finalize(multi, "y = 1\n    z = compu", "max_tokens") == "y = 1"
    assert syntax.finalize(multi, "if x:\n    y = 1\n    while y:", "eos") == "if x:\n    y = 1"
    single = ctx("python", "print(foo(|)\n")
    assert syntax.finalize(single, "1, 2))", "stop") == "1, 2)"
    keep = ctx("python", "x = (|)\n")
    assert syntax.finalize(keep, "a + b", "eos") == "a + b"


def test_huge_document_analysis_is_windowed(monkeypatch):
    """A 9 MB document: tree-sitter parses the window around the cursor (WINDOW characters each side), not it all."""
    parsed = []
    real = syntax.parser_for

    class Spy:
        def __init__(self, parser):
            self.parser = parser

        def parse(self, source):
            parsed.append(len(source))
            return self.parser.parse(source)

    monkeypatch.setattr(syntax, "parser_for", lambda language: (lambda p: p and Spy(p))(real(language)))
    prefix = "x = 1\n" * 1_500_000 + "def f():\n    "
    c = syntax.analyze("python", prefix, "\n")
    assert c.multiline and parsed and max(parsed) <= 2 * syntax.WINDOW * 4  # UTF-8 bytes of the window
