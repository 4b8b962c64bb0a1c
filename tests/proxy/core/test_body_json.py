"""The request body parse reads every body exactly as ``json.loads`` does."""

from __future__ import annotations

import codecs
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.core.body_json import parse_object


def reference(body: bytes) -> Any:
    """What the proxy did before: ``json.loads``, an object or ``None``."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down: key order, int vs float, -0.0, NaN.

    A loop, not recursion: the bodies nest deeper than Python's stack allows."""
    todo = [(a, b)]
    while todo:
        x, y = todo.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if list(x) != list(y):
                return False
            todo.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            todo.extend(zip(x, y, strict=True))
        elif isinstance(x, float):
            if not (math.isnan(x) and math.isnan(y)) and (
                x != y or math.copysign(1, x) != math.copysign(1, y)
            ):
                return False
        elif x != y:
            return False
    return True


def check(body: bytes) -> None:
    try:
        want = reference(body)
    except RecursionError:  # too deep for json: not read, the body goes on unobserved
        assert parse_object(body) is None
        return
    got = parse_object(body)
    assert same(got, want), (body[:300], got, want)


def nested(depth: int, pad: int = 0) -> bytes:
    return b'{"model":"m","p":"' + b"x" * pad + b'","x":' + b"[" * depth + b"]" * depth + b"}"


ODD_BODIES = [
    b'{"model":"m","stream":true}',
    b'{"model":"m","model":"n"}',  # duplicate keys: the last value, the first place
    b'{"stream":true,"model":"m","stream":false}',
    b'{"stream_options":{"include_usage":false},"stream":true,"stream_options":null}',
    b'{"max_tokens":%d}' % (2**63 - 1),
    b'{"max_tokens":%d}' % 2**63,
    b'{"max_tokens":%d}' % (2**64 - 1),
    b'{"max_tokens":%d}' % 2**64,  # orjson: a float
    b'{"max_tokens":%d}' % -(2**63),
    b'{"max_tokens":%d}' % (-(2**63) - 1),  # orjson: a float
    b'{"seed":123456789012345678901234567890}',
    b'{"x":[1,-9999999999999999999,2]}',
    b'{"temperature":NaN}',
    b'{"temperature":Infinity,"top_p":-Infinity}',
    b'{"temperature":1e400}',  # json: inf; orjson refuses
    b'{"temperature":-1e999}',
    b'{"temperature":1e-400}',
    b'{"temperature":4.9e-324,"top_p":2.2250738585072014e-308}',
    b'{"temperature":0.1,"top_p":1.7976931348623157e308}',
    b'{"temperature":-0.0,"n":-0}',
    b'{"temperature":1E2,"top_p":1e+2,"top_k":1.5e-2}',
    b'{"prompt":"\\ud800"}',  # a lone surrogate, escaped
    b'{"prompt":"\\udc00\\ud800"}',
    b'{"prompt":"\\ud83d\\ude00"}',  # a pair: one character
    b'{"prompt":"\xed\xa0\x80"}',  # a surrogate encoded: json reads it (surrogatepass)
    b'{"prompt":"\xc3"}',  # invalid UTF-8
    b'{"prompt":"\xff"}',
    codecs.BOM_UTF8 + b'{"model":"m"}',
    '{"model":"m"}'.encode("utf-16"),
    '{"model":"m"}'.encode("utf-16-le"),
    '{"model":"m"}'.encode("utf-32"),
    '{"model":"m"}'.encode("utf-32-be"),
    b' \t\r\n{"model" : "m" ,\n"n":1}\r\n ',
    b'\x0c{"model":"m"}',
    b'{"model":"m"}\x00',
    b'{"model":"m"} {"model":"n"}',
    b'{"prompt":"a\x1fb"}',  # a raw control character
    b'{"prompt":"a\x7fb\\u0000"}',
    b'{"model":"m",}',
    b'{"n":01}',
    b'{"n":.5}',
    b'{"n":+1}',
    b"{'model':'m'}",
    b'{"model":True}',
    b"",
    b"null",
    b"[1,2]",
    b'"text"',
    b"{}",
    b'{"":{"":{"":[[],{}]}}}',
    nested(100),
    nested(500),
    nested(600),
    nested(600, pad=2000),
    nested(1000),
    nested(1023, pad=2000),
    nested(1024),
    nested(5000),
    b'{"prompt":"' + b"7" * 40 + b'"}',  # digits in a string: json, same answer
    b'{"x":[' + b"{}," * 600 + b"{}]}",  # many openers, shallow
]


@pytest.mark.parametrize("body", ODD_BODIES, ids=range(len(ODD_BODIES)))
def test_odd_bodies_read_as_json_reads_them(body):
    check(body)


def test_the_fast_path_is_taken_for_a_plain_body():
    """Not a behaviour, but what the module is for: a usual body never reaches ``json``."""
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10}'
    assert parse_object(body) == json.loads(body)
    assert parse_object(nested(600)) == reference(nested(600))


# Number literals as written: ints of any length, fractions, exponents (any JSON number).
_NUMBER = st.from_regex(r"\A-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?\Z")
_WS = st.sampled_from(["", "", "", " ", "\n", "\t", "\r\n", "  ", "\x0c", "\xa0"])
_KEYS = st.sampled_from(
    ["model", "stream", "max_tokens", "n", "prompt", "messages", "stream_options", "", "k\u00e9"]
)


def _string(s: str, ascii_: bool) -> str:
    return json.dumps(s, ensure_ascii=ascii_)


_SCALAR = st.one_of(
    _NUMBER,
    st.integers().map(str),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),
    st.builds(_string, st.text(), st.booleans()),
    st.sampled_from(["true", "false", "null", "NaN", "-Infinity", "True", "nul", "1.", "-"]),
)


def _container(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    items = st.lists(children, max_size=5)
    pairs = st.lists(st.tuples(_KEYS.map(json.dumps), children), max_size=5)
    return st.one_of(
        st.builds(lambda xs, w: "[" + ("," + w).join(xs) + "]", items, _WS),
        st.builds(
            lambda ps, w: "{" + ",".join(f"{w}{k}{w}:{w}{v}" for k, v in ps) + "}", pairs, _WS
        ),
    )


_VALUES = st.recursive(_SCALAR, _container, max_leaves=20)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Mostly JSON objects (duplicate keys, odd numbers and strings), sometimes broken."""
    pairs = draw(st.lists(st.tuples(_KEYS.map(json.dumps), _VALUES), max_size=6))
    ws = draw(_WS)
    text = ws + "{" + ",".join(f"{k}{ws}:{v}" for k, v in pairs) + "}" + draw(_WS)
    encoding = draw(st.sampled_from(["utf-8"] * 8 + ["utf-8-sig", "utf-16"]))
    raw = text.encode(encoding, "surrogatepass")
    if draw(st.integers(0, 9)) == 0:  # cut and splice
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=4)) + raw[at + draw(st.integers(0, 3)) :]
    return raw


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
@example(b'{"n":-9223372036854775809}')
@example(b'{"n":18446744073709551616}')
@example(b'{"n":1.0000000000000002}')
def test_any_body_reads_as_json_reads_it(body):
    check(body)
