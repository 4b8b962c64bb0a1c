"""What one proxy application owns: configuration, sinks, the backend view, the session.

Its own module so that the handler (``proxy.edge.app``), the relay loops
(``proxy.edge.relay``) and the admin app can all name it without importing
one another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from proxy.config import ProxyConfig
from proxy.core.backend_view import BackendView
from proxy.core.labels import ErrorKindLabeler, ModelLabeler, TenantLabeler
from proxy.core.records import Backend, Sink
from proxy.core.timing import GapTargets, StreamWatcher
from proxy.edge.budget import BodyBudget
from proxy.edge.pool import UpstreamPool
from proxy.edge.tasks import TaskSet
from proxy.edge.watchdog import Watchdogs

if TYPE_CHECKING:
    # Only the type: OpenTelemetry is imported by whoever turns tracing on.
    from proxy.edge.tracing import Tracing


@dataclass(slots=True)
class ProxyState:
    """Everything the handler needs, owned by one application."""

    config: ProxyConfig
    """Validated configuration."""
    sink: Sink
    """Where the timing core reports."""
    clock: Callable[[], int]
    """Monotonic nanosecond clock."""
    backend: Backend
    """The upstream's labels."""
    labeler: ModelLabeler
    """Bounded model labels."""
    watchdogs: Watchdogs
    """The read watchdog of every body being relayed (one timer for all)."""
    body_budget: BodyBudget
    """Request-body bytes held at once, across all connections (``--body-budget``)."""
    tenants: TenantLabeler | None = None
    """Bounded tenant labels (``--tenant-header``); ``None``: tenants are not labelled."""
    error_kinds: ErrorKindLabeler = field(default_factory=ErrorKindLabeler)
    """Bounded ``error.type`` values reported by the upstream in its stream."""
    watcher: StreamWatcher | None = None
    """What sees every stream's events: the stall view, and any extra watcher."""
    watcher_gaps: GapTargets = ()
    """``gap_targets(watcher)``, built once: every timer of the proxy shares it."""
    stalls: BackendView | None = None
    """The backend's stall view, when stall detection is on."""
    tracing: Tracing | None = None
    """Spans and trace-context propagation, when a tracer provider is given."""
    pool: UpstreamPool | None = None
    """Upstream connections of every forwarded request (``proxy.edge.upstream``), opened
    in ``cleanup_ctx``."""
    tasks: TaskSet = field(default_factory=TaskSet)
    """Background work owned by the app."""
    in_flight: int = 0
    """Requests being proxied right now."""
    draining: bool = False
    """SIGTERM received: readiness is false, new work is refused."""
    inject_usage: bool = True
    """Usage injection in force (turned off if the upstream refuses it)."""


STATE: web.AppKey[ProxyState] = web.AppKey("tokenstamp_state", ProxyState)
