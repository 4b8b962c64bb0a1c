"""The ``/timeline`` page on the admin listener: the page, its script and style, its feed.

Routes (added to the admin application by ``timeline_routes``):

- ``GET /timeline``: the page (``proxy/timeline/static/timeline.html``), plain HTML,
  CSS and JavaScript on a canvas; a Content-Security-Policy keeps every fetch
  on this server.
- ``GET /timeline/timeline.js``, ``/timeline/timeline.css``: its script and style.
- ``GET /timeline/feed``: server-sent events, one ``data:`` line of JSON every
  ``interval_s``: a snapshot first (``TimelineBuffer.feed``), then deltas. At
  most ``MAX_FEEDS`` readers at once (503 beyond).
- ``GET /timeline/snapshot``: the same snapshot as one JSON document.

Off unless enabled: every route then answers 404 with how to enable it. The
page shows request metadata (ids, models, prompt sizes, times), never prompt
text or headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from proxy.timeline.buffer import TimelineBuffer, TimelineCursor

MAX_FEEDS = 8
"""Feed readers served at once."""
FEED_INTERVAL_S = 0.5
"""Seconds between two feed messages."""

DISABLED_MESSAGE = (
    "The timeline is off. Start the proxy with --timeline (or TOKENSTAMP_TIMELINE=true; "
    "in the Helm chart config.timeline: true), and --timeline-window SECONDS for how much "
    "history it keeps (default 30). It shows request metadata (request ids, models, prompt "
    "sizes, timings) to anyone who can reach the admin port; never prompt text or keys.\n"
)

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_ASSETS = {
    "timeline.html": "text/html",
    "timeline.js": "text/javascript",
    "timeline.css": "text/css",
}


def read_asset(name: str) -> str:
    """The text of ``proxy/timeline/static/<name>`` (package data)."""
    return resources.files("proxy.timeline").joinpath("static", name).read_text(encoding="utf-8")


@dataclass(slots=True)
class TimelineHub:
    """The buffers the page shows and the state of its feeds."""

    buffers: tuple[TimelineBuffer, ...]
    """One per backend, in the order shown."""
    clock: Callable[[], int]
    """Monotonic nanoseconds: "now" of each message."""
    interval_s: float = FEED_INTERVAL_S
    """Seconds between two feed messages."""
    feeds: int = 0
    """Feed readers connected now."""
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the admin server shuts down: every feed ends."""

    def message(self, cursors: Sequence[TimelineCursor]) -> dict[str, Any]:
        """The next feed message for a reader holding ``cursors`` (one per buffer)."""
        now_ns = self.clock()
        kind = "delta" if cursors and cursors[0].started else "snapshot"
        parts = [b.feed(c, now_ns) for b, c in zip(self.buffers, cursors, strict=True)]
        window_s = max((b.settings.window_s for b in self.buffers), default=30.0)
        origin_ns = self.buffers[0].origin_ns if self.buffers else 0
        return {
            "type": kind,
            "now_us": (now_ns - origin_ns) // 1000,
            "window_s": window_s,
            "interval_ms": round(self.interval_s * 1000),
            "backends": parts,
        }


TIMELINE: web.AppKey[TimelineHub] = web.AppKey("tokenstamp_timeline", TimelineHub)
_ASSET_TEXT: web.AppKey[dict[str, str]] = web.AppKey("tokenstamp_timeline_assets", dict)


def _disabled(request: web.Request) -> web.Response:
    return web.Response(status=404, text=DISABLED_MESSAGE)


async def _page(request: web.Request) -> web.Response:
    if TIMELINE not in request.app:
        return _disabled(request)
    return _asset(request, "timeline.html")


def _asset(request: web.Request, name: str) -> web.Response:
    return web.Response(
        text=request.app[_ASSET_TEXT][name],
        content_type=_ASSETS[name],
        charset="utf-8",
        headers={
            "Content-Security-Policy": _CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        },
    )


async def _static(request: web.Request) -> web.Response:
    if TIMELINE not in request.app:
        return _disabled(request)
    name = request.match_info["name"]
    if name not in ("timeline.js", "timeline.css"):
        raise web.HTTPNotFound()
    return _asset(request, name)


async def _snapshot(request: web.Request) -> web.Response:
    if TIMELINE not in request.app:
        return _disabled(request)
    hub = request.app[TIMELINE]
    msg = hub.message([TimelineCursor() for _ in hub.buffers])
    return web.Response(
        body=orjson.dumps(msg),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


async def _feed(request: web.Request) -> web.StreamResponse:
    if TIMELINE not in request.app:
        return _disabled(request)
    hub = request.app[TIMELINE]
    if hub.feeds >= MAX_FEEDS:
        return web.Response(status=503, text=f"at most {MAX_FEEDS} timeline readers at once\n")
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",  # a buffering reverse proxy would hold the events
        }
    )
    hub.feeds += 1
    try:
        await response.prepare(request)
        await response.write(b"retry: 2000\n\n")
        cursors = [TimelineCursor() for _ in hub.buffers]
        while not hub.closing.is_set():
            body = orjson.dumps(hub.message(cursors))
            await response.write(b"data: " + body + b"\n\n")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hub.closing.wait(), hub.interval_s)
    except ConnectionError:
        pass  # the reader went away
    finally:
        hub.feeds -= 1
    return response


async def _on_shutdown(app: web.Application) -> None:
    hub = app.get(TIMELINE)
    if hub is not None:
        hub.closing.set()


def timeline_routes(
    buffers: Sequence[TimelineBuffer] | None,
    *,
    clock: Callable[[], int] = time.monotonic_ns,
    interval_s: float = FEED_INTERVAL_S,
) -> Callable[[web.Application], None]:
    """Add the timeline routes to an admin app; ``None`` (disabled): they answer 404."""

    def add(app: web.Application) -> None:
        if buffers is not None:
            app[TIMELINE] = TimelineHub(tuple(buffers), clock, interval_s)
            app[_ASSET_TEXT] = {name: read_asset(name) for name in _ASSETS}
            app.on_shutdown.append(_on_shutdown)
        app.router.add_get("/timeline", _page)
        app.router.add_get("/timeline/feed", _feed)
        app.router.add_get("/timeline/snapshot", _snapshot)
        app.router.add_get("/timeline/{name}", _static)

    return add
