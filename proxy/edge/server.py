"""Running the proxy: listeners, graceful drain on SIGTERM, in-process use.

Drain order on SIGTERM (or SIGINT): readiness turns false first; the proxy
listener stops accepting; open streams may finish until the drain timeout;
then everything closes and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry

from exporters.fanout import Fanout
from exporters.otel import OtelMetricsSink
from exporters.otel_edge import observe_body_budget, observe_tenant_overflow
from exporters.otel_fit import OtelBackendFitGauges
from exporters.otel_setup import OtelConfigError, Telemetry, build_telemetry
from exporters.otel_spans import SpanRecorder
from exporters.prometheus import (
    BackendFitGauges,
    BodyBudgetMetrics,
    PrometheusSink,
    TenantOverflowMetrics,
)
from proxy import hot_path_build
from proxy.advisor.observations import AdvisorObservations
from proxy.advisor.web import Advisor, advice_routes
from proxy.config import ConfigError, HostPort, ProxyConfig
from proxy.core.backend_fit import BackendFitRecord
from proxy.core.backend_view import BackendView
from proxy.core.ratelog import RateLimitedLog
from proxy.core.records import Backend, Sink
from proxy.core.stall_detector import StallSettings
from proxy.core.timing import StreamWatcher
from proxy.edge.admin import create_admin_app
from proxy.edge.app import create_app
from proxy.edge.front import Front
from proxy.edge.heap import HeapTrimmer
from proxy.edge.state import STATE, ProxyState
from proxy.edge.tracing import Tracing
from proxy.timeline.buffer import TimelineBuffer, TimelineSettings
from proxy.timeline.tokenlog import FanoutWatcher
from proxy.timeline.web import timeline_routes

log = logging.getLogger("tokenstamp.server")


class _BadRequestLog(logging.Filter):
    """Makes aiohttp's log of a request it could not parse one rate-limited warning.

    aiohttp logs a malformed request at ERROR with the parse error, whose text
    quotes the offending header line (an ``Authorization`` header included), and
    a client can send one per connection at will. Such a record becomes one
    WARNING line with the error's type alone, at most once per
    ``proxy.core.ratelog.EVERY_S`` seconds; the next line says how many were muted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.limit = RateLimitedLog(log)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        n = self.limit.allow()
        if n is None:
            return False
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        muted = f" ({n - 1} more like it not logged)" if n > 1 else ""
        record.msg = "bad request from %s: %s (details withheld: they may quote headers)%s"
        record.args = (peer, type(exc).__name__, muted)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = None
        record.exc_text = None
        return True


def _redact_bad_requests() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _BadRequestLog) for f in server_log.filters):
        server_log.addFilter(_BadRequestLog())


@dataclass(slots=True)
class RunningProxy:
    """A started proxy: its URLs, state and registry; ``close`` drains and stops it."""

    config: ProxyConfig
    """Configuration it runs with."""
    registry: CollectorRegistry
    """The registry ``/metrics`` exposes."""
    state: ProxyState
    """Shared state of the proxy application."""
    url: str
    """Base URL clients use."""
    admin_url: str
    """Base URL of the admin listener."""
    stalls: BackendView | None
    """The backend view detecting stalls (``None`` with ``--no-stall-detection``)."""
    front: Front = field(repr=False)
    """The proxy listener's connections (``proxy.edge.front``)."""
    _proxy_runner: web.AppRunner = field(repr=False)
    _admin_runner: web.AppRunner = field(repr=False)
    _listener: asyncio.Server = field(repr=False)
    telemetry: Telemetry | None = None
    """OTLP providers built from the configuration (``None`` when off or injected)."""
    timeline: TimelineBuffer | None = None
    """What ``/timeline`` shows (``None`` unless ``--timeline``)."""
    advisor: Advisor | None = None
    """The chunk-size advisor behind ``/advice`` (``None`` with ``--no-advisor``)."""

    async def close(self, drain_timeout_s: float | None = None) -> None:
        """Stop accepting, let open requests finish (bounded), then stop everything."""
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        self.state.draining = True  # readiness 503; responses now say Connection: close
        if self.config.drain_delay_s and drain_timeout_s is None:
            await asyncio.sleep(self.config.drain_delay_s)  # let the load balancer notice
        self._listener.close()  # stop accepting; open connections go on
        deadline = time.monotonic() + timeout
        while self.state.in_flight > 0 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if self.state.in_flight:
            log.warning("drain timeout: %d requests still open, closing them", self.state.in_flight)
        self.front.close_all()
        await self._proxy_runner.cleanup()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listener.wait_closed(), 1.0)
        await self._admin_runner.cleanup()
        if self.state.tracing is not None:
            self.state.tracing.close()
        if self.telemetry is not None:
            await self.telemetry.shutdown()


def _site_url(addresses: list[object], want: HostPort) -> str:
    for addr in addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            host = want.host if want.host not in ("0.0.0.0", "::") else "127.0.0.1"
            return f"http://{host}:{addr[1]}" if ":" not in host else f"http://[{host}]:{addr[1]}"
    raise RuntimeError("listener has no address")


async def _start_site(runner: web.AppRunner, where: HostPort, key: str) -> None:
    site = web.TCPSite(runner, where.host, where.port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot listen on {where}: {exc.strerror or exc}") from None


async def _listen(front: Front, where: HostPort) -> asyncio.Server:
    """The proxy listener: the front's connections (``proxy.edge.front``)."""
    loop = asyncio.get_running_loop()
    try:
        return await loop.create_server(front, where.host, where.port, reuse_address=True,
                                        backlog=128)  # fmt: skip
    except OSError as exc:
        raise ConfigError(f"--listen: cannot listen on {where}: {exc.strerror or exc}") from None


def proxy_app_runner(app: web.Application, config: ProxyConfig) -> web.AppRunner:
    """aiohttp's server for the proxy application: every request the front hands over."""
    return web.AppRunner(
        app,
        handler_cancellation=True,  # a client that goes away cancels its upstream request
        access_log=None,
        shutdown_timeout=1.0,
        # aiohttp closes a connection whose handler still waits for a complete request
        # head when this runs out: the slowloris guard, and the idle keep-alive.
        keepalive_timeout=config.header_timeout_s,
        # A request body goes upstream as the client sent it: decompressing it would send
        # other bytes under the client's Content-Encoding.
        auto_decompress=False,
    )


def stall_settings(config: ProxyConfig) -> StallSettings:
    """The stall detection knobs of ``config``."""
    return StallSettings(
        ratio=config.stall_ratio,
        floor_s=config.stall_floor_s,
        tolerance_s=config.stall_tolerance_s,
    )


def stall_view(config: ProxyConfig, sink: Sink) -> BackendView:
    """The backend view of ``config``'s upstream, reporting to ``sink``."""
    return BackendView(Backend(config.provider, config.backend_label), sink, stall_settings(config))


_FLUSH_EVERY_S = 1.0


async def _flush_stalls(view: BackendView, clock: Callable[[], int]) -> None:
    """Let the view report what became final while no stream event came (an idle backend)."""
    while True:
        await asyncio.sleep(_FLUSH_EVERY_S)
        view.flush(clock())


async def _sweep_spans(tracing: Tracing, clock: Callable[[], int]) -> None:
    """End the spans that lingered long enough for late stall records (an idle proxy)."""
    while True:
        await asyncio.sleep(_FLUSH_EVERY_S)
        tracing.sweep(clock())


async def start_proxy(
    config: ProxyConfig,
    *,
    registry: CollectorRegistry | None = None,
    sink: object | None = None,
    watcher: StreamWatcher | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> RunningProxy:
    """Start both listeners in the running loop; raise ``ConfigError`` if one cannot bind.

    ``sink`` is a fan-out subscriber (``exporters.fanout``) in place of the
    Prometheus exporter; the proxy's other subscribers join it in one fan-out.
    ``watcher`` sees every stream's events too, after the stall view. Spans
    go to ``tracer_provider`` and the metrics also to ``meter_provider``; when
    neither is given, both come from ``--otlp-endpoint`` and the ``OTEL_*``
    environment (OTLP export, off without an endpoint), owned and shut down here.
    """
    registry = registry if registry is not None else CollectorRegistry()
    _redact_bad_requests()
    telemetry = None
    if tracer_provider is None and meter_provider is None:
        try:
            telemetry = build_telemetry(config.otlp_endpoint, os.environ, config.otlp_histograms)
        except OtelConfigError as exc:
            raise ConfigError(str(exc)) from None
        if telemetry is not None:
            tracer_provider, meter_provider = telemetry.tracer_provider, telemetry.meter_provider
    subscribers: list[object] = []
    if sink is None:
        prom = PrometheusSink(registry, tenants=bool(config.tenant_headers))
        prom.slo_ttft_s = config.slo_ttft_s
        prom.slo_tpot_s = config.slo_tpot_s
        prom.slo_answer_ttft_s = config.slo_answer_ttft_s or None
        subscribers.append(prom)
    else:
        subscribers.append(sink)
    if meter_provider is not None:
        otel = OtelMetricsSink(
            meter_provider,
            slo_ttft_s=config.slo_ttft_s,
            slo_tpot_s=config.slo_tpot_s,
            slo_answer_ttft_s=config.slo_answer_ttft_s or None,
            gaps=telemetry.gaps if telemetry is not None else None,
            tenants=bool(config.tenant_headers),
        )
        subscribers.append(otel)
    timeline = None
    if config.timeline:  # its stamps come as a watcher, its records through the fan-out
        window = TimelineSettings(window_s=config.timeline_window_s)
        backend = Backend(config.provider, config.backend_label)
        timeline = TimelineBuffer(backend, window, origin_ns=clock())
        subscribers.append(timeline)
    advised = None
    if config.advisor:  # its stamps come as a watcher, prompt sizes through the fan-out
        advised = AdvisorObservations(Backend(config.provider, config.backend_label))
        subscribers.append(advised)
    settings = stall_settings(config)
    tracing = None
    if tracer_provider is not None:
        # A finished stream's span waits for the stalls decided after its end.
        linger_s = settings.max_delay_s + _FLUSH_EVERY_S + settings.tolerance_s
        spans = SpanRecorder(
            tracer_provider,
            linger_s=linger_s if config.stall_detection else 0.0,
            capture_content=config.capture_content,
        )
        tracing = Tracing(spans)
        subscribers.append(spans)  # the stall view's records, as events and links
    # One fan-out for the proxy: per event, the subscribers that take it. Telemetry never
    # breaks traffic: what a subscriber raises is caught, counted and logged there.
    fanout = Fanout(*subscribers)
    view = stall_view(config, fanout) if config.stall_detection else None
    watchers = [w for w in (view, watcher, timeline, advised) if w is not None]
    combined: StreamWatcher | None = (
        FanoutWatcher(*watchers) if len(watchers) > 1 else (watchers[0] if watchers else None)
    )
    app = create_app(
        config, sink=fanout, clock=clock, watcher=combined, stalls=view, tracing=tracing
    )
    state = app[STATE]
    budget = state.body_budget

    def read_budget() -> tuple[int, int, int]:
        return budget.held, budget.limit, budget.refused

    BodyBudgetMetrics(registry, state.backend, read_budget)
    if meter_provider is not None:
        observe_body_budget(meter_provider, state.backend, read_budget)
    tenants = state.tenants
    if tenants is not None:

        def folded() -> int:
            return tenants.folded

        TenantOverflowMetrics(registry, state.backend, folded)
        if meter_provider is not None:
            observe_tenant_overflow(meter_provider, state.backend, folded)
    if view is not None:
        _ = state.tasks.spawn(_flush_stalls(view, clock), name="tokenstamp-stall-flush")
    if tracing is not None and tracing.spans.linger_ns:
        _ = state.tasks.spawn(_sweep_spans(tracing, clock), name="tokenstamp-span-sweep")
    advisor = None
    if advised is not None:
        publishers = [BackendFitGauges(registry).publish]
        if meter_provider is not None:
            publishers.append(OtelBackendFitGauges(meter_provider).publish)

        def publish(record: BackendFitRecord) -> None:
            for one in publishers:
                one(record)

        advisor = Advisor(
            [advised],
            tpot_target_s=config.slo_tpot_s,
            clock=clock,
            publish=publish,
            upstream=config.upstream,
        )
        _ = state.tasks.spawn(advisor.run(), name="tokenstamp-advisor")
    shown = None if timeline is None else [timeline]
    add_timeline = timeline_routes(shown, clock=clock)
    add_advice = advice_routes(advisor)

    def extra_routes(admin_app: web.Application) -> None:
        add_timeline(admin_app)
        add_advice(admin_app)

    admin = create_admin_app(state, registry, extra_routes=extra_routes)
    proxy_runner = proxy_app_runner(app, config)
    admin_runner = web.AppRunner(admin, access_log=None, shutdown_timeout=1.0)
    await proxy_runner.setup()
    await admin_runner.setup()
    assert proxy_runner.server is not None
    front = Front(state, proxy_runner.server)
    listener: asyncio.Server | None = None
    try:
        listener = await _listen(front, config.listen)
        await _start_site(admin_runner, config.admin, "--admin")
    except ConfigError:
        if listener is not None:
            listener.close()
        await proxy_runner.cleanup()
        await admin_runner.cleanup()
        if telemetry is not None:
            await telemetry.shutdown()
        raise
    return RunningProxy(
        config=config,
        registry=registry,
        state=state,
        url=_site_url([s.getsockname() for s in listener.sockets], config.listen),
        admin_url=_site_url(list(admin_runner.addresses), config.admin),
        stalls=view,
        _proxy_runner=proxy_runner,
        _admin_runner=admin_runner,
        front=front,
        _listener=listener,
        telemetry=telemetry,
        timeline=timeline,
        advisor=advisor,
    )


async def serve_forever(config: ProxyConfig) -> int:
    """Run until SIGTERM or SIGINT, drain, return the exit status."""
    # Before the listeners open: once /readyz answers, a SIGTERM must drain, not kill.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    proxy = await start_proxy(config)
    log.info(
        "tokenstamp proxying %s -> %s (metrics on %s/metrics)",
        proxy.url,
        config.upstream,
        proxy.admin_url,
    )
    log.info("hot path: %s (see setup.py)", hot_path_build())
    if not config.observe:
        log.warning("observation is off (--observe false): requests are forwarded untouched "
                    "and none is timed or recorded")  # fmt: skip
    if proxy.timeline is not None:
        log.info("token timeline on %s/timeline", proxy.admin_url)
    # Process-wide housekeeping, so here and not in start_proxy (which tests and
    # the demo run several times in one process): see proxy.edge.heap.
    if config.heap_trim:
        _ = proxy.state.tasks.spawn(HeapTrimmer().run(), name="tokenstamp-heap-trim")
    # Everything loaded so far (modules, classes, the registry: ~50,000 objects) lives
    # as long as the process: out of the collector's sight, a full collection no
    # longer walks them, and no longer pauses every stream for ~15 ms to do it.
    gc.collect()
    gc.freeze()
    await stop.wait()
    log.info("draining: up to %g s for %d open requests", config.drain_timeout_s,
             proxy.state.in_flight)  # fmt: skip
    await proxy.close()
    log.info("stopped")
    return 0
