"""The frame parser: every framing variant from issue #30 ends in a resynchronised stream."""

import json

import pytest

from lsp_server.framing import Body, Discarded, FrameParser

GOOD = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "specdec/stats", "params": {}}).encode()


def frame(body: bytes, length: int | None = None) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


def events(*chunks: bytes, parser: FrameParser | None = None) -> list:
    parser = parser or FrameParser()
    out = []
    for chunk in chunks:
        parser.feed(chunk)
        while (event := parser.next_event()) is not None:
            out.append(event)
    return out


def bodies(found: list) -> list[bytes]:
    return [e.data for e in found if isinstance(e, Body)]


def test_well_formed_frames_with_extra_headers_byte_by_byte():
    stream = frame(GOOD) + b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n" + frame(GOOD)
    found = events(*(stream[i : i + 1] for i in range(len(stream))))
    assert bodies(found) == [GOOD, GOOD]
    assert not [e for e in found if isinstance(e, Discarded) and e.reason]  # other headers are not errors


@pytest.mark.parametrize("first", [
    b"content-length: %d\r\n\r\n" % len(GOOD) + GOOD,  # lowercase
    b"Content-Length: %d\n\n" % len(GOOD) + GOOD,  # LF-only
    b"CONTENT-LENGTH:%d\r\n\r\n" % len(GOOD) + GOOD,
], ids=["lowercase", "lf-only", "upper-no-space"])
def test_lenient_headers_are_read(first):
    assert bodies(events(first + frame(GOOD))) == [GOOD, GOOD]


@pytest.mark.parametrize("bad, reason", [
    (frame(GOOD, len(GOOD) - 5), "bytes before a header"),  # short: the body is cut JSON, the rest skipped
    (frame(GOOD, len(GOOD) + 10), "next header came after 68 of 78"),  # long: the next header in the body
    (frame(GOOD[:20], len(GOOD)), "next header came after 20 of 68"),  # truncated frame, then the next one
    (b"Content-Length: 0\r\n\r\n" + GOOD, "Content-Length 0"),
    (b"Content-Length: abc\r\n\r\n" + GOOD, "bad Content-Length"),
    (b"Content-Length: -5\r\n\r\n" + GOOD, "bad Content-Length"),
    (b"Content-Length: 1099511627776\r\n\r\n" + GOOD, "refused"),
    (b"garbage\r\n\r\n" + GOOD, "no Content-Length"),
], ids=["short", "long", "truncated", "zero", "abc", "negative", "huge", "garbage"])
def test_bad_frame_then_resync(bad, reason):
    parser = FrameParser()
    found = events(bad, frame(GOOD), parser=parser)
    assert bodies(found)[-1] == GOOD
    # the bad frame's start is handed on (as a body or as discarded bytes) so its id can be answered
    assert any(GOOD[:20] in e.data for e in found[:-1])
    assert any(reason in (e.reason if isinstance(e, Discarded) else e.problem) for e in found)
    assert parser.buffered == 0


def test_a_body_longer_than_its_json_value_can_be_unread():
    parser = FrameParser()
    assert events(frame(GOOD + b"Content-Le", len(GOOD) + 10), parser=parser) == [Body(GOOD + b"Content-Le")]
    parser.unread(b"Content-Le")  # what the dispatcher does with bytes after a complete JSON value
    assert bodies(events(b"ngth: %d\r\n\r\n" % len(GOOD) + GOOD, parser=parser)) == [GOOD]


def test_huge_frame_is_skipped_without_buffering_it():
    parser = FrameParser(max_body=1000)
    found = events(b"Content-Length: 5000\r\n\r\n" + b"x" * 500, *[b"x" * 500] * 9, frame(GOOD), parser=parser)
    assert bodies(found) == [GOOD]
    reported = [e for e in found if isinstance(e, Discarded) and e.reason]
    assert len(reported) == 1 and "refused" in reported[0].reason  # one log line, not one a chunk
    assert parser.buffered == 0


def test_a_huge_frame_whose_body_comes_later_still_reports_its_start():
    parser = FrameParser(max_body=1000)
    found = events(b"Content-Length: 5000\r\n\r\n", GOOD + b"x" * 2000, frame(GOOD), parser=parser)
    assert bodies(found) == [GOOD]
    assert any(e.data.startswith(GOOD[:20]) for e in found if isinstance(e, Discarded))  # to answer its id


def test_garbage_without_headers_is_bounded():
    parser = FrameParser()
    for _ in range(100):
        events(b"y" * 65536, parser=parser)
        assert parser.buffered < 64
    assert bodies(events(frame(GOOD), parser=parser)) == [GOOD]


def test_a_body_split_across_reads_waits_for_the_rest():
    data = frame(GOOD)
    parser = FrameParser()
    assert events(data[:30], parser=parser) == []
    assert bodies(events(data[30:], parser=parser)) == [GOOD]


def test_a_stalled_body_is_read_only_when_it_is_whole_json():
    parser = FrameParser()
    assert events(frame(GOOD, len(GOOD) + 10), parser=parser) == [] and parser.mid_body
    assert parser.stalled() == Body(GOOD, f"{len(GOOD)} of {len(GOOD) + 10} bytes came, then nothing")
    assert bodies(events(frame(GOOD), parser=parser)) == [GOOD] and parser.buffered == 0
    events(frame(GOOD[:30], len(GOOD)), parser=parser)
    assert parser.stalled() is None and parser.mid_body  # cut-off JSON waits for the next header
    assert bodies(events(frame(GOOD), parser=parser)) == [GOOD[:30], GOOD]


def test_header_patterns_do_not_backtrack_on_garbage():
    import time

    parser = FrameParser()
    start = time.perf_counter()
    for junk in (b"a" * 8000 + b"!", b"a:" * 4000 + b"\x00", b"Content-Type: " + b"a" * 8000):
        events(junk, parser=parser)
    assert time.perf_counter() - start < 1
    assert bodies(events(frame(GOOD), parser=parser)) == [GOOD]
