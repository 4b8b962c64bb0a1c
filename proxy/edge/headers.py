"""Header rules of a forwarding proxy (RFC 9110 section 7.6.1, RFC 7239 practice).

Hop-by-hop headers, and any header the ``Connection`` header names, are not
forwarded. Authorization and API-key headers pass through untouched; nothing
here logs or records them.
"""

from __future__ import annotations

from functools import lru_cache

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.labels import CREDENTIAL_HEADERS

Headers = CIMultiDict[str] | CIMultiDictProxy[str]
"""Request headers as aiohttp parses them (a proxy) or as the front does (a dict)."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Recomputed by the proxy's own HTTP stack for the hop it writes.
_REQUEST_DROP = frozenset({"host", "content-length", "expect"})
_RESPONSE_DROP = frozenset({"content-length"})

#: What a client may claim about the hops before it; trusted only from a trusted proxy.
FORWARDING = frozenset(
    {
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-forwarded-port",
        "x-forwarded-prefix",
        "x-real-ip",
    }
)

#: Headers that carry credentials: never logged, labelled or recorded.
SECRET_HEADERS = CREDENTIAL_HEADERS


@lru_cache(maxsize=64)
def _skip_with(skip: frozenset[str], connection: tuple[str, ...]) -> frozenset[str]:
    """``skip`` and the field names the ``Connection`` values list (lower case).

    Cached: clients send a few values (``keep-alive``, ``close``) again and again, and
    splitting them cost more than the rest of the copy; 64 entries bound what a client
    sending other values can make it keep.
    """
    listed: set[str] = set()
    for value in connection:
        listed.update(t.strip().lower() for t in value.split(",") if t.strip())
    return skip | listed


# What each direction drops, built once (a header the ``Connection`` header names is added
# per message, only when there is one).
_REQUEST_SKIP = HOP_BY_HOP | _REQUEST_DROP
_REQUEST_SKIP_UNTRUSTED = _REQUEST_SKIP | FORWARDING
_RESPONSE_SKIP = HOP_BY_HOP
_RESPONSE_SKIP_LENGTH = HOP_BY_HOP | _RESPONSE_DROP


def _filtered(headers: Headers, skip: frozenset[str]) -> CIMultiDict[str]:
    """A copy of ``headers`` without every field whose lower-cased name is in ``skip``.

    Copied whole and the few dropped names removed after (``popall`` matches names as
    ``str.lower`` does, multidict's own rule): a loop lowering each name cost more.
    """
    if "Connection" in headers:
        skip = _skip_with(skip, tuple(headers.getall("Connection")))
    out = CIMultiDict(headers)
    for name in skip.intersection(map(str.lower, headers.keys())):
        out.popall(name)
    return out


def upstream_request_headers(
    headers: Headers,
    *,
    client_ip: str | None,
    scheme: str,
    identity: bool,
    trust: bool = True,
) -> CIMultiDict[str]:
    """Headers to send upstream: end-to-end ones plus ``X-Forwarded-For/-Proto``.

    ``trust`` (``--trust-forwarded``): the client is a proxy whose forwarding
    headers (``FORWARDING``) pass on, ours appended; otherwise they are dropped
    and only what the proxy itself sees is sent. ``identity`` asks the upstream
    not to compress (observed routes: a token stream must be readable to be
    timed, and compressing it defeats streaming).
    """
    out = _filtered(headers, _REQUEST_SKIP if trust else _REQUEST_SKIP_UNTRUSTED)
    if client_ip:
        prior = headers.get("X-Forwarded-For") if trust else None
        out["X-Forwarded-For"] = f"{prior}, {client_ip}" if prior else client_ip
    if "X-Forwarded-Proto" not in out:
        out["X-Forwarded-Proto"] = scheme
    if identity:
        out["Accept-Encoding"] = "identity"
    return out


def client_response_headers(headers: Headers, *, keep_length: bool) -> CIMultiDict[str]:
    """Headers to send the client: the upstream's end-to-end headers.

    ``Content-Length`` is kept only when the body goes through unchanged.
    """
    return _filtered(headers, _RESPONSE_SKIP if keep_length else _RESPONSE_SKIP_LENGTH)
