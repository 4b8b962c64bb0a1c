"""The client side of one proxied exchange: what the forwarding code needs of it.

Two kinds meet ``Inbound``. ``proxy.edge.front.FrontConnection`` is the
proxy listener's own: an observed request arriving there is read, answered
and streamed without any aiohttp object, which is most of the memory an open
stream costs. ``AiohttpInbound`` wraps an aiohttp request: the application of
``create_app``, and every connection the front hands to aiohttp (any request
it does not serve itself).
"""

from __future__ import annotations

import asyncio
import json
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from proxy.edge.budget import RETRY_AFTER_S, BodyBudget, budget_message
from proxy.edge.headers import Headers, client_response_headers


class Refused(Exception):
    """The proxy refuses the request before contacting the upstream."""

    def __init__(
        self, status: int, error_type: str, message: str, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.retry_after_s = retry_after_s
        """Seconds the client is told to wait (``Retry-After``), when it may try again."""


def error_text(status: int, error_type: str, message: str) -> str:
    """An OpenAI-style error body (clients already parse this shape)."""
    return json.dumps({"error": {"message": message, "type": error_type, "code": status}})


def json_error(
    status: int, error_type: str, message: str, retry_after_s: int | None = None
) -> web.Response:
    """``error_text`` as an aiohttp response."""
    headers = {"X-Tokenstamp-Error": error_type}
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return web.Response(
        status=status,
        text=error_text(status, error_type, message),
        content_type="application/json",
        headers=headers,
    )


class Inbound(Protocol):
    """One request from a client, and the response going back to it."""

    method: str
    """Request method."""
    path: str
    """Request path, without the query (what routing looks at)."""
    target: str
    """Path and query, as forwarded upstream."""
    headers: Headers
    """Request headers."""
    remote: str | None
    """The client's address (``X-Forwarded-For``)."""
    scheme: str
    """``http`` or ``https`` (``X-Forwarded-Proto``)."""
    chunked: bool
    """The response body is sent chunked (known once ``start`` returned)."""

    @property
    def transport(self) -> asyncio.Transport | None:
        """The client's connection (``None`` once it is gone)."""
        ...

    def gone(self) -> bool:
        """The client's connection is closed or closing."""
        ...

    def forget_headers(self) -> None:
        """The request headers are not read again: let them go while the body streams."""
        ...

    def body_now(self, limit: int) -> bytes | None:
        """The whole request body when it is here already (``Refused`` as ``read_body``),
        else None: ``read_body`` reads it. A plain call: no coroutine when nothing waits."""
        ...

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; ``Refused``: 413 past ``limit`` bytes, 503 over budget."""
        ...

    def release_body(self) -> None:
        """The body went upstream (or never will): give its bytes back to the budget."""
        ...

    def refuse(
        self, status: int, error_type: str, message: str, retry_after_s: int | None = None
    ) -> None:
        """Answer with an error of ours instead of a relayed response."""
        ...

    def interim(self, status: int, reason: str, headers: Headers) -> None:
        """Relay an interim (1xx) response before the final one, where the client takes it."""
        ...

    async def start(self, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        """Send the response head (``Content-Length`` in ``headers`` means not chunked)."""
        ...

    def start_held(self, status: int, reason: str, headers: CIMultiDict[str]) -> bytes | None:
        """Start the response as ``start`` does but without writing its head: its bytes,
        for whoever writes the body's first bytes (in the same write, before any await);
        ``None`` when this client cannot (then ``start``)."""
        ...

    def end_held(self) -> bytes | None:
        """The bytes that end the response (the chunked terminator, or none), not written:
        whoever writes the body's last bytes sends them in the same write, once the body
        ended cleanly; ``end`` then writes them no more. ``None`` when this client writes
        its own end (then ``end`` does)."""
        ...

    async def write(self, data: bytes) -> None:
        """Send body bytes, waiting while the client's buffer is full (``ConnectionError``)."""
        ...

    async def drain(self) -> None:
        """Wait until the client's buffer has room (``ConnectionError`` if it went away)."""
        ...

    async def end(self) -> None:
        """End the response cleanly (``ConnectionError`` if the client went away)."""
        ...

    def abort(self) -> None:
        """Cut the connection without a clean end (bytes sent so far stay sent)."""
        ...


class AiohttpInbound:
    """An aiohttp request as an ``Inbound``; ``response`` is what the handler returns."""

    __slots__ = (
        "_hold",
        "_stream",
        "_writer",
        "chunked",
        "headers",
        "method",
        "path",
        "remote",
        "request",
        "response",
        "scheme",
        "target",
    )  # fmt: skip

    def __init__(self, request: web.Request, budget: BodyBudget) -> None:
        self.request = request
        self._hold = budget.hold()
        self.method = request.method
        self.path = request.path
        self.target = str(request.rel_url)
        self.headers: Headers = request.headers
        self.remote = request.remote
        self.scheme = request.scheme
        self.chunked = False
        self.response: web.StreamResponse | None = None
        self._writer: web.StreamResponse | None = None
        self._stream: AbstractStreamWriter | None = None

    @property
    def transport(self) -> asyncio.Transport | None:
        """The client's connection (``None`` once it is gone)."""
        return self.request.transport

    def gone(self) -> bool:
        """The client's connection is closed or closing."""
        t = self.request.transport
        return t is None or t.is_closing()

    def forget_headers(self) -> None:
        """Nothing to let go: the aiohttp request keeps its headers anyway."""

    def body_now(self, limit: int) -> bytes | None:
        """Not known without reading: ``read_body`` reads it."""
        return None

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; ``Refused``: 413 past ``limit`` bytes, 503 over budget.

        A declared length is reserved whole before reading; a chunked body as it grows.
        """
        declared = self.request.content_length
        if declared is not None and declared > limit:
            raise too_large(limit, declared)
        hold = self._hold
        if declared and not hold.grow(declared):
            raise over_budget(hold.budget, declared)
        buf = bytearray()
        content = self.request.content
        while True:
            chunk = await content.readany()
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > limit:
                raise too_large(limit, None)
            if declared is None and not hold.grow(len(chunk)):
                raise over_budget(hold.budget, None)

    def release_body(self) -> None:
        """The body went upstream (or never will): give its bytes back to the budget."""
        self._hold.release()

    def refuse(
        self, status: int, error_type: str, message: str, retry_after_s: int | None = None
    ) -> None:
        """Answer with an error of ours instead of a relayed response."""
        self.response = json_error(status, error_type, message, retry_after_s)
        if not self.request.content.at_eof():
            self.response.force_close()  # the body was not read to its end

    def interim(self, status: int, reason: str, headers: Headers) -> None:
        """Relay an interim (1xx) response: written ahead of aiohttp's response, which has
        not started (as aiohttp itself writes ``100 Continue``); never to HTTP/1.0."""
        t = self.request.transport
        if self.response is not None or t is None or t.is_closing():
            return
        if self.request.version < (1, 1):
            return
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines.extend(f"{k}: {v}" for k, v in client_response_headers(headers, keep_length=False)
                     .items())  # fmt: skip
        t.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def start(self, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        """Send the response head (``Content-Length`` in ``headers`` means not chunked)."""
        resp = web.StreamResponse(status=status, reason=reason, headers=headers)
        self.response = resp
        writer = await resp.prepare(self.request)
        resp.headers.clear()  # sent: not kept while the body streams (memory per open stream)
        self.chunked = bool(getattr(writer, "chunked", False))
        self._writer = resp
        self._stream = writer

    def start_held(self, status: int, reason: str, headers: CIMultiDict[str]) -> bytes | None:
        """aiohttp writes its head itself: ``start``."""
        return None

    def end_held(self) -> bytes | None:
        """aiohttp writes its end itself: ``end``."""
        return None

    async def write(self, data: bytes) -> None:
        """Send body bytes, waiting while the client's buffer is full (``ConnectionError``)."""
        assert self._writer is not None, "start first"
        await self._writer.write(data)

    async def drain(self) -> None:
        """Wait until the client's buffer has room (``ConnectionError`` if it went away)."""
        if self._stream is None:
            raise ConnectionResetError("the response could not start")
        await self._stream.drain()

    async def end(self) -> None:
        """End the response cleanly (``ConnectionError`` if the client went away)."""
        assert self._writer is not None, "start first"
        await self._writer.write_eof()

    def abort(self) -> None:
        """Cut the connection without a clean end (bytes sent so far stay sent)."""
        if self.response is not None:
            self.response.force_close()
        t = self.request.transport
        if t is not None:
            t.close()


def over_budget(budget: BodyBudget, declared: int | None) -> Refused:
    """The 503 of a request body that does not fit in the body budget now."""
    return Refused(503, "body_budget", budget_message(budget, declared), RETRY_AFTER_S)


def too_large(limit: int, declared: int | None) -> Refused:
    """The 413 of a request body over ``--max-body-bytes``."""
    if declared is not None:
        msg = f"request body of {declared} bytes exceeds the proxy's limit of {limit} bytes"
    else:
        msg = f"request body exceeds the proxy's limit of {limit} bytes"
    return Refused(413, "body_too_large", msg + " (--max-body-bytes)")
