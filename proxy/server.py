"""Running the proxy: listeners, graceful drain on SIGTERM, in-process use.

Drain order on SIGTERM (or SIGINT): readiness turns false first; the proxy
listener stops accepting; open streams may finish until the drain timeout;
then everything closes and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from exporters.prometheus import PrometheusSink
from proxy.admin import create_admin_app
from proxy.app import STATE, ProxyState, create_app
from proxy.config import ConfigError, HostPort, ProxyConfig
from proxy.records import Backend, Sink
from proxy.stall_detector import StallSettings
from proxy.stalls import BackendView
from proxy.timing import StreamWatcher
from proxy.tokenlog import FanoutWatcher

log = logging.getLogger("tokenstamp.server")


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
    _proxy_runner: web.AppRunner = field(repr=False)
    _admin_runner: web.AppRunner = field(repr=False)

    async def close(self, drain_timeout_s: float | None = None) -> None:
        """Stop accepting, let open requests finish (bounded), then stop everything."""
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        self.state.draining = True
        for site in list(self._proxy_runner.sites):
            await site.stop()
        deadline = time.monotonic() + timeout
        while self.state.in_flight > 0 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if self.state.in_flight:
            log.warning("drain timeout: %d requests still open, closing them", self.state.in_flight)
        await self._proxy_runner.cleanup()
        await self._admin_runner.cleanup()


def _site_url(runner: web.AppRunner, want: HostPort) -> str:
    for addr in runner.addresses:
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


def stall_view(config: ProxyConfig, sink: Sink) -> BackendView:
    """The backend view of ``config``'s upstream, reporting to ``sink``."""
    settings = StallSettings(
        ratio=config.stall_ratio,
        floor_s=config.stall_floor_s,
        tolerance_s=config.stall_tolerance_s,
    )
    return BackendView(Backend(config.provider, config.backend_label), sink, settings)


_FLUSH_EVERY_S = 1.0


async def _flush_stalls(view: BackendView, clock: Callable[[], int]) -> None:
    """Let the view report what became final while no stream event came (an idle backend)."""
    while True:
        await asyncio.sleep(_FLUSH_EVERY_S)
        view.flush(clock())


async def start_proxy(
    config: ProxyConfig,
    *,
    registry: CollectorRegistry | None = None,
    sink: Sink | None = None,
    watcher: StreamWatcher | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
) -> RunningProxy:
    """Start both listeners in the running loop; raise ``ConfigError`` if one cannot bind.

    ``watcher`` sees every stream's events too, after the stall view.
    """
    registry = registry if registry is not None else CollectorRegistry()
    if sink is None:
        prom = PrometheusSink(registry)
        prom.slo_ttft_s = config.slo_ttft_s
        prom.slo_tpot_s = config.slo_tpot_s
        sink = prom
    view = stall_view(config, sink) if config.stall_detection else None
    watchers = [w for w in (view, watcher) if w is not None]
    combined: StreamWatcher | None = (
        FanoutWatcher(*watchers) if len(watchers) > 1 else (watchers[0] if watchers else None)
    )
    app = create_app(config, sink=sink, clock=clock, watcher=combined, stalls=view)
    state = app[STATE]
    if view is not None:
        _ = state.tasks.spawn(_flush_stalls(view, clock), name="tokenstamp-stall-flush")
    admin = create_admin_app(state, registry)
    proxy_runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client that goes away cancels its upstream request
        access_log=None,
        shutdown_timeout=1.0,
    )
    admin_runner = web.AppRunner(admin, access_log=None, shutdown_timeout=1.0)
    await proxy_runner.setup()
    await admin_runner.setup()
    try:
        await _start_site(proxy_runner, config.listen, "--listen")
        await _start_site(admin_runner, config.admin, "--admin")
    except ConfigError:
        await proxy_runner.cleanup()
        await admin_runner.cleanup()
        raise
    return RunningProxy(
        config=config,
        registry=registry,
        state=state,
        url=_site_url(proxy_runner, config.listen),
        admin_url=_site_url(admin_runner, config.admin),
        stalls=view,
        _proxy_runner=proxy_runner,
        _admin_runner=admin_runner,
    )


async def serve_forever(config: ProxyConfig) -> int:
    """Run until SIGTERM or SIGINT, drain, return the exit status."""
    proxy = await start_proxy(config)
    log.info(
        "tokenstamp proxying %s -> %s (metrics on %s/metrics)",
        proxy.url,
        config.upstream,
        proxy.admin_url,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining: up to %g s for %d open requests", config.drain_timeout_s,
             proxy.state.in_flight)  # fmt: skip
    await proxy.close()
    log.info("stopped")
    return 0
