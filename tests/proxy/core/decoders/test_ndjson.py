"""The NDJSON line decoder: framing, split invariance, bounds, offsets."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.decoders.ndjson import NdjsonDecoder, NdjsonLine


def decode(chunks: list[bytes], limit: int = 1 << 20) -> tuple[list[NdjsonLine], NdjsonDecoder]:
    d = NdjsonDecoder(limit)
    out: list[NdjsonLine] = []
    for c in chunks:
        out.extend(d.feed(c))
    out.extend(d.close())
    return out, d


def texts(chunks: list[bytes], limit: int = 1 << 20) -> list[str]:
    return [ln.text for ln in decode(chunks, limit)[0]]


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def test_lines_lf_and_crlf():
    assert texts([b'{"a":1}\n{"b":2}\r\n{"c":3}\n']) == ['{"a":1}', '{"b":2}', '{"c":3}']


def test_blank_and_whitespace_lines_skipped_not_counted():
    lines, d = decode([b'\n\r\n  \t\n{"a":1}\n\n'])
    assert [ln.text for ln in lines] == ['{"a":1}']
    assert d.errors == 0


def test_lone_cr_is_not_a_separator():
    # JSON text cannot hold a raw CR inside a string; NDJSON separates on LF only.
    assert texts([b'{"a":\r1}\n']) == ['{"a":\r1}']


def test_unterminated_last_line_comes_with_close():
    d = NdjsonDecoder()
    assert d.feed(b'{"a":1}\n{"done":true}') == [NdjsonLine('{"a":1}', 0, 8)]
    assert d.pending_bytes == len(b'{"done":true}')
    assert d.close() == [NdjsonLine('{"done":true}', 8, 21)]
    assert d.pending_bytes == 0
    assert d.close() == []


def test_bom_at_start_only():
    assert texts([b"\xef\xbb", b'\xbf{"a":1}\n\xef\xbb\xbf{"b":2}\n']) == [
        '{"a":1}',
        '\ufeff{"b":2}',
    ]


def test_multibyte_character_split_across_reads():
    raw = '{"response":"× ✓"}\n'.encode()
    cut = raw.index("✓".encode()) + 1
    assert texts([raw[:cut], raw[cut:]]) == ['{"response":"× ✓"}']


def test_invalid_utf8_replaced_not_raised():
    assert texts([b'{"a":"\xff"}\n']) == ['{"a":"\ufffd"}']


def test_offsets_cover_each_line_exactly():
    raw = b'{"a":1}\n\n{"b":2}\r\n{"c":3}'
    lines, d = decode([raw])
    assert [raw[ln.start_offset : ln.end_offset] for ln in lines] == [
        b'{"a":1}\n',
        b'{"b":2}\r\n',
        b'{"c":3}',
    ]
    assert d.offset == len(raw)


def test_oversized_line_skipped_and_counted_next_line_kept():
    big = b'{"x":"' + b"y" * 5000 + b'"}\n'
    lines, d = decode([big[:100], big[100:3000], big[3000:], b'{"ok":1}\n'], limit=1024)
    assert [ln.text for ln in lines] == ['{"ok":1}']
    assert lines[0].start_offset == len(big)
    assert d.errors == 1
    assert d.pending_bytes == 0


def test_line_of_exactly_the_limit_is_kept():
    line = b"x" * 16
    assert texts([line + b"\n"], limit=16) == ["x" * 16]
    assert texts([line + b"x\n"], limit=16) == []
    assert texts([line], limit=16) == ["x" * 16]  # unterminated, at close


def test_oversized_unterminated_last_line_dropped_at_close():
    lines, d = decode([b"z" * 50], limit=10)
    assert lines == []
    assert d.errors == 1


def test_memory_bounded_without_newlines():
    d = NdjsonDecoder(4096)
    for _ in range(1000):
        d.feed(b"garbage-without-newline" * 10)
        assert d.pending_bytes <= 4096
    assert d.errors == 1


def test_limit_must_be_positive():
    with pytest.raises(ValueError, match="max_line_bytes"):
        NdjsonDecoder(0)


# A grammar of plausible NDJSON with LF and CRLF, blank lines and an optional BOM.
_eol = st.sampled_from([b"\n", b"\r\n"])
_value = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=40
).map(lambda s: s.encode())
_line = st.one_of(_value, st.just(b""), st.just(b"  ")).flatmap(lambda v: _eol.map(lambda e: v + e))
_stream = st.tuples(
    st.sampled_from([b"", b"\xef\xbb\xbf"]),
    st.lists(_line, max_size=15).map(b"".join),
    st.one_of(st.just(b""), _value),
).map(b"".join)


def _key(lines: list[NdjsonLine]) -> list[tuple[str, int, int]]:
    return [(ln.text, ln.start_offset, ln.end_offset) for ln in lines]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    _stream, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12), st.integers(1, 64)
)
def test_any_split_gives_same_lines(raw, cuts, limit):
    whole, d1 = decode([raw], limit)
    parts, d2 = decode(split_at(raw, cuts), limit)
    assert _key(parts) == _key(whole)
    assert d1.errors == d2.errors


@settings(max_examples=300)
@given(_stream)
def test_byte_by_byte_same_as_whole(raw):
    assert _key(decode([raw[i : i + 1] for i in range(len(raw))])[0]) == _key(decode([raw])[0])


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=200), max_size=20), st.integers(min_value=1, max_value=300))
def test_random_bytes_never_raise_and_stay_bounded(chunks, limit):
    d = NdjsonDecoder(limit)
    for c in chunks:
        for ln in d.feed(c):
            assert ln.start_offset < ln.end_offset <= d.offset
            assert len(ln.text.encode("utf-8", "surrogatepass")) >= 0
        assert d.pending_bytes <= limit
    for ln in d.close():
        assert ln.end_offset == d.offset


@settings(max_examples=300)
@given(_stream, st.data())
def test_cut_and_splice_mutations_never_raise(raw, data):
    if raw:
        a = data.draw(st.integers(0, len(raw)))
        b = data.draw(st.integers(a, len(raw)))
        c = data.draw(st.integers(0, len(raw)))
        raw = raw[:a] + raw[c:] + raw[a:b]
    decode(split_at(raw, data.draw(st.lists(st.integers(0, 1000), max_size=5))), limit=32)
