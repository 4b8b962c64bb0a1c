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

from proxy.edge.headers import Headers


class Refused(Exception):
    """The proxy refuses the request before contacting the upstream."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


def error_text(status: int, error_type: str, message: str) -> str:
    """An OpenAI-style error body (clients already parse this shape)."""
    return json.dumps({"error": {"message": message, "type": error_type, "code": status}})


def json_error(status: int, error_type: str, message: str) -> web.Response:
    """``error_text`` as an aiohttp response."""
    return web.Response(
        status=status,
        text=error_text(status, error_type, message),
        content_type="application/json",
        headers={"X-Tokenstamp-Error": error_type},
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

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; ``Refused`` (413) once it passes ``limit`` bytes."""
        ...

    def refuse(self, status: int, error_type: str, message: str) -> None:
        """Answer with an error of ours instead of a relayed response."""
        ...

    async def start(self, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        """Send the response head (``Content-Length`` in ``headers`` means not chunked)."""
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

    def __init__(self, request: web.Request) -> None:
        self.request = request
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

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; ``Refused`` (413) once it passes ``limit`` bytes."""
        declared = self.request.content_length
        if declared is not None and declared > limit:
            raise too_large(limit, declared)
        buf = bytearray()
        content = self.request.content
        while True:
            chunk = await content.readany()
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > limit:
                raise too_large(limit, None)

    def refuse(self, status: int, error_type: str, message: str) -> None:
        """Answer with an error of ours instead of a relayed response."""
        self.response = json_error(status, error_type, message)

    async def start(self, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        """Send the response head (``Content-Length`` in ``headers`` means not chunked)."""
        resp = web.StreamResponse(status=status, reason=reason, headers=headers)
        self.response = resp
        writer = await resp.prepare(self.request)
        resp.headers.clear()  # sent: not kept while the body streams (memory per open stream)
        self.chunked = bool(getattr(writer, "chunked", False))
        self._writer = resp
        self._stream = writer

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


def too_large(limit: int, declared: int | None) -> Refused:
    """The 413 of a request body over ``--max-body-bytes``."""
    if declared is not None:
        msg = f"request body of {declared} bytes exceeds the proxy's limit of {limit} bytes"
    else:
        msg = f"request body exceeds the proxy's limit of {limit} bytes"
    return Refused(413, "body_too_large", msg + " (--max-body-bytes)")
