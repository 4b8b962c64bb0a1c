"""Fuzzing the stream decoders and the byte path they drive (no sockets).

Beyond tests/proxy/core/decoders/test_sse.py and test_ndjson.py: huge and
empty events next to normal ones, the SSE decoder and the usage-cutting
``EventCutter`` together (the relay's exact byte path: any split must give
the stream minus the usage event, byte for byte), and every format's
interpreter over the events of mutated streams.

Budget: the ``ci`` profile (800 examples per test, about 5,000 in all, under
a minute on two cores). For a long local run::

    HYPOTHESIS_PROFILE=long pytest --timeout=0 tests/reliability/test_decoder_fuzz.py
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from proxy.core.decoders.ndjson import NdjsonDecoder
from proxy.core.decoders.openai import interpret
from proxy.core.decoders.registry import ROUTES, Framing
from proxy.core.decoders.sse import SseDecoder
from proxy.core.usage import EventCutter
from tests.reliability.helpers import fuzz_settings
from tests.reliability.streams import chat_chunk, usage_chunk

FUZZ = fuzz_settings()

_eol = st.sampled_from([b"\n", b"\r", b"\r\n"])
_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12
)  # any character: JSON escapes the line ends inside strings


@st.composite
def _chat_event(draw: st.DrawFn) -> tuple[bytes, bool]:
    """One SSE event of a chat stream, and whether it is the usage-only chunk."""
    kind = draw(st.sampled_from(["token", "token", "role", "usage", "done", "empty", "big"]))
    eol = draw(_eol)
    if kind == "usage":
        obj: object = usage_chunk("c", draw(st.integers(0, 9)), draw(st.integers(0, 9)))
    elif kind == "role":
        obj = chat_chunk("c", "", role=True)
    elif kind == "big":
        obj = chat_chunk("c", "x" * draw(st.integers(100, 3000)))
    elif kind == "done":
        return b"data: [DONE]" + eol + eol, False
    elif kind == "empty":
        return b"data:" + eol + eol, False
    else:
        obj = chat_chunk("c", draw(_text))
    payload = json.dumps(obj, ensure_ascii=draw(st.booleans())).encode()
    return b"data: " + payload + eol + eol, kind == "usage"


# A keep-alive comment between events stays: the client would have seen it anyway.
_keepalive = st.tuples(st.sampled_from([b": keep-alive\n", b":\r\n", b": ping\r"]), st.just(False))
_chat_stream = st.lists(st.one_of(_chat_event(), _keepalive), max_size=10)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def _relay(chunks: list[bytes], limit: int = 1 << 20) -> bytes:
    """The relay's byte path with usage stripping on: decode, cut usage chunks, release."""
    decoder = SseDecoder(limit)
    cutter = EventCutter()
    out = bytearray()
    for chunk in chunks:
        for ev in decoder.feed(chunk):
            info = interpret(ev.data)
            if info is not None and info.usage_only:
                cutter.cut(ev.start_offset, ev.end_offset, ev.open_cr)
        out += cutter.push(chunk, decoder.boundary_offset)
    out += cutter.flush()
    return bytes(out)


@FUZZ
@given(_chat_stream, st.lists(st.integers(0, 1 << 16), max_size=16))
def test_relay_path_removes_exactly_the_usage_events_under_any_split(figures, events, cuts):
    figures.bad_inputs += 1
    raw = b"".join(e for e, _ in events)
    expected = b"".join(e for e, usage in events if not usage)
    assert _relay(_split(raw, cuts)) == expected


_FIRST_USAGE = b"data: " + json.dumps(usage_chunk("c", 1, 9)).encode() + b"\r\n\r\n"


@pytest.mark.parametrize(
    "then",
    [
        # the LF's cut is appended after the later event's: _release expects them sorted
        b"data: " + json.dumps(usage_chunk("c", 0, 0)).encode() + b"\n\n",
        # the later event also ends in a CR at the read's end: its _lf_at replaces ours
        b"data: " + json.dumps(usage_chunk("c", 0, 0)).encode() + b"\r\r",
    ],
    ids=["later-cut-listed-first", "later-open-cr-replaces-ours"],
)
def test_usage_event_split_between_cr_and_lf_is_removed_exactly(then):
    rest = b": keep-alive\n"
    raw = _FIRST_USAGE + rest + then
    cut = len(_FIRST_USAGE) - 1  # the first event's final CR ends one read, its LF starts the next
    assert _relay([raw[:cut], raw[cut:]]) == rest  # not b"\n" + rest


@FUZZ
@given(st.binary(max_size=2000), st.lists(st.integers(0, 1 << 12), max_size=16))
def test_relay_path_leaves_a_stream_without_usage_untouched(figures, raw, cuts):
    figures.bad_inputs += 1
    raw = raw.replace(b"usage", b"us_ge")  # no usage chunk can hide in random bytes
    assert _relay(_split(raw, cuts), limit=64) == raw


@FUZZ
@given(_chat_stream, st.data())
def test_relay_path_never_raises_on_cut_and_splice(figures, events, data):
    figures.bad_inputs += 1
    raw = b"".join(e for e, _ in events)
    if raw:
        a = data.draw(st.integers(0, len(raw)))
        b = data.draw(st.integers(a, len(raw)))
        c = data.draw(st.integers(0, len(raw)))
        raw = raw[:a] + raw[c:] + raw[a:b]
    cuts = data.draw(st.lists(st.integers(0, 1 << 14), max_size=12))
    whole = _relay([raw], limit=256)
    assert _relay(_split(raw, cuts), limit=256) == whole
    assert len(whole) <= len(raw)  # only ever removes (whole usage events)


# Huge (past the limit) and empty events among normal ones, with any line ends.
_sse_piece = st.one_of(
    st.tuples(st.just("normal"), st.binary(max_size=20).filter(lambda b: b"\n" not in b
                                                               and b"\r" not in b)),
    st.tuples(st.just("huge"), st.integers(65, 400)),
    st.tuples(st.just("empty"), st.just(0)),
    st.tuples(st.just("lines"), st.integers(1, 60)),
)  # fmt: skip


@st.composite
def _sse_stream(draw: st.DrawFn) -> bytes:
    out = b""
    for kind, arg in draw(st.lists(_sse_piece, max_size=12)):
        eol = draw(_eol)
        if isinstance(arg, bytes):
            out += b"data: " + arg + eol + eol
        elif kind == "huge":
            out += b"data: " + b"h" * arg + eol + eol
        elif kind == "empty":
            out += eol
        else:
            out += (b"data: y" + eol) * arg + eol
    return out


SKIP_ENDS_EARLY = (
    "bug: an oversized event whose overflow is found in a partial line ends at that line's "
    "LF (taken for a blank line), so its next lines become a bogus event"
)


@FUZZ
@example(raw=b"data: y\n" * 11 + b"\n\n", cuts=[79])
@given(_sse_stream(), st.lists(st.integers(0, 1 << 14), max_size=16))
def test_sse_huge_and_empty_events_split_anywhere(figures, raw, cuts):
    figures.bad_inputs += 1

    def run(chunks: list[bytes]) -> tuple[list[tuple[str, int, int]], int, int]:
        d = SseDecoder(64)
        # An event dispatched by a CR at the end of a read ends before the LF that may
        # follow (``open_cr``): count that LF in, as a whole read would have.
        evs = [(e.data, e.start_offset, e.end_offset + (e.open_cr and raw[e.end_offset:
                e.end_offset + 1] == b"\n")) for c in chunks for e in d.feed(c)]  # fmt: skip
        assert d.pending_bytes <= 64
        return evs, d.errors, d.boundary_offset

    whole = run([raw])
    assert run(_split(raw, cuts)) == whole
    assert all(len(data) <= 64 for data, _, _ in whole[0])


_SEVEN_BYTE_LINES = b"data: y\n" * 11 + b"\n"
_LONG_THEN_SHORT = b"data: " + b"h" * 100 + b"\ndata: zzz\ndata: y\n\n"


@pytest.mark.parametrize(
    ("raw", "cut"),
    [
        # the 10th 7-byte line passes the 64-byte limit while still partial (no LF yet)
        (_SEVEN_BYTE_LINES, 79),
        # already skipping, a read ends inside a line: the next read starts with its LF
        (_LONG_THEN_SHORT, _LONG_THEN_SHORT.index(b"zzz") + 3),
    ],
    ids=["overflow-in-partial-line", "read-ends-mid-line-while-skipping"],
)
def test_oversized_event_is_skipped_whole_wherever_the_read_ends(raw, cut):
    d = SseDecoder(64)
    assert d.feed(raw[:cut]) + d.feed(raw[cut:]) == []  # as when fed whole
    assert d.errors == 1


FAST_PATH_LOSES_A_BYTE = (
    "bug: SseDecoder's fast path drops a read's third trailing LF (an extra blank line) from "
    "its offsets, so every later offset is one short"
)


def test_read_ending_in_an_extra_blank_line_keeps_offsets_exact():
    d = SseDecoder()
    d.feed(b"data: a\n\n")
    d.feed(b"data: b\n\n\n")  # ends in an extra blank line
    assert d.offset == 9 + 10
    assert d.boundary_offset == d.offset


def test_offsets_one_short_alter_bytes_when_a_usage_event_is_cut():
    role = b"data: " + json.dumps(chat_chunk("c", "", role=True)).encode() + b"\n\n"
    token = b"data: " + json.dumps(chat_chunk("c", "hi")).encode() + b"\n\n\n"
    usage = b"data: " + json.dumps(usage_chunk("c", 1, 2)).encode() + b"\r\r"
    done = b"data: [DONE]\r\r"
    # The cut lands one byte early: the LF before the usage event goes, its last CR stays.
    assert _relay([role, token, usage, done]) == role + token + done


@FUZZ
@given(
    st.lists(st.one_of(st.binary(max_size=30), st.integers(50, 500).map(lambda n: b"{" * n),
                       st.just(b""), st.just(b"\r")), max_size=12),
    st.lists(st.integers(0, 1 << 13), max_size=12),
)  # fmt: skip
def test_ndjson_huge_and_empty_lines_split_anywhere(figures, lines, cuts):
    figures.bad_inputs += 1
    raw = b"\n".join(lines)

    def run(chunks: list[bytes]) -> tuple[list[tuple[str, int, int]], int]:
        d = NdjsonDecoder(48)
        out = [(ln.text, ln.start_offset, ln.end_offset) for c in chunks for ln in d.feed(c)]
        assert d.pending_bytes <= 48
        out += [(ln.text, ln.start_offset, ln.end_offset) for ln in d.close()]
        return out, d.errors

    assert run(_split(raw, cuts)) == run([raw])


_FORMATS = {fmt.name: fmt for fmt in ROUTES.values()}


@FUZZ
@given(_chat_stream, st.data())
def test_every_interpreter_survives_mutated_streams(figures, events, data):
    figures.bad_inputs += 1
    raw = b"".join(e for e, _ in events)
    if raw:
        a = data.draw(st.integers(0, len(raw)))
        b = data.draw(st.integers(a, len(raw)))
        raw = raw[:a] + data.draw(st.binary(max_size=8)) + raw[b:]
    sse = [(e.data, e.event) for e in SseDecoder(1 << 12).feed(raw)]
    lines = [ln.text for ln in NdjsonDecoder(1 << 12).feed(raw)]
    for fmt in _FORMATS.values():
        if fmt.framing is Framing.SSE:
            for d, name in sse:
                fmt.interpret(d, name)
        else:
            for line in lines:
                fmt.interpret(line, "")
