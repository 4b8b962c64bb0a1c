"""The token shape: learned from one plain output event, matching exactly what a parse would say,
of the same kind (answer or reasoning) and the same choice."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.decoders.openai import OUTPUT, REASONING, interpret
from proxy.core.decoders.shape import TokenShape, _index_zeros, _leading_digits
from proxy.core.decoders.sse import SseDecoder

VLLM = (
    b'data: {"id":"chatcmpl-9f2","object":"chat.completion.chunk","created":1733000009,'
    b'"model":"qwen","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,'
    b'"finish_reason":null}]}\n\n'
)
LLAMACPP = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],'
    b'"created":1733000009,"id":"chatcmpl-x1","model":"tiny","system_fingerprint":"b1-7e1",'
    b'"object":"chat.completion.chunk"}\n\n'
)
COMPLETIONS = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":17,"model":"m",'
    b'"choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":null}]}\n\n'
)
SPACED = (  # Python's json.dumps separators
    b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "x"}, '
    b'"finish_reason": null}], "created": 1733000009}\n\n'
)
STAMPED = (  # the bench backend's chunk: a digit string that changes every token
    b'data: {"id":"chatcmpl-a","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}],'
    b'"bench_send_ns":"00001234567890123456"}\n\n'
)

VLLM_THINKING = VLLM.replace(b'{"content":" hello"}', b'{"reasoning_content":" hmm"}')
VLLM_REASONING = VLLM.replace(b'{"content":" hello"}', b'{"reasoning":" hmm"}')
LLAMACPP_THINKING = LLAMACPP.replace(
    b'{"content":"Hi"}', b'{"content":null,"reasoning_content":"So"}'
)
ANSWER_NULL_REASONING = VLLM.replace(
    b'{"content":" hello"}', b'{"content":"x","reasoning_content":null}'
)
THINKING = (VLLM_THINKING, VLLM_REASONING, LLAMACPP_THINKING)
ANSWERS = (VLLM, LLAMACPP, COMPLETIONS, SPACED, STAMPED, ANSWER_NULL_REASONING)


def parsed(event: bytes) -> object:
    """What the general path says: the one event's meaning, interpreted with the ids known."""
    decoder = SseDecoder()
    decoder.feed(b": ready\n\n")
    events = decoder.feed(event)
    return interpret(events[0].data, known_ids=True) if len(events) == 1 else None


def parsed_output(event: bytes) -> bool:
    """The general path finds one answer event of choice 0."""
    return parsed(event) is OUTPUT


def _string_key(event: bytes) -> bytes:
    for key in (b'"text":', b'"reasoning_content":', b'"reasoning":', b'"content":'):
        if key in event and event[event.index(key) + len(key) :].lstrip()[:1] == b'"':
            return key
    raise AssertionError(event)


@pytest.mark.parametrize("event", [*ANSWERS, *THINKING])
def test_learns_the_usual_token_and_matches_the_next(event):
    shape = TokenShape.learn(event)
    assert shape is not None
    assert shape.reasoning is (event in THINKING)
    assert shape.matches(event)
    key = _string_key(event)
    at = event.index(key) + len(key)
    at = event.index(b'"', at) + 1
    end = event.index(b'"', at)
    other = event[:at] + "ein Wort 🙂".encode() + event[end:]
    assert shape.matches(other)
    assert parsed(other) is (REASONING if shape.reasoning else OUTPUT)


@pytest.mark.parametrize(("learned", "other"), [
    (VLLM, VLLM_THINKING), (VLLM_THINKING, VLLM), (VLLM_REASONING, VLLM_THINKING),
    (LLAMACPP_THINKING, LLAMACPP.replace(b'{"content":"Hi"}', b'{"content":"Hi","reasoning_content":null}')),
    (ANSWER_NULL_REASONING, ANSWER_NULL_REASONING.replace(b'"content":"x","reasoning_content":null', b'"content":null,"reasoning_content":"x"')),
    (LLAMACPP_THINKING, LLAMACPP_THINKING.replace(b'"content":null', b'"content":"a"')),
])  # fmt: skip
def test_a_shape_never_passes_an_event_of_the_other_kind(learned, other):
    shape = TokenShape.learn(learned)
    assert shape is not None
    assert not shape.matches(other)


@pytest.mark.parametrize("event", [VLLM, LLAMACPP, SPACED, VLLM_THINKING])
def test_a_shape_never_passes_another_choice(event):
    """With n > 1 the choices interleave: choice 1's token is not choice 0's."""
    shape = TokenShape.learn(event)
    assert shape is not None
    other = event.replace(b'"index":0', b'"index":1').replace(b'"index": 0', b'"index": 1')
    assert other != event
    assert not shape.matches(other)
    assert parsed(other) not in (OUTPUT, REASONING)


def test_ticking_digits_match():
    shape = TokenShape.learn(STAMPED)
    assert shape is not None
    later = STAMPED.replace(b"00001234567890123456", b"00009876543210987654")
    assert shape.matches(later)
    assert parsed_output(later)
    ticked = LLAMACPP.replace(b"1733000009", b"1733000010")
    llama = TokenShape.learn(LLAMACPP)
    assert llama is not None
    assert llama.matches(ticked)


@pytest.mark.parametrize(
    "change",
    [
        (b'"finish_reason":null', b'"finish_reason":"stop"'),
        (b'"finish_reason":null', b'"finish_reason":1234'),
        (b" hello", b""),  # empty content: not an output event
        (b" hello", b'a\\"b'),  # an escape: decoded the general way
        (b" hello", b"a\\nb"),
        (b" hello", b"a\tb"),  # a raw control byte: not valid JSON
        (b"chatcmpl-9f2", b"chatcmpl-9f3x"),
        (b"1733000009", b"0733000009"),  # a leading zero: not valid JSON
        (b"}]}\n\n", b'}],"usage":{"prompt_tokens":1}}\n\n'),
        (b"\n\n", b"\r\n\r\n"),
        (b"data: ", b"event: x\ndata: "),
    ],
)
def test_anything_else_does_not_match(change):
    shape = TokenShape.learn(VLLM)
    assert shape is not None
    old, new = change
    assert not shape.matches(VLLM.replace(old, new, 1))


@pytest.mark.parametrize(
    "event",
    [
        VLLM.replace(b'"finish_reason":null', b'"finish_reason":"length"'),
        VLLM.replace(b" hello", b""),
        VLLM.replace(b" hello", b"new\\nline"),  # an escape anywhere: not learned
        VLLM.replace(b"}]}\n\n", b'}],"usage":{"prompt_tokens":1}}\n\n'),
        VLLM.replace(b"}]}\n\n", b'},{"index":1,"delta":{"content":"b"}}]}\n\n'),
        VLLM.replace(b"}]}\n\n", b'}],"error":{"type":"x"}}\n\n'),
        VLLM.replace(b'"model":"qwen"', b'"model":"qwen","message":{"content":"x"}'),
        VLLM.replace(b'{"content":" hello"}', b'{"tool_calls":[{"index":0}]}'),
        VLLM.replace(b'{"content":" hello"}', b'{"content":"a","tool_calls":[{"index":0}]}'),
        VLLM.replace(b'{"content":" hello"}', b'{"reasoning":"a","reasoning_content":"a"}'),
        VLLM.replace(b'"index":0', b'"index":1'),
        VLLM.replace(b"\n\n", b"\n"),
        b"data: [DONE]\n\n",
        b'data: {"choices":[{"delta":{"content":"a"}}]\n\n',  # cut short: not JSON
    ],
)
def test_only_plain_output_events_are_learned(event):
    assert TokenShape.learn(event) is None


_content = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=12
)
_digits = st.text(alphabet="0123456789", min_size=1, max_size=1)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([*ANSWERS, *THINKING]),
    st.lists(st.tuples(st.integers(min_value=0, max_value=400), _digits), max_size=6),
    _content,
    st.lists(st.tuples(st.integers(min_value=0, max_value=400), st.binary(max_size=2))),
)
def test_a_match_is_always_what_the_parse_says(template, digit_edits, content, byte_edits):
    """Mutate digits, the content and random bytes: whenever the shape matches, the
    general path finds exactly one output event too, of the same kind and choice 0."""
    shape = TokenShape.learn(template)
    assert shape is not None
    event = bytearray(template)
    for where, d in digit_edits:
        pos = where % len(event)
        if 0x30 <= event[pos] <= 0x39:
            event[pos] = ord(d)
    key = _string_key(template)
    at = template.index(b'"', template.index(key) + len(key)) + 1
    end = template.index(b'"', at)
    event[at:end] = content.encode()
    for where, new in byte_edits:
        pos = where % len(event)
        event[pos : pos + 1] = new
    raw = bytes(event)
    if shape.matches(raw):
        assert parsed(raw) is (REASONING if shape.reasoning else OUTPUT)


@pytest.mark.parametrize(
    ("part", "base", "in_string", "expected"),
    [
        (b'data: {"a":12,"b":"34","c":5,"d":678,"e":"x9"', 0, False, (11, 33)),
        (b'7" ,"n":00,"s":"11","m":1.25}\n\n', -31, True, (-23, -5)),
        (b"no quote closes 12 this", -23, True, ()),
        (b'"open 12', 0, False, ()),
        (b"1234", 0, False, (0,)),
    ],
)
def test_leading_digits_are_the_multi_digit_runs_outside_strings(part, base, in_string, expected):
    """Where a later event's ``0`` would be a leading zero: runs of two digits or more, not in
    a string (a part of the event's tail starts inside the output string)."""
    assert _leading_digits(part, base, in_string) == expected


# The shape's set-up against the one-pass regular expressions it replaced (the reference).
_REF_RUN_OUTSIDE = re.compile(rb'"[^"]*"?|([0-9]{2,})')
_REF_INDEX = re.compile(rb'"index": ?0')


def _ref_leading_digits(part: bytes, base: int, in_string: bool) -> tuple[int, ...]:
    start = 0
    if in_string:
        start = part.find(b'"') + 1
        if start == 0:
            return ()
    return tuple(base + m.start(1) for m in _REF_RUN_OUTSIDE.finditer(part, start) if m.lastindex)


_PART = st.lists(
    st.sampled_from([b'"', b"0", b"1", b"7", b"12", b"00", b".", b"-", b"e", b":", b" ", b",",
                     b"a", b"{", b"}", b'"index":', b'"index": ', b"\n", b"\xc3\xa9"]),
    max_size=40,
).map(b"".join)  # fmt: skip


@settings(max_examples=3000, deadline=None)
@given(part=_PART, base=st.integers(-100, 100), in_string=st.booleans())
def test_leading_digits_and_index_zeros_as_the_reference_finds_them(part, base, in_string):
    assert _leading_digits(part, base, in_string) == _ref_leading_digits(part, base, in_string)
    want = tuple(base + m.end() - 1 for m in _REF_INDEX.finditer(part))
    assert _index_zeros(part, base) == want
