"""The SSE decoder: WHATWG rules, split invariance, bounds, offsets."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.decoders.sse import SseDecoder, SseEvent


def decode(chunks: list[bytes], limit: int = 1 << 20) -> tuple[list[tuple[str, str]], SseDecoder]:
    d = SseDecoder(limit)
    out: list[SseEvent] = []
    for c in chunks:
        out.extend(d.feed(c))
    return [(e.event, e.data) for e in out], d


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    parts, last = [], 0
    for p in points:
        parts.append(data[last:p])
        last = p
    parts.append(data[last:])
    return parts


def test_basic_events_and_done():
    raw = b'data: {"a":1}\n\ndata: [DONE]\n\n'
    assert decode([raw])[0] == [("message", '{"a":1}'), ("message", "[DONE]")]


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_line_endings(eol):
    raw = b"event: x" + eol + b"data: one" + eol + b"data: two" + eol + eol + b"data:3" + eol + eol
    assert decode([raw])[0] == [("x", "one\ntwo"), ("message", "3")]


def test_comments_and_unknown_fields_ignored():
    raw = b": keep-alive\n\nretry: 10\nfoo: bar\ndata: x\n\n"
    assert decode([raw])[0] == [("message", "x")]


def test_field_without_colon_and_no_space():
    # "data" alone is an empty data line; "data:x" has no space to strip.
    raw = b"data\ndata:x\n\n"
    assert decode([raw])[0] == [("message", "\nx")]


def test_only_one_leading_space_stripped():
    assert decode([b"data:  two spaces\n\n"])[0] == [("message", " two spaces")]


def test_blank_line_without_data_dispatches_nothing():
    assert decode([b"event: ping\n\n\n\n"])[0] == []


def test_bom_at_start_only():
    assert decode([b"\xef\xbb\xbfdata: a\n\n"])[0] == [("message", "a")]


def test_bom_alone_on_the_first_line():
    assert decode([b"\xef\xbb\xbf\ndata: a\n\n"])[0] == [("message", "a")]
    assert decode([b"\xef\xbb", b"\xbf\n", b"data: b\n\n"])[0] == [("message", "b")]


def test_cr_split_from_lf_across_reads():
    events, d = decode([b"data: a\r", b"\ndata: b\r\n\r", b"\n"])
    assert events == [("message", "a\nb")]
    assert d.boundary_offset == d.offset


def test_multibyte_character_split_across_reads():
    raw = "data: héllo ✓\n\n".encode()
    cut = raw.index(b"\xe2") + 1
    assert decode([raw[:cut], raw[cut:]])[0] == [("message", "héllo ✓")]


def test_invalid_utf8_replaced_not_raised():
    assert decode([b"data: \xff\xfe\n\n"])[0] == [("message", "\ufffd\ufffd")]


def test_oversized_event_skipped_and_counted_next_event_kept():
    big = b"data: " + b"x" * 5000 + b"\n\n"
    events, d = decode([big[:100], big[100:3000], big[3000:], b"data: ok\n\n"], limit=1024)
    assert events == [("message", "ok")]
    assert d.errors == 1
    assert d.pending_bytes == 0


def test_oversized_across_many_small_lines():
    many = b"".join(b"data: " + b"y" * 100 + b"\n" for _ in range(50)) + b"\n"
    events, d = decode([many, b"data: z\n\n"], limit=1024)
    assert events == [("message", "z")]
    assert d.errors == 1


def test_memory_bounded_without_newlines():
    d = SseDecoder(4096)
    for _ in range(1000):
        d.feed(b"garbage-without-newline" * 10)
        assert d.pending_bytes <= 4096
    assert d.errors == 1


def test_offsets_cover_each_event_exactly():
    raw = b": hi\n\ndata: a\n\nid: 7\ndata: b\r\n\r\n"
    d = SseDecoder()
    evs = d.feed(raw)
    assert [raw[e.start_offset : e.end_offset] for e in evs] == [
        b"data: a\n\n",
        b"id: 7\ndata: b\r\n\r\n",
    ]
    assert evs[1].last_event_id == "7"
    assert d.boundary_offset == len(raw)


def test_boundary_after_keepalive_comment_without_blank_line():
    d = SseDecoder()
    d.feed(b"data: a\n\n: ping\n")
    assert d.boundary_offset == len(b"data: a\n\n: ping\n")
    d.feed(b"data: partial")
    assert d.boundary_offset == len(b"data: a\n\n: ping\n")


# A grammar of plausible streams with every line-ending style mixed in.
_eol = st.sampled_from([b"\n", b"\r", b"\r\n"])
_value = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=30
).map(lambda s: s.encode())
_line = st.one_of(
    st.tuples(st.just(b"data: "), _value),
    st.tuples(st.just(b"data:"), _value),
    st.tuples(st.just(b"event: "), _value),
    st.tuples(st.just(b": "), _value),
    st.tuples(st.just(b"id: "), _value),
).map(b"".join)
_event = st.tuples(st.lists(st.tuples(_line, _eol), max_size=5), _eol).map(
    lambda t: b"".join(a + b for a, b in t[0]) + t[1]
)
_stream = st.lists(_event, max_size=12).map(b"".join)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_stream, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_gives_same_events(raw, cuts):
    whole, d1 = decode([raw])
    parts, d2 = decode(split_at(raw, cuts))
    assert parts == whole
    assert d1.boundary_offset == d2.boundary_offset


@settings(max_examples=300)
@given(_stream)
def test_byte_by_byte_same_as_whole(raw):
    assert decode([raw[i : i + 1] for i in range(len(raw))])[0] == decode([raw])[0]


@settings(max_examples=300)
@given(
    st.lists(st.binary(max_size=200), max_size=20),
    st.integers(min_value=1, max_value=300),
)
def test_random_bytes_never_raise_and_stay_bounded(chunks, limit):
    d = SseDecoder(limit)
    for c in chunks:
        for ev in d.feed(c):
            assert ev.end_offset <= d.offset
        assert d.pending_bytes <= limit
        assert d.boundary_offset <= d.offset


@settings(max_examples=300)
@given(_stream, st.data())
def test_cut_and_splice_mutations_never_raise(raw, data):
    if raw:
        a = data.draw(st.integers(0, len(raw)))
        b = data.draw(st.integers(a, len(raw)))
        c = data.draw(st.integers(0, len(raw)))
        mutated = raw[:a] + raw[c:] + raw[a:b]
    else:
        mutated = raw
    decode(split_at(mutated, data.draw(st.lists(st.integers(0, 1000), max_size=5))), limit=64)


def test_limit_must_be_positive():
    with pytest.raises(ValueError, match="max_event_bytes"):
        SseDecoder(0)


def test_skip_event_moves_on_as_feed_would_and_only_at_rest():
    event = b'data: {"a":1}\n\n'
    fed, skipped = SseDecoder(), SseDecoder()
    for d in (fed, skipped):
        d.feed(b": hi\n\n")
    fed.feed(event)
    assert skipped.skip_event(len(event))
    assert (skipped.offset, skipped.boundary_offset) == (fed.offset, fed.boundary_offset)
    # Then both decode the same next events.
    assert skipped.feed(event) == fed.feed(event)
    assert not SseDecoder().skip_event(len(event))  # before the first line: BOM check pending
    mid = SseDecoder()
    mid.feed(b": hi\n\ndata: {")
    assert not mid.skip_event(len(event))
    assert mid.feed(b'"a":1}\n\n')[0].data == '{"a":1}'
    small = SseDecoder(max_event_bytes=4)
    small.feed(b": hi\n\n")
    assert not small.skip_event(len(event))


# The stream's first read through the fast paths (whole one-line events, LF endings) against
# the general path (one byte a read), then a second read: the BOM is stripped at the start
# of the stream only.
_plain_event = st.one_of(
    st.tuples(st.sampled_from([b"data: ", b"data:"]), _value, st.just(b"\n\n")),
    st.tuples(st.just(b": "), _value, st.just(b"\n\n")),
).map(b"".join)
_BOM = b"\xef\xbb\xbf"


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(_plain_event, min_size=1, max_size=4).map(b"".join),
    st.booleans(),
    st.lists(_plain_event, max_size=2).map(b"".join),
)
def test_first_read_fast_path_same_as_general(first, bom, second):
    first = _BOM + first if bom else first
    second = _BOM + second
    fast = SseDecoder()
    general = SseDecoder()
    got = [*fast.feed(first), *fast.feed(second)]
    want = [e for i in range(len(first)) for e in general.feed(first[i : i + 1])]
    want += [e for i in range(len(second)) for e in general.feed(second[i : i + 1])]
    assert got == want
    assert fast.boundary_offset == general.boundary_offset
