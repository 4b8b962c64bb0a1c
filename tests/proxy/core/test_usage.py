"""Usage injection and byte-exact removal of the usage chunk, under any split."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.decoders.openai import interpret
from proxy.core.decoders.sse import SseDecoder
from proxy.core.usage import EventCutter, inject, wants_injection


def test_wants_injection_only_for_streams_without_a_choice():
    assert wants_injection({"stream": True})
    assert wants_injection({"stream": True, "stream_options": None})
    assert not wants_injection({"stream": True, "stream_options": {"include_usage": False}})
    assert not wants_injection({"stream": True, "stream_options": {"include_usage": True}})
    assert not wants_injection({"stream": True, "stream_options": {}})
    assert not wants_injection({"stream": False})
    assert not wants_injection({})


def test_inject_keeps_every_other_byte():
    raw = b'  {"model": "m",  "stream": true, "x": 1.0e-5}'
    out = inject(raw)
    assert (
        out
        == b'  {"stream_options":{"include_usage":true},"model": "m",  "stream": true, "x": 1.0e-5}'
    )
    assert json.loads(out)["stream_options"] == {"include_usage": True}


def test_inject_empty_object_and_non_object():
    assert json.loads(inject(b"{}")) == {"stream_options": {"include_usage": True}}
    assert json.loads(inject(b"{ }")) == {"stream_options": {"include_usage": True}}
    assert inject(b"[1]") is None
    assert inject(b"") is None


ROLE = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
TOK = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}'
DONE = b"data: [DONE]"


def strip_run(chunks: list[bytes]) -> tuple[bytes, int]:
    dec, cut = SseDecoder(), EventCutter()
    out = bytearray()
    usage_seen = 0
    for c in chunks:
        for ev in dec.feed(c):
            info = interpret(ev.data)
            if info is not None and info.usage_only:
                usage_seen += 1
                cut.cut(ev.start_offset, ev.end_offset, ev.open_cr)
        out += cut.push(c, dec.boundary_offset)
    out += cut.flush()
    return bytes(out), usage_seen


_eol = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=500)
@given(
    st.lists(st.sampled_from([TOK, b": keep-alive"]), max_size=6),
    _eol,
    st.lists(st.integers(0, 2000), max_size=10),
    st.booleans(),
)
def test_usage_chunk_removed_byte_exactly_under_any_split(middle, eol, cuts, trailing_garbage):
    def ev(line: bytes) -> bytes:
        return line + eol + eol

    kept = [ev(ROLE), *[ev(m) for m in middle]]
    tail = [ev(DONE)] + ([b"data: partial-without-end"] if trailing_garbage else [])
    upstream = b"".join([*kept, ev(USAGE), *tail])
    expected = b"".join([*kept, *tail])
    points = sorted({c % (len(upstream) + 1) for c in cuts})
    chunks, last = [], 0
    for p in points:
        chunks.append(upstream[last:p])
        last = p
    chunks.append(upstream[last:])
    out, seen = strip_run(chunks)
    assert seen == 1
    assert out == expected


def test_complete_events_released_at_once_partial_held():
    dec, cut = SseDecoder(), EventCutter()
    first = TOK + b"\n\n"
    chunk = first + b'data: {"par'
    dec.feed(chunk)
    assert cut.push(chunk, dec.boundary_offset) == first
    rest = b'tial":1}\n\n'
    dec.feed(rest)
    assert cut.push(rest, dec.boundary_offset) == b'data: {"partial":1}\n\n'


def test_fast_path_returns_the_same_object():
    dec, cut = SseDecoder(), EventCutter()
    chunk = TOK + b"\n\n"
    dec.feed(chunk)
    assert cut.push(chunk, dec.boundary_offset) is chunk
