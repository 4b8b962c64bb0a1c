"""Client request vectors: exact bytes a client may send, written from RFC 9112 and RFC 9110.

Each ``Vector`` is what one client sends on a fresh connection (one write, or
pieces written apart), the kind of route it aims at, and ``requests``: the
requests those bytes hold when framed as RFC 9112 says (section 6), the most
any server may act on. A recipient may refuse more (a 400 where the RFC allows
either), never act on more: whatever reaches the upstream must be, in order, a
subsequence of ``requests``, method and body exact. Where the RFC says a
message is invalid (a server MUST answer 400, or MUST NOT process what
follows), ``requests`` leaves it out.

``pinned`` holds the statuses the project requires of tokenstamp and of
aiohttp's server alike, where the RFC (or the project) leaves them no choice.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from enum import StrEnum


class Route(StrEnum):
    """Which kind of route a vector aims at."""

    OBSERVED = "observed"
    """An observed route (``POST /v1/chat/completions``): the front may serve it itself."""
    UNOBSERVED = "unobserved"
    """A route tokenstamp only forwards (``/v1/models``, ``/v1/embeddings``): aiohttp's."""


@dataclass(frozen=True, slots=True)
class Framed:
    """One request the bytes hold by RFC 9112 framing."""

    method: str
    """Its method, exactly as sent."""
    body: bytes
    """Its content: the body with every transfer coding removed (what the upstream gets)."""


@dataclass(frozen=True, slots=True)
class Vector:
    """One client-side test vector."""

    name: str
    """Short, unique, kebab-case: the test id and the key of the documentation table."""
    description: str
    """What it sends and what the RFC says of it."""
    data: bytes | tuple[bytes, ...]
    """The bytes, or pieces written ``pause_s`` apart."""
    route: Route
    """The kind of route it aims at."""
    requests: tuple[Framed, ...]
    """The requests these bytes hold (RFC 9112): the most any recipient may forward."""
    pinned: tuple[int, ...] | None = None
    """Statuses required of tokenstamp and aiohttp (``None``: only that they agree)."""
    idle_s: float = 0.0
    """Silence the client waits for before giving up (0: the suite's default)."""
    pause_s: float = 0.05
    """Pause between pieces."""

    @property
    def pieces(self) -> list[bytes] | bytes:
        """``data`` as ``send_raw`` takes it."""
        return list(self.data) if isinstance(self.data, tuple) else self.data


HOST = b"Host: localhost"
OBSERVED = b"/v1/chat/completions"
UNOBSERVED_POST = b"/v1/embeddings"
UNOBSERVED_GET = b"/v1/models"
BODY = b'{"model":"m","messages":[]}'
"""A small chat request (27 bytes)."""
JSON = b"Content-Type: application/json"
BODY_WAIT_S = 2.0
"""How long a client waits on vectors whose body never completes (above the body timeout)."""


def cl(n: int | bytes) -> bytes:
    """A ``Content-Length`` field line."""
    return b"Content-Length: " + (n if isinstance(n, bytes) else str(n).encode())


def message(
    method: bytes,
    target: bytes,
    fields: list[bytes],
    body: bytes = b"",
    *,
    version: bytes = b"HTTP/1.1",
    eol: bytes = b"\r\n",
) -> bytes:
    """A request: request line, the field lines as given, an empty line, the body."""
    line = b" ".join(p for p in (method, target, version) if p)
    return eol.join([line, *fields]) + eol + eol + body


def post(
    target: bytes = OBSERVED,
    body: bytes = BODY,
    *,
    extra: list[bytes] | None = None,
    version: bytes = b"HTTP/1.1",
) -> bytes:
    """A well-formed POST with a ``Content-Length`` body (``extra`` fields after the usual)."""
    return message(
        b"POST", target, [HOST, JSON, cl(len(body)), *(extra or [])], body, version=version
    )


def get(target: bytes = UNOBSERVED_GET, *, extra: list[bytes] | None = None) -> bytes:
    """A well-formed GET without a body."""
    return message(b"GET", target, [HOST, *(extra or [])])


def chunk(data: bytes, size: bytes | None = None, ext: bytes = b"", eol: bytes = b"\r\n") -> bytes:
    """One chunk (RFC 9112 section 7.1): size in hex, extensions, data, CRLF."""
    return (size if size is not None else b"%x" % len(data)) + ext + eol + data + b"\r\n"


LAST = b"0\r\n\r\n"
"""The last chunk with an empty trailer section."""
CHUNKED_BODY = chunk(BODY) + LAST
TE = b"Transfer-Encoding: chunked"
HIDDEN = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n"
"""A request as it would hide in a body."""
SMUGGLE_BODY = LAST + HIDDEN
"""A chunked body that ends at once, then a request: a body of ``len`` bytes to ``Content-Length``."""
GZIPPED = gzip.compress(BODY, mtime=0)
GARBAGE = b"garbage-not-a-request\r\n\r\n"


def framed_post(body: bytes, fields: list[bytes], target: bytes = OBSERVED) -> bytes:
    """A POST of ``body`` as is, framed by ``fields`` (after Host and Content-Type)."""
    return message(b"POST", target, [HOST, JSON, *fields], body)


def _many_fields(total: int) -> list[bytes]:
    """``total`` field lines with Host, Content-Type and Content-Length among them."""
    return [HOST, JSON, cl(len(BODY))] + [b"X-F%d: %d" % (i, i) for i in range(total - 3)]


OBS, UNOBS = Route.OBSERVED, Route.UNOBSERVED
ONE = (Framed("POST", BODY),)
NONE: tuple[Framed, ...] = ()
GET_ONE = (Framed("GET", b""),)
WS = [
    b"Connection: Upgrade",
    b"Upgrade: websocket",
    b"Sec-WebSocket-Version: 13",
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
]
H2C = [b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAAQAAP__"]

V = Vector
# fmt: off
# A table: one vector to a few lines reads better than the formatter's one argument a line.
VECTORS: tuple[Vector, ...] = (
    # Baselines
    V("baseline", "A plain observed POST with a Content-Length body.", post(), OBS, ONE),
    V("baseline-unobserved", "A plain POST to a forwarded-only route.", post(UNOBSERVED_POST), UNOBS,
      ONE),
    V("baseline-get", "A plain GET.", get(), UNOBS, GET_ONE),
    V("query", "An observed POST whose target has a query.",
      post(OBSERVED + b"?stream=false&x=1"), OBS, ONE),
    V("connection-close", "An observed POST with Connection: close (RFC 9112 9.6).",
      post(extra=[b"Connection: close"]), OBS, ONE),
    # Content-Length and Transfer-Encoding together (RFC 9112 6.1, 6.3): Transfer-Encoding
    # wins and the server MUST close after answering, so the hidden request never counts.
    V("cl-te", "Content-Length then Transfer-Encoding: chunked; the chunked body ends at once and "
      "a request follows inside the Content-Length.",
      framed_post(SMUGGLE_BODY, [cl(len(SMUGGLE_BODY)), TE]), OBS, (Framed("POST", b""),)),
    V("te-cl", "As cl-te, Transfer-Encoding first.",
      framed_post(SMUGGLE_BODY, [TE, cl(len(SMUGGLE_BODY))]), OBS, (Framed("POST", b""),)),
    V("cl-te-unobserved", "As cl-te on a forwarded-only route.",
      framed_post(SMUGGLE_BODY, [cl(len(SMUGGLE_BODY)), TE], UNOBSERVED_POST), UNOBS,
      (Framed("POST", b""),)),
    V("cl-te-agree", "Transfer-Encoding: chunked and a Content-Length equal to the chunked bytes.",
      framed_post(CHUNKED_BODY, [TE, cl(len(CHUNKED_BODY))]), OBS, ONE),
    V("te-gzip-chunked", "Transfer-Encoding: gzip, chunked (a coding before chunked; a server "
      "that does not implement it SHOULD answer 501).",
      framed_post(chunk(GZIPPED) + LAST, [b"Transfer-Encoding: gzip, chunked"]), OBS, ONE),
    V("te-chunked-not-last", "Transfer-Encoding: chunked, gzip: chunked not last, the length "
      "cannot be determined: MUST 400 and close.",
      framed_post(CHUNKED_BODY, [b"Transfer-Encoding: chunked, gzip"]), OBS, NONE),
    V("te-identity", "Transfer-Encoding: identity with a Content-Length: chunked is not final, so "
      "MUST 400 (identity is no longer a coding).",
      framed_post(BODY, [b"Transfer-Encoding: identity", cl(len(BODY))]), OBS, NONE),
    V("te-space-before-colon", "'Transfer-Encoding : chunked' with a Content-Length: whitespace "
      "before the colon MUST be answered 400 (RFC 9112 5.1).",
      framed_post(CHUNKED_BODY, [b"Transfer-Encoding : chunked", cl(len(CHUNKED_BODY))]), OBS,
      NONE),
    V("te-xchunked", "Transfer-Encoding: xchunked with a Content-Length: chunked is not final, "
      "MUST 400.", framed_post(BODY, [b"Transfer-Encoding: xchunked", cl(len(BODY))]), OBS, NONE),
    V("te-tab", "Transfer-Encoding:<TAB>chunked: a tab is optional whitespace, so this is valid.",
      framed_post(CHUNKED_BODY, [b"Transfer-Encoding:\tchunked"]), OBS, ONE),
    V("te-vtab", "Transfer-Encoding:<VT>chunked with a Content-Length: a vertical tab is no "
      "whitespace, the coding is not chunked: MUST 400.",
      framed_post(BODY, [b"Transfer-Encoding:\x0bchunked", cl(len(BODY))]), OBS, NONE),
    V("te-duplicate", "Transfer-Encoding: chunked twice: chunked applied twice (a sender MUST NOT), "
      "the content would still be chunked.",
      framed_post(CHUNKED_BODY, [TE, TE]), OBS, NONE),
    V("te-uppercase", "Transfer-Encoding: CHUNKED: codings are case-insensitive, valid.",
      framed_post(CHUNKED_BODY, [b"Transfer-Encoding: CHUNKED"]), OBS, ONE),
    V("te-http10", "HTTP/1.0 with Transfer-Encoding and Content-Length: the framing MUST be treated "
      "as faulty (RFC 9112 6.1).",
      message(b"POST", OBSERVED, [HOST, JSON, TE, cl(len(CHUNKED_BODY))], CHUNKED_BODY,
              version=b"HTTP/1.0"), OBS, NONE),
    # Content-Length forms (RFC 9110 8.6, RFC 9112 6.3)
    V("cl-duplicate-equal", "Two equal Content-Length lines: a recipient MAY reject or use the value.",
      framed_post(BODY, [cl(27), cl(27)]), OBS, ONE),
    V("cl-duplicate-different", "Two different Content-Length lines: MUST 400.",
      framed_post(BODY, [cl(27), cl(5)]), OBS, NONE),
    V("cl-list-equal", "Content-Length: 27, 27: MAY reject or use the value.",
      framed_post(BODY, [cl(b"27, 27")]), OBS, ONE),
    V("cl-list-different", "Content-Length: 27, 5: MUST 400.",
      framed_post(BODY, [cl(b"27, 5")]), OBS, NONE),
    V("cl-plus", "Content-Length: +27: not 1*DIGIT, MUST 400.",
      framed_post(BODY, [cl(b"+27")]), OBS, NONE),
    V("cl-negative", "Content-Length: -1: MUST 400.", framed_post(BODY, [cl(b"-1")]), OBS, NONE),
    V("cl-leading-zeros", "Content-Length: 0027: valid (1*DIGIT).",
      framed_post(BODY, [cl(b"0027")]), OBS, ONE),
    V("cl-hex", "Content-Length: 0x1b: MUST 400.", framed_post(BODY, [cl(b"0x1b")]), OBS, NONE),
    V("cl-inner-space", "Content-Length: 2 7: MUST 400.",
      framed_post(BODY, [cl(b"2 7")]), OBS, NONE),
    V("cl-trailing-ows", "Content-Length: 27 and a space and a tab: optional whitespace, valid.",
      framed_post(BODY, [cl(b"27 \t")]), OBS, ONE),
    V("cl-empty", "An empty Content-Length: MUST 400.", framed_post(BODY, [cl(b"")]), OBS, NONE),
    V("cl-overflow", "A Content-Length of 30 digits (past 64 bits): 400 (or 413).",
      framed_post(BODY, [cl(b"9" * 30)]), OBS, NONE),
    V("cl-too-large", "A valid Content-Length of 10^12, over the proxy's body limit: 413.",
      framed_post(BODY, [cl(10**12)]), OBS, NONE),
    V("cl-short-body", "A body shorter than its Content-Length, then silence: the body timeout.",
      framed_post(BODY, [cl(100)]), OBS, NONE, idle_s=BODY_WAIT_S),
    V("cl-short-body-unobserved", "As cl-short-body on a forwarded-only route.",
      framed_post(BODY, [cl(100)], UNOBSERVED_POST), UNOBS, NONE, idle_s=BODY_WAIT_S),
    V("cl-long-body", "Bytes past the Content-Length that are no request, in the same write: the "
      "first request is valid, the rest a bad second one (400).", post() + GARBAGE, OBS, ONE),
    V("cl-long-body-split", "As cl-long-body, the bytes past the body in a second write.",
      (post(), GARBAGE), OBS, ONE),
    V("get-with-body", "A GET with a Content-Length body: framing is by Content-Length (RFC 9110 9.3.1).",
      message(b"GET", UNOBSERVED_GET, [HOST, cl(len(BODY))], BODY), UNOBS, (Framed("GET", BODY),)),
    # Chunked bodies (RFC 9112 7.1)
    V("chunked", "A chunked body.", framed_post(CHUNKED_BODY, [TE]), OBS, ONE),
    V("chunked-unobserved", "A chunked body to a forwarded-only route.",
      framed_post(CHUNKED_BODY, [TE], UNOBSERVED_POST), UNOBS, ONE),
    V("chunked-hex-case", "Chunk sizes in upper and lower case hex, split in three chunks.",
      framed_post(chunk(BODY[:11], b"B") + chunk(BODY[11:], b"10") + LAST, [TE]), OBS, ONE),
    V("chunked-leading-zeros", "A chunk size with leading zeros (000001b): valid.",
      framed_post(chunk(BODY, b"000001b") + LAST, [TE]), OBS, ONE),
    V("chunked-ext", "A chunk extension without a value (1b;foo): valid, ignored.",
      framed_post(chunk(BODY, ext=b";foo") + LAST, [TE]), OBS, ONE),
    V("chunked-ext-value", "A chunk extension with a token value (1b;foo=bar): valid.",
      framed_post(chunk(BODY, ext=b";foo=bar") + LAST, [TE]), OBS, ONE),
    V("chunked-ext-quoted", 'A quoted extension value holding an escaped quote and a ";": valid.',
      framed_post(chunk(BODY, ext=b';foo="b;a\\"r"') + LAST, [TE]), OBS, ONE),
    V("chunked-ext-bws", "Whitespace before the extension's ';' (BWS): valid.",
      framed_post(chunk(BODY, ext=b" ;foo=bar") + LAST, [TE]), OBS, ONE),
    V("chunked-size-overflow", "A chunk size of 20 hex digits (past 64 bits): MUST 400.",
      framed_post(chunk(BODY, b"f" * 18 + b"1b") + LAST, [TE]), OBS, NONE),
    V("chunked-size-0x", "A chunk size written 0x1b: not HEXDIG, 400.",
      framed_post(chunk(BODY, b"0x1b") + LAST, [TE]), OBS, NONE),
    V("chunked-data-no-crlf", "Chunk data not followed by CRLF: invalid, 400.",
      framed_post(b"%x\r\n" % len(BODY) + BODY + b"XX" + LAST, [TE]), OBS, NONE),
    V("chunked-size-bare-lf", "A chunk-size line ended by a bare LF: a recipient may accept it.",
      framed_post(chunk(BODY, eol=b"\n") + LAST, [TE]), OBS, ONE),
    V("chunked-data-bare-lf", "Chunk data ended by a bare LF instead of CRLF.",
      framed_post(b"%x\r\n" % len(BODY) + BODY + b"\n" + LAST, [TE]), OBS, ONE),
    V("chunked-trailer", "A trailer field after the last chunk: valid.",
      framed_post(chunk(BODY) + b"0\r\nX-Trailer: t\r\n\r\n", [TE, b"Trailer: X-Trailer"]), OBS,
      ONE),
    V("chunked-bad-trailer", "A trailer line without a colon: invalid, 400.",
      framed_post(chunk(BODY) + b"0\r\nnot a field\r\n\r\n", [TE]), OBS, NONE),
    V("chunked-unfinished", "Chunks without the last chunk, then silence: the body timeout.",
      framed_post(chunk(BODY), [TE]), OBS, NONE, idle_s=BODY_WAIT_S),
    # Line endings, whitespace and control characters (RFC 9112 2.2, 5; RFC 9110 5.5)
    V("lf-request-line", "The request line ends in a bare LF (a recipient MAY accept it).",
      post().replace(b"HTTP/1.1\r\n", b"HTTP/1.1\n", 1), OBS, ONE),
    V("lf-everywhere", "Every line ends in a bare LF.", post().replace(b"\r\n", b"\n"), OBS, ONE),
    V("lf-everywhere-unobserved", "A GET whose lines all end in a bare LF.",
      get().replace(b"\r\n", b"\n"), UNOBS, GET_ONE),
    V("cr-in-value", "A bare CR inside a field value: MUST reject or replace with SP.",
      post(extra=[b"X-A: a\rb"]), OBS, ONE),
    V("nul-in-value", "A NUL inside a field value: MUST reject or replace with SP.",
      post(extra=[b"X-A: a\x00b"]), OBS, ONE),
    V("nul-in-name", "A NUL inside a field name: not a token, 400.",
      post(extra=[b"X-\x00A: b"]), OBS, NONE),
    V("cr-in-name", "A CR inside a field name: 400.", post(extra=[b"X-\rA: b"]), OBS, NONE),
    V("lf-in-name", "A field line broken by a LF before its colon: a line without a colon, 400.",
      post(extra=[b"X-A\nB: c"]), OBS, NONE),
    V("non-ascii-value", "obs-text (UTF-8) in a field value: valid.",
      post(extra=["X-A: é".encode()]), OBS, ONE),
    V("non-ascii-name", "UTF-8 in a field name: not a token, 400.",
      post(extra=["X-É: a".encode()]), OBS, NONE),
    V("content-type-duplicate", "Two Content-Type lines (a singleton field): MAY be rejected.",
      post(extra=[b"Content-Type: text/plain"]), OBS, ONE),
    V("user-agent-duplicate", "Two User-Agent lines (a singleton field): MAY be rejected.",
      post(extra=[b"User-Agent: a", b"User-Agent: b"]), OBS, ONE),
    V("sec-websocket-key1", "Sec-WebSocket-Key1 (the pre-RFC 6455 handshake) on a POST.",
      post(extra=[b"Sec-WebSocket-Key1: 4 @1  46546xW%0l 1 5"]), OBS, ONE),
    V("content-encoding-gzip", "A gzip Content-Encoding body: end to end, forwarded as is.",
      post(body=GZIPPED, extra=[b"Content-Encoding: gzip"]), OBS, (Framed("POST", GZIPPED),)),
    V("content-encoding-gzip-chunked", "As content-encoding-gzip with a chunked body.",
      framed_post(chunk(GZIPPED) + LAST, [TE, b"Content-Encoding: gzip"]), OBS,
      (Framed("POST", GZIPPED),)),
    V("content-encoding-gzip-unobserved", "As content-encoding-gzip on a forwarded-only route.",
      post(UNOBSERVED_POST, GZIPPED, extra=[b"Content-Encoding: gzip"]), UNOBS,
      (Framed("POST", GZIPPED),)),
    V("obs-fold", "A field value continued on the next line (obs-fold): MUST 400 or unfold.",
      post(extra=[b"X-A: a\r\n b"]), OBS, ONE),
    V("obs-fold-content-length", "Content-Length's value on a folded line.",
      framed_post(BODY, [b"Content-Length:\r\n 27"]), OBS, ONE),
    V("ws-before-first-field", "A whitespace-led line between request line and first field: "
      "MUST reject or ignore that line.",
      message(b"POST", OBSERVED, [b" X-A: b", HOST, JSON, cl(len(BODY))], BODY), OBS, ONE),
    V("space-before-colon", "'X-A : b': whitespace before the colon, MUST 400.",
      post(extra=[b"X-A : b"]), OBS, NONE),
    V("space-before-colon-cl", "'Content-Length : 27': MUST 400.",
      framed_post(BODY, [b"Content-Length : 27"]), OBS, NONE),
    V("empty-field-name", "A field line ': b' with no name: 400.", post(extra=[b": b"]), OBS, NONE),
    V("no-colon", "A field line without a colon: 400.", post(extra=[b"X-A b"]), OBS, NONE),
    V("nul-in-target", "A NUL in the request target: 400.",
      post(OBSERVED + b"\x00x"), OBS, NONE),
    V("cr-in-target", "A bare CR in the request target: 400.",
      post(b"/v1/chat\r/completions"), OBS, NONE),
    V("space-in-target", "A space inside the request target: 400.",
      post(b"/v1/chat /completions"), OBS, NONE),
    # Request-line forms (RFC 9112 3)
    V("absolute-form", "The absolute-form target: a server MUST accept it (RFC 9112 3.2.2).",
      post(b"http://localhost" + OBSERVED), OBS, ONE),
    V("absolute-form-host-mismatch", "Absolute-form whose authority differs from Host: the "
      "target's authority wins, the request is valid.",
      message(b"POST", b"http://example.com" + OBSERVED, [HOST, JSON, cl(len(BODY))], BODY), OBS,
      ONE),
    V("absolute-form-unobserved", "An absolute-form GET.", get(b"http://localhost/v1/models"), UNOBS,
      GET_ONE),
    V("authority-form-post", "The authority-form on a POST (only CONNECT uses it): 400.",
      post(b"localhost:80"), OBS, NONE),
    V("asterisk-options", "OPTIONS * (the asterisk-form).",
      message(b"OPTIONS", b"*", [HOST]), UNOBS, (Framed("OPTIONS", b""),)),
    V("asterisk-post", "The asterisk-form on a POST (only OPTIONS uses it): 400.",
      post(b"*"), OBS, NONE),
    V("double-space", "Two spaces between method and target: MAY be parsed on whitespace.",
      post().replace(b"POST ", b"POST  ", 1), OBS, ONE),
    V("lowercase-method", "'post': methods are case-sensitive, so another (unknown) method.",
      post().replace(b"POST", b"post", 1), OBS, (Framed("post", BODY),)),
    V("unknown-method", "An unregistered method FOO on a forwarded-only route.",
      message(b"FOO", UNOBSERVED_GET, [HOST]), UNOBS, (Framed("FOO", b""),)),
    V("no-version", "A request line without the HTTP version: invalid, SHOULD 400; read as a "
      "request all the same, its Content-Length frames the body.",
      post().replace(b" HTTP/1.1", b"", 1), OBS, ONE),
    V("http09", "An HTTP/0.9 simple request (GET /path and a line end).",
      b"GET /v1/models\r\n", UNOBS, NONE),
    V("http10", "HTTP/1.0 with a Content-Length body and no Host: valid.",
      message(b"POST", OBSERVED, [JSON, cl(len(BODY))], BODY, version=b"HTTP/1.0"), OBS, ONE),
    V("http10-get", "An HTTP/1.0 GET.", message(b"GET", UNOBSERVED_GET, [], version=b"HTTP/1.0"),
      UNOBS, GET_ONE),
    V("version-0.9", "HTTP/0.9 as the version of a request with fields: 400 or 505, or read with "
      "its Content-Length.", post(version=b"HTTP/0.9"), OBS, ONE),
    V("version-1.2", "HTTP/1.2: a later minor version is handled as HTTP/1.1 (RFC 9110 2.5).",
      post(version=b"HTTP/1.2"), OBS, ONE),
    V("version-2.0", "HTTP/2.0 in an HTTP/1 request line: a server can refuse the major version "
      "(505, RFC 9110 2.5) or read it with its Content-Length.",
      post(version=b"HTTP/2.0"), OBS, ONE),
    V("version-lowercase", "'http/1.1': the version is case-sensitive, 400.",
      post(version=b"http/1.1"), OBS, NONE),
    V("leading-crlf", "Empty lines before the request line: SHOULD be ignored (RFC 9112 2.2).",
      b"\r\n\r\n" + post(), OBS, ONE),
    # Host (RFC 9112 3.2)
    V("host-missing", "An HTTP/1.1 request without Host: MUST 400.",
      message(b"POST", OBSERVED, [JSON, cl(len(BODY))], BODY), OBS, NONE, pinned=(400,)),
    V("host-missing-unobserved", "An HTTP/1.1 GET without Host: MUST 400.",
      message(b"GET", UNOBSERVED_GET, []), UNOBS, NONE, pinned=(400,)),
    V("host-duplicate", "Two Host lines: MUST 400.",
      post(extra=[b"Host: other"]), OBS, NONE, pinned=(400,)),
    V("host-duplicate-unobserved", "Two Host lines on a GET: MUST 400.",
      get(extra=[b"Host: other"]), UNOBS, NONE, pinned=(400,)),
    V("host-empty", "An empty Host: RFC 9110 7.2 has it for a target URI without authority, "
      "which an http URI never is.",
      message(b"POST", OBSERVED, [b"Host:", JSON, cl(len(BODY))], BODY), OBS, ONE),
    V("host-port", "Host with a port.",
      message(b"POST", OBSERVED, [b"Host: localhost:8080", JSON, cl(len(BODY))], BODY), OBS, ONE),
    V("host-invalid", "Host: a b (not a valid authority): RFC 9112 3.2 says MUST 400.",
      message(b"POST", OBSERVED, [b"Host: a b", JSON, cl(len(BODY))], BODY), OBS, ONE),
    # Expect (RFC 9110 10.1.1)
    V("expect-100", "Expect: 100-continue with the body in the same write.",
      post(extra=[b"Expect: 100-continue"]), OBS, ONE),
    V("expect-100-wait", "Expect: 100-continue, the body sent 0.3 s after the head.",
      (post(extra=[b"Expect: 100-continue"])[: -len(BODY)], BODY), OBS, ONE, pause_s=0.3),
    V("expect-100-no-body", "Expect: 100-continue on a GET without a body.",
      get(extra=[b"Expect: 100-continue"]), UNOBS, GET_ONE),
    V("expect-100-http10", "Expect: 100-continue from an HTTP/1.0 client: no 100 may be sent.",
      message(b"POST", OBSERVED, [HOST, JSON, cl(len(BODY)), b"Expect: 100-continue"], BODY,
              version=b"HTTP/1.0"), OBS, ONE),
    V("expect-unknown", "Expect: something-else: a server MAY answer 417.",
      post(extra=[b"Expect: something-else"]), OBS, ONE),
    # Upgrade and CONNECT (RFC 9110 7.8, 9.3.6)
    V("upgrade-websocket", "A WebSocket handshake on a GET: forwarded as a plain GET.",
      get(extra=WS), UNOBS, GET_ONE),
    V("upgrade-websocket-pipelined", "A WebSocket handshake and a second GET in one write: not "
      "upgraded, so the second is a request.", get(extra=WS) + get(), UNOBS, GET_ONE * 2),
    V("upgrade-h2c", "An h2c upgrade on an observed POST with a body: forwarded as a plain POST.",
      post(extra=H2C), OBS, ONE),
    V("connect", "CONNECT to an authority: no tunnel here, 405.",
      message(b"CONNECT", b"localhost:443", [b"Host: localhost:443"]), UNOBS, NONE, pinned=(405,)),
    V("connect-with-data", "CONNECT, then a GET in the same write: no tunnel opens, so the "
      "connection stays HTTP and the GET is the next request (RFC 9110 9.3.6).",
      message(b"CONNECT", b"localhost:443", [b"Host: localhost:443"]) + get(), UNOBS, GET_ONE),
    # Pipelining (RFC 9112 9.3.2)
    V("pipeline-two", "Two observed POSTs in one write.", post() + post(), OBS, ONE * 2),
    V("pipeline-three", "An observed POST, a GET and a forwarded-only POST in one write.",
      post() + get() + post(UNOBSERVED_POST), OBS, (*ONE, *GET_ONE, *ONE)),
    V("pipeline-hidden", "A POST whose Content-Length body is a request: one request.",
      post(body=HIDDEN), OBS, (Framed("POST", HIDDEN),)),
    V("pipeline-after-body", "A second request right after a body ending exactly at its "
      "Content-Length, split mid-head across writes.",
      (post() + get()[:9], get()[9:]), OBS, (*ONE, *GET_ONE)),
    V("pipeline-after-close", "A request with Connection: close, then another in the same write: "
      "the second MUST NOT be processed (RFC 9112 9.6).",
      post(extra=[b"Connection: close"]) + post(), OBS, ONE),
    V("pipeline-after-close-split", "As pipeline-after-close, the second request in a second write.",
      (post(extra=[b"Connection: close"]), post()), OBS, ONE),
    V("pipeline-after-error", "An invalid request (Content-Length: x), then a valid one: the "
      "connection cannot go on after a framing error.",
      framed_post(BODY, [cl(b"x")]) + post(), OBS, NONE),
    # Sizes: aiohttp's limits are 8190 bytes of field value (a name counts for the first field
    # only), 8190 bytes of target and 128 fields; the front hands anything near them to aiohttp.
    V("field-value-8190", "A field value of 8190 bytes: at aiohttp's limit (max_field_size).",
      post(extra=[b"X-Long: " + b"v" * 8190]), OBS, ONE),
    V("field-value-8191", "A field value of 8191 bytes: past aiohttp's limit.",
      post(extra=[b"X-Long: " + b"v" * 8191]), OBS, NONE),
    V("target-8190", "An 8190-byte target: at aiohttp's limit.",
      post(OBSERVED + b"?q=" + b"a" * (8190 - len(OBSERVED) - 3)), OBS, ONE),
    V("target-8191", "An 8191-byte target: past aiohttp's limit.",
      post(OBSERVED + b"?q=" + b"a" * (8191 - len(OBSERVED) - 3)), OBS, NONE),
    V("fields-128", "128 field lines: at aiohttp's limit.",
      message(b"POST", OBSERVED, _many_fields(128), BODY), OBS, ONE),
    V("fields-129", "129 field lines: past aiohttp's limit.",
      message(b"POST", OBSERVED, _many_fields(129), BODY), OBS, NONE),
    V("fields-129-unobserved", "129 field lines on a GET.",
      message(b"GET", UNOBSERVED_GET, [HOST, *_many_fields(131)[3:]]), UNOBS, NONE),
    # Targets (RFC 9112 3.2, RFC 3986)
    V("pct-encoded", "A percent-encoded character in the observed path (%63 for c).",
      post(b"/v1/chat/%63ompletions"), OBS, ONE),
    V("pct-encoded-slash", "An encoded slash (%2F) in the path.",
      post(b"/v1/chat%2Fcompletions"), OBS, ONE),
    V("pct-invalid", "An invalid percent-escape (%zz) in the query.",
      post(OBSERVED + b"?x=%zz"), OBS, ONE),
    V("non-ascii-target", "Raw UTF-8 bytes in an observed target's query.",
      post(OBSERVED + "?q=é".encode()), OBS, ONE),
    V("non-ascii-target-unobserved", "Raw UTF-8 bytes in a GET's path.",
      get("/v1/models/é".encode()), UNOBS, GET_ONE),
    V("fragment", "A fragment (#) in the target: not part of a request-target.",
      post(OBSERVED + b"#frag"), OBS, ONE),
    V("dot-segments", "Dot segments (/v1/../v1/chat/completions) in the path.",
      post(b"/v1/../v1/chat/completions"), OBS, ONE),
)
# fmt: on

BY_NAME = {v.name: v for v in VECTORS}
assert len(BY_NAME) == len(VECTORS), "vector names are unique"
