"""What can go wrong with an upstream exchange: one exception class per ``error.type`` value.

The names are the ones aiohttp's client raises for the same failures (which
carried the proxy's requests before its own client did), so dashboards and
alerts written on those ``error.type`` values keep working.
"""

from __future__ import annotations

from typing import ClassVar


class UpstreamError(Exception):
    """The upstream failed; ``kind`` is the bounded ``error.type`` value."""

    kind: ClassVar[str] = "UpstreamError"


class ConnectFailed(UpstreamError):
    """No connection could be opened."""

    kind: ClassVar[str] = "ClientConnectorError"


class NameNotResolved(ConnectFailed):
    """The upstream's host name did not resolve."""

    kind: ClassVar[str] = "ClientConnectorDNSError"


class DisconnectedBeforeHead(UpstreamError):
    """The upstream closed the connection without answering."""

    kind: ClassVar[str] = "ServerDisconnectedError"


class ResetBeforeHead(UpstreamError):
    """The upstream reset the connection without answering."""

    kind: ClassVar[str] = "ClientOSError"


class NotHttp(UpstreamError):
    """What the upstream answered is not an HTTP response."""

    kind: ClassVar[str] = "ClientResponseError"


class PayloadError(UpstreamError):
    """The body broke off: reset, closed before its end, or bad framing."""

    kind: ClassVar[str] = "ClientPayloadError"
