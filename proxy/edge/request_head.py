"""Which request heads the front serves itself, read into their fields.

The front (``proxy.edge.front``) serves a request itself only in the plainest
HTTP/1.1 form; anything else goes to aiohttp's server at its first byte, which
answers it as it would without the front. ``plain_request`` is that rule, in
one place. A head is the front's when all of these hold, else it is aiohttp's:

- llhttp parses it whole, as HTTP/1.1, with CRLF line ends only (a bare LF is
  left to aiohttp: RFC 9112 section 2.2 lets a recipient accept or refuse it);
- no line longer than aiohttp's ``max_line_size`` and no more fields than its
  ``max_headers``;
- not ``CONNECT``, and nothing asks to upgrade (``Upgrade``: WebSocket, h2c);
- the target is origin-form of plain characters (no ``%``, no ``#``, ASCII);
- exactly one ``Host``, of host characters (RFC 9112 section 3.2: none, two,
  or an invalid one is a 400, which aiohttp answers, or ``create_app``'s rules);
- no field aiohttp refuses: a repeated singleton (``SINGLETONS``: its 400) or a
  WebSocket draft-76 ``Sec-WebSocket-Key1`` (a body of no stated length);
- exactly one ``Content-Length`` of digits, and no ``Transfer-Encoding`` or
  ``Expect``;
- an observed route (``proxy.core.decoders.registry.route``).

The rules both doors apply to any request (``valid_host``, ``unknown_coding``)
live here too, so the front and ``create_app`` cannot drift apart.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import httptools
from multidict import CIMultiDict

from proxy.core.decoders.registry import route

LINE_LIMIT = 8190
"""A head with a longer line goes to aiohttp (its ``max_line_size``, ``max_field_size``)."""
FIELD_COUNT_LIMIT = 128
"""A head with more fields goes to aiohttp (its ``max_headers``)."""

_NEVER_OURS = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"sec-websocket-key1"})

SINGLETONS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    }
)
"""Fields a request carries at most once (RFC 9110): a repeat is aiohttp's 400 (its strict
request parser's list), so the front leaves such a request to aiohttp."""

_LOOKED_AT = _NEVER_OURS | SINGLETONS
"""Every field the rules above look at; the others are only copied."""

_HOST = re.compile(r"[A-Za-z0-9\-._~%!$&'()*+,;=:\[\]]*")
"""``uri-host [ ":" port ]`` of RFC 9112 section 3.2 (RFC 3986's characters), or empty."""


def valid_host(value: str) -> bool:
    """``value`` is a ``Host`` field value made of host characters (empty is valid)."""
    return _HOST.fullmatch(value) is not None


def unknown_coding(transfer_encoding: str) -> bool:
    """A transfer coding other than ``chunked`` is named (RFC 9112 section 6.1: 501)."""
    codings = [c.strip().lower() for c in transfer_encoding.split(",")]
    return any(c and c != "chunked" for c in codings)


class PlainRequest(NamedTuple):
    """A request head the front serves itself (a named tuple: one per request, and a frozen
    dataclass sets each field through ``object.__setattr__``)."""

    method: str
    """Request method (an observed route's: POST)."""
    target: str
    """Path and query, as forwarded upstream."""
    path: str
    """The path, without the query."""
    headers: CIMultiDict[str]
    """The fields, names as sent."""
    length: int
    """The body's ``Content-Length``."""
    keep_alive: bool
    """The client keeps the connection for another request."""


class _Fields:
    """What ``httptools`` reports of one request head."""

    __slots__ = ("complete", "fields", "url")

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        self.complete = True


def plain_request(head: bytes) -> PlainRequest | None:
    """``head`` (through its blank line) as the front's to serve, or None: aiohttp's."""
    if head.count(b"\n") != head.count(b"\r\n"):
        return None  # a bare LF: aiohttp decides what it means
    if len(head) > LINE_LIMIT and max(map(len, head.split(b"\r\n"))) > LINE_LIMIT:
        return None  # over aiohttp's limits: it answers 400
    got = _Fields()
    parser = httptools.HttpRequestParser(got)
    try:
        parser.feed_data(head)
    except httptools.HttpParserUpgrade:
        return None  # CONNECT, or an Upgrade: aiohttp forwards or refuses it
    except httptools.HttpParserError:
        return None
    if not got.complete or parser.get_http_version() != "1.1" or parser.should_upgrade():
        return None
    if len(got.fields) > FIELD_COUNT_LIMIT:
        return None
    try:
        method = parser.get_method().decode("ascii")
        target = got.url.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not target.startswith("/") or "%" in target or "#" in target:
        return None
    path = target.partition("?")[0]
    if route(method, path) is None:
        return None
    length = None
    seen: set[bytes] = set()
    for name, value in got.fields:
        low = name.lower()
        if low not in _LOOKED_AT:
            continue
        if low in _NEVER_OURS:
            return None
        if low in seen:
            return None
        seen.add(low)
        if low == b"content-length":
            if not value.isdigit():
                return None
            length = int(value)
    if length is None or b"host" not in seen:
        return None
    headers = CIMultiDict([(n.decode("latin-1"), v.decode("latin-1")) for n, v in got.fields])
    if not valid_host(headers["Host"]):
        return None
    return PlainRequest(method, target, path, headers, length, parser.should_keep_alive())
