"""The admin listener: ``/metrics``, ``/healthz``, ``/readyz``.

``/metrics`` speaks the Prometheus text format, or OpenMetrics when the
scraper's ``Accept`` header asks for it (exemplars travel there), or
Prometheus's protobuf format when the ``Accept`` header prefers that
(Prometheus with native histograms on) and ``--native-histograms`` is on
(the default): the same families, with exemplars, and the histograms with
their native buckets too (``exporters.protobuf_exposition``).
``/readyz`` is 200 while the upstream accepts TCP connections (checked at most
once a second) and 503 once draining starts, so a load balancer stops sending
before the listener closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporters import protobuf_exposition
from proxy.edge.state import ProxyState

_CHECK_EVERY_S = 1.0
_CONNECT_TIMEOUT_S = 1.0


@dataclass(slots=True)
class _Readiness:
    """Cached result of the last upstream reachability check."""

    checked_at: float = -1e18
    ok: bool = False
    reason: str = "not checked yet"


ADMIN_STATE: web.AppKey[ProxyState] = web.AppKey("tokenstamp_admin_state", ProxyState)
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("tokenstamp_registry", CollectorRegistry)
READINESS: web.AppKey[_Readiness] = web.AppKey("tokenstamp_readiness", _Readiness)


async def _metrics(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    accept = request.headers.get("Accept", "")
    if request.app[ADMIN_STATE].config.native_histograms and protobuf_exposition.accepts(accept):
        body = protobuf_exposition.encode(registry)
        content_type = protobuf_exposition.CONTENT_TYPE
    else:
        encoder, content_type = choose_encoder(accept)
        body = encoder(registry)
    return web.Response(body=body, headers={"Content-Type": content_type})


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _upstream_reachable(upstream: str) -> tuple[bool, str]:
    parts = urlsplit(upstream)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), timeout=_CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        return False, f"upstream {host}:{port} unreachable: {type(exc).__name__}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True, "upstream reachable"


async def _readyz(request: web.Request) -> web.Response:
    state = request.app[ADMIN_STATE]
    if state.draining:
        return web.Response(status=503, text="draining\n")
    r = request.app[READINESS]
    now = time.monotonic()
    if now - r.checked_at >= _CHECK_EVERY_S:
        r.ok, r.reason = await _upstream_reachable(state.config.upstream)
        r.checked_at = now
    return web.Response(status=200 if r.ok else 503, text=r.reason + "\n")


def create_admin_app(
    state: ProxyState,
    registry: CollectorRegistry,
    extra_routes: Callable[[web.Application], None] | None = None,
) -> web.Application:
    """The admin application sharing ``state`` with the proxy application."""
    app = web.Application()
    app[ADMIN_STATE] = state
    app[REGISTRY] = registry
    app[READINESS] = _Readiness()
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    if extra_routes is not None:
        extra_routes(app)
    return app
