"""The forwarded header sets are the ones the plain per-field filter gives.

``proxy.edge.headers`` copies a header set whole and removes the dropped names after
(``popall``), with the ``Connection`` listing cached; ``_reference_filtered`` below is
the rule as first written (each name lowered and kept unless it is to be dropped).
Both must give the same fields, in the same order, with the names as sent.
"""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.edge import headers as H
from proxy.edge.headers import Headers, client_response_headers, upstream_request_headers


def _reference_listed(headers: Headers) -> frozenset[str]:
    listed: set[str] = set()
    for value in headers.getall("Connection", ()):
        listed.update(t.strip().lower() for t in value.split(",") if t.strip())
    return frozenset(listed)


def _reference_filtered(headers: Headers, skip: frozenset[str]) -> CIMultiDict[str]:
    if "Connection" in headers:
        skip = skip | _reference_listed(headers)
    return CIMultiDict([(k, v) for k, v in headers.items() if k.lower() not in skip])


def _reference_upstream(
    headers: Headers, *, client_ip: str | None, scheme: str, identity: bool, trust: bool
) -> CIMultiDict[str]:
    out = _reference_filtered(headers, H._REQUEST_SKIP if trust else H._REQUEST_SKIP_UNTRUSTED)
    if client_ip:
        prior = headers.get("X-Forwarded-For") if trust else None
        out["X-Forwarded-For"] = f"{prior}, {client_ip}" if prior else client_ip
    if "X-Forwarded-Proto" not in out:
        out["X-Forwarded-Proto"] = scheme
    if identity:
        out["Accept-Encoding"] = "identity"
    return out


def _reference_client(headers: Headers, *, keep_length: bool) -> CIMultiDict[str]:
    return _reference_filtered(
        headers, H._RESPONSE_SKIP if keep_length else H._RESPONSE_SKIP_LENGTH
    )


_KNOWN = sorted(
    H.HOP_BY_HOP | H._REQUEST_DROP | H._RESPONSE_DROP | H.FORWARDING
    | {"accept-encoding", "authorization", "content-type", "x-custom", "close", "ß", "ǆx"}
)  # fmt: skip


@st.composite
def _names(draw: st.DrawFn) -> str:
    base = draw(
        st.sampled_from(_KNOWN)
        | st.text(string.ascii_letters + string.digits + "-_!#", min_size=1, max_size=8)
        | st.text(min_size=1, max_size=4)  # any characters: the case rules must agree too
    )
    # The name as a client may spell it: any mix of case.
    flips = draw(st.lists(st.booleans(), min_size=len(base), max_size=len(base)))
    return "".join(c.upper() if f else c for c, f in zip(base, flips, strict=True))


@st.composite
def _connection_values(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(_names() | st.just("") | st.just(" "), max_size=4))
    return ",".join(f" {t} " if draw(st.booleans()) else t for t in tokens)


_FIELDS = st.lists(
    st.tuples(_names(), st.text(max_size=6))
    | st.tuples(st.sampled_from(["Connection", "connection", "CONNECTION"]), _connection_values()),
    max_size=14,
)


def _as_sent(out: CIMultiDict[str]) -> list[tuple[str, str]]:
    return list(out.items())


@given(
    fields=_FIELDS,
    proxy=st.booleans(),
    client_ip=st.sampled_from([None, "", "10.0.0.1"]),
    identity=st.booleans(),
    trust=st.booleans(),
)
def test_upstream_request_headers_are_the_per_field_filters(
    fields: list[tuple[str, str]], proxy: bool, client_ip: str | None, identity: bool, trust: bool
) -> None:
    given_headers: Headers = CIMultiDict(fields)
    if proxy:  # as aiohttp's server hands them over
        given_headers = CIMultiDictProxy(CIMultiDict(fields))
    kw = {"client_ip": client_ip, "scheme": "http", "identity": identity, "trust": trust}
    got = upstream_request_headers(given_headers, **kw)  # type: ignore[arg-type]
    assert _as_sent(got) == _as_sent(_reference_upstream(given_headers, **kw))  # type: ignore[arg-type]
    assert _as_sent(CIMultiDict(given_headers)) == fields  # the client's set is not changed


@given(fields=_FIELDS, keep_length=st.booleans())
def test_client_response_headers_are_the_per_field_filters(
    fields: list[tuple[str, str]], keep_length: bool
) -> None:
    up = CIMultiDictProxy(CIMultiDict(fields))
    got = client_response_headers(up, keep_length=keep_length)
    assert _as_sent(got) == _as_sent(_reference_client(up, keep_length=keep_length))


# Header sets as real clients and servers send them (names as they spell them).
_REAL_REQUESTS = [
    [  # httpx / the OpenAI Python SDK
        ("Host", "127.0.0.1:8080"),
        ("Accept-Encoding", "gzip, deflate"),
        ("Connection", "keep-alive"),
        ("Accept", "application/json"),
        ("Content-Type", "application/json"),
        ("User-Agent", "OpenAI/Python 1.54.0"),
        ("X-Stainless-Lang", "python"),
        ("Authorization", "Bearer sk-test"),
        ("Content-Length", "123"),
    ],
    [  # curl
        ("Host", "localhost:8080"),
        ("User-Agent", "curl/8.5.0"),
        ("Accept", "*/*"),
        ("Content-Type", "application/json"),
        ("Content-Length", "88"),
    ],
    [  # aiohttp's client
        ("Host", "127.0.0.1:8080"),
        ("Accept", "*/*"),
        ("Accept-Encoding", "gzip, deflate, br"),
        ("User-Agent", "Python/3.11 aiohttp/3.10.10"),
        ("Content-Length", "57"),
        ("Content-Type", "application/json"),
    ],
    [  # behind nginx, asking to close, naming a field of its own as hop-by-hop
        ("host", "proxy.internal"),
        ("x-real-ip", "10.1.2.3"),
        ("x-forwarded-for", "10.1.2.3"),
        ("x-forwarded-proto", "https"),
        ("connection", "close, X-Trace-Hop"),
        ("x-trace-hop", "1"),
        ("te", "trailers"),
        ("content-length", "40"),
        ("content-type", "application/json"),
    ],
]
_REAL_RESPONSES = [
    [  # vLLM (uvicorn), streaming
        ("date", "Mon, 07 Dec 2026 06:00:00 GMT"),
        ("server", "uvicorn"),
        ("content-type", "text/event-stream; charset=utf-8"),
        ("transfer-encoding", "chunked"),
    ],
    [  # llama.cpp's server, not streaming
        ("Access-Control-Allow-Origin", ""),
        ("Content-Length", "512"),
        ("Content-Type", "application/json; charset=utf-8"),
        ("Keep-Alive", "timeout=5, max=100"),
        ("Server", "llama.cpp"),
    ],
]


def test_real_layouts_are_forwarded_as_the_per_field_filters_forward_them() -> None:
    for fields in _REAL_REQUESTS:
        for trust in (False, True):
            kw = {"client_ip": "127.0.0.1", "scheme": "http", "identity": True, "trust": trust}
            got = upstream_request_headers(CIMultiDict(fields), **kw)  # type: ignore[arg-type]
            want = _reference_upstream(CIMultiDict(fields), **kw)  # type: ignore[arg-type]
            assert _as_sent(got) == _as_sent(want), fields
    for fields in _REAL_RESPONSES:
        for keep_length in (False, True):
            got = client_response_headers(CIMultiDict(fields), keep_length=keep_length)
            want = _reference_client(CIMultiDict(fields), keep_length=keep_length)
            assert _as_sent(got) == _as_sent(want), fields
    # And what that is, spelled out once (the nginx-fronted request, untrusted).
    got = upstream_request_headers(
        CIMultiDict(_REAL_REQUESTS[3]), client_ip="127.0.0.1", scheme="http", identity=True,
        trust=False,
    )  # fmt: skip
    assert _as_sent(got) == [
        ("content-type", "application/json"),
        ("X-Forwarded-For", "127.0.0.1"),
        ("X-Forwarded-Proto", "http"),
        ("Accept-Encoding", "identity"),
    ]


def test_the_connection_cache_is_bounded() -> None:
    for i in range(500):  # a client sending a new Connection value each time
        upstream_request_headers(
            CIMultiDict([("Connection", f"x-{i}"), (f"X-{i}", "1"), ("X-Keep", "1")]),
            client_ip=None, scheme="http", identity=False,
        )  # fmt: skip
        got = client_response_headers(
            CIMultiDict([("Connection", f"x-{i}"), (f"X-{i}", "1"), ("X-Keep", "1")]),
            keep_length=True,
        )
        assert _as_sent(got) == [("X-Keep", "1")]
    assert H._skip_with.cache_info().currsize <= 64
