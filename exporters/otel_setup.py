"""OTLP export: which signals go where, the SDK providers that send them, their shutdown.

Configured like any OpenTelemetry SDK (the standard ``OTEL_*`` variables),
plus ``--otlp-endpoint``. Export is off while no endpoint is set:

- endpoint: ``--otlp-endpoint``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base
  URL; ``/v1/traces`` and ``/v1/metrics`` are appended), overridden per signal
  by ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``..._METRICS_ENDPOINT`` (used as is);
- ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: ``otlp`` (default) or
  ``none``; ``OTEL_SDK_DISABLED=true`` turns both off;
- protocol: ``http/protobuf`` only (``OTEL_EXPORTER_OTLP_PROTOCOL``);
- ``OTEL_EXPORTER_OTLP_(<SIGNAL>_)TIMEOUT``: seconds per export, retries
  included (the Python SDK reads it in seconds; default 10);
- everything else is read by the SDK itself: ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER(_ARG)``, ``OTEL_BSP_*``,
  ``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_EXPORTER_OTLP_(HEADERS|COMPRESSION|CERTIFICATE)``.

Histograms (``--otlp-histograms``): base-2 exponential by default (OTLP
``ExponentialHistogram``, at most ``names.EXPONENTIAL_MAX_SIZE`` buckets from
scale ``names.EXPONENTIAL_MAX_SCALE`` down), or each instrument's explicit
buckets. A view per histogram instrument fixes it, so the exporter's own
``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` does not apply to them.

Spans go through a ``BatchSpanProcessor`` and metrics through a
``PeriodicExportingMetricReader``: both export from their own thread, so a
dead or slow collector never blocks a request. A failed export is counted
(``ExportHealth``), and the SDK's log lines about it are rate-limited to one
per logger per minute, each saying how many exports failed so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import (
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

from exporters import names
from exporters.otel_gaps import SCOPE, GapBridgeReader, GapHistograms
from proxy import __version__

log = logging.getLogger("tokenstamp.telemetry")

DEFAULT_SERVICE_NAME = "tokenstamp"
"""``service.name`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` name one."""
LOG_EVERY_S = 60.0
"""At most one SDK export log line per logger in this many seconds."""
SDK_EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.metrics._internal.export",
)
"""The SDK loggers that speak about exports (rate-limited while the proxy runs)."""


class OtelConfigError(ValueError):
    """A bad ``--otlp-endpoint`` or ``OTEL_*`` value; the message names the key.

    The proxy's start-up turns it into its own configuration error (exit 2)."""


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    """Where each signal is exported; an empty endpoint turns that signal off."""

    traces_endpoint: str = ""
    """Full OTLP/HTTP URL for spans (``.../v1/traces``)."""
    metrics_endpoint: str = ""
    """Full OTLP/HTTP URL for metrics (``.../v1/metrics``)."""

    @property
    def enabled(self) -> bool:
        """Any signal is exported."""
        return bool(self.traces_endpoint or self.metrics_endpoint)


def _url(key: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OtelConfigError(f"{key}: expected an http:// or https:// URL, got {value!r}")
    return value


def _exporter_on(env: Mapping[str, str], key: str) -> bool:
    names = {x.strip().lower() for x in env.get(key, "otlp").split(",") if x.strip()}
    if names <= {"none"}:
        return False
    if names - {"otlp", "none"}:
        raise OtelConfigError(f"{key}: tokenstamp exports 'otlp' or 'none', got {env[key]!r}")
    return True


def otlp_settings(endpoint: str, env: Mapping[str, str]) -> OtlpSettings:
    """Resolve ``--otlp-endpoint`` and the ``OTEL_*`` variables; ``OtelConfigError`` names a
    bad key."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return OtlpSettings()
    base = endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    key = "--otlp-endpoint" if endpoint else "OTEL_EXPORTER_OTLP_ENDPOINT"
    base = _url(key, base).rstrip("/") if base else ""
    out: dict[str, str] = {}
    for signal in ("traces", "metrics"):
        upper = signal.upper()
        proto_key = f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"
        if proto_key not in env:
            proto_key = "OTEL_EXPORTER_OTLP_PROTOCOL"
        protocol = env.get(proto_key, "http/protobuf").strip()
        own_key = f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"
        own = env.get(own_key, "")
        url = _url(own_key, own) if own else (f"{base}/v1/{signal}" if base else "")
        if not url or not _exporter_on(env, f"OTEL_{upper}_EXPORTER"):
            continue
        if protocol != "http/protobuf":
            raise OtelConfigError(
                f"{proto_key}: tokenstamp exports OTLP over http/protobuf only (the "
                f"collector's port 4318), got {protocol!r}"
            )
        out[f"{signal}_endpoint"] = url
    return OtlpSettings(**out)


def export_timeout_s(env: Mapping[str, str], signal: str) -> float | None:
    """``OTEL_EXPORTER_OTLP_(<SIGNAL>_)TIMEOUT`` in seconds, as the Python SDK reads it
    (``None``: its default of 10 s); ``OtelConfigError`` names a bad value."""
    for key in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        raw = env.get(key, "").strip()
        if raw:
            try:
                value = float(raw)
            except ValueError:
                raise OtelConfigError(f"{key}: expected seconds, got {raw!r}") from None
            if not value > 0:
                raise OtelConfigError(f"{key}: must be > 0, got {raw!r}")
            return value
    return None


def resource(env: Mapping[str, str]) -> Resource:
    """The SDK resource (it reads ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
    itself); ``service.name`` defaults to ``tokenstamp``, ``service.version`` to ours."""
    given = env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    own: dict[str, str] = {}
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in given:
        own["service.name"] = DEFAULT_SERVICE_NAME
    if "service.version=" not in given:
        own["service.version"] = __version__
    return Resource.create(own)  # its argument wins over the environment: only what it lacks


@dataclass(slots=True)
class ExportHealth:
    """Failed exports, counted per signal (a dead collector shows up here and in one log line)."""

    failed: dict[str, int] = field(default_factory=lambda: {"traces": 0, "metrics": 0})
    """Failed export calls (after the SDK's own retries) by signal."""

    def count(self, signal: str) -> None:
        """One failed export of ``signal``."""
        self.failed[signal] = self.failed.get(signal, 0) + 1

    def summary(self) -> str:
        """``N span and M metric exports failed so far``."""
        return (
            f"{self.failed.get('traces', 0)} span and {self.failed.get('metrics', 0)} metric "
            "exports failed so far"
        )


class _CountingSpanExporter(OTLPSpanExporter):
    """The OTLP/HTTP span exporter, counting failures instead of raising."""

    def __init__(self, endpoint: str, health: ExportHealth, timeout_s: float | None) -> None:
        super().__init__(endpoint=endpoint, timeout=timeout_s)
        self._health = health

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = super().export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._health.count("traces")
        return result


class _CountingMetricExporter(OTLPMetricExporter):
    """The OTLP/HTTP metric exporter, counting failures instead of raising."""

    def __init__(self, endpoint: str, health: ExportHealth, timeout_s: float | None) -> None:
        super().__init__(endpoint=endpoint, timeout=timeout_s)
        self._health = health

    def export(
        self, metrics_data: MetricsData, timeout_millis: float | None = 10000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = super().export(metrics_data, timeout_millis, **kwargs)
        except Exception:
            result = MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._health.count("metrics")
        return result


class RateLimitFilter(logging.Filter):
    """Lets one record per logger through every ``every_s`` seconds; adds the failure count."""

    def __init__(
        self,
        health: ExportHealth,
        every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._health = health
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()  # the SDK logs from its export threads
        self.suppressed = 0
        """Records dropped so far."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep ``record`` if its logger has been quiet long enough."""
        now = self._clock()
        with self._lock:
            last = self._last.get(record.name)
            if last is not None and now - last < self._every_s:
                self.suppressed += 1
                return False
            self._last[record.name] = now
        record.msg = (
            f"{record.msg} [tokenstamp: {self._health.summary()}; traffic is unaffected; "
            f"similar lines muted for {self._every_s:g} s]"
        )
        return True


def histogram_views(aggregation: names.HistogramAggregation) -> list[View]:
    """One view per histogram instrument of ``exporters.names``: base-2 exponential buckets,
    or with ``EXPLICIT`` its own explicit ones (whatever the exporter would prefer)."""
    views = []
    for inst in names.ALL:
        if inst.kind is not names.Kind.HISTOGRAM:
            continue
        buckets = (
            ExponentialBucketHistogramAggregation(
                max_size=names.EXPONENTIAL_MAX_SIZE, max_scale=names.EXPONENTIAL_MAX_SCALE
            )
            if aggregation is names.HistogramAggregation.EXPONENTIAL
            else ExplicitBucketHistogramAggregation(boundaries=inst.buckets)
        )
        views.append(
            View(
                instrument_type=Histogram,
                instrument_name=inst.name,
                meter_name=SCOPE.name,
                aggregation=buckets,
            )
        )
    return views


class Telemetry:
    """SDK providers built from ``OtlpSettings``; owned here, so flushed and shut down here."""

    def __init__(
        self,
        settings: OtlpSettings,
        env: Mapping[str, str],
        histograms: names.HistogramAggregation = names.HistogramAggregation.EXPONENTIAL,
    ) -> None:
        self.settings = settings
        """Where each signal goes."""
        self.health = ExportHealth()
        """Failed exports so far."""
        self.log_filter = RateLimitFilter(self.health)
        """Rate limit on the SDK's export log lines (installed while the providers live)."""
        res = resource(env)
        self.tracer_provider: TracerProvider | None = None
        """Spans, batched to ``settings.traces_endpoint`` (``None`` when traces are off)."""
        self.meter_provider: MeterProvider | None = None
        """Metrics, read periodically to ``settings.metrics_endpoint`` (``None`` when off)."""
        if settings.traces_endpoint:
            self.tracer_provider = TracerProvider(resource=res)  # sampler: OTEL_TRACES_SAMPLER
            timeout_s = export_timeout_s(env, "traces")
            exporter = _CountingSpanExporter(settings.traces_endpoint, self.health, timeout_s)
            self.tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        preference = env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "")
        self.histograms = names.HistogramAggregation(histograms)
        """How the histograms are bucketed."""
        self.gaps = GapHistograms(
            delta=preference.strip().lower() in ("delta", "lowmemory"), aggregation=histograms
        )
        """The inter-token gaps, aggregated in-process and added to each metrics export."""
        if settings.metrics_endpoint:
            reader = GapBridgeReader(
                _CountingMetricExporter(
                    settings.metrics_endpoint, self.health, export_timeout_s(env, "metrics")
                ),
                self.gaps,
            )
            # Measurements are taken outside any span context, so a trace-based exemplar
            # filter would only cost time: off unless OTEL_METRICS_EXEMPLAR_FILTER says so.
            exemplars = None if "OTEL_METRICS_EXEMPLAR_FILTER" in env else AlwaysOffExemplarFilter()
            self.meter_provider = MeterProvider(
                metric_readers=[reader],
                resource=res,
                exemplar_filter=exemplars,
                views=histogram_views(self.histograms),
            )
        for name in SDK_EXPORT_LOGGERS:
            logging.getLogger(name).addFilter(self.log_filter)

    def _flush(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush()
        if self.meter_provider is not None:
            self.meter_provider.force_flush()

    def _shutdown(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is buffered now (off the event loop); False if it took too long."""
        return await _off_loop(self._flush, timeout_s, "tokenstamp-otel-flush")

    async def shutdown(self, timeout_s: float = 5.0) -> bool:
        """Export what is left and stop, waiting at most ``timeout_s`` (a dead collector
        must not hold up the exit); False if it took too long."""
        done = await _off_loop(self._shutdown, timeout_s, "tokenstamp-otel-shutdown")
        if not done:
            log.warning("OTLP export did not finish within %g s; %s", timeout_s,
                        self.health.summary())  # fmt: skip
        for name in SDK_EXPORT_LOGGERS:
            logging.getLogger(name).removeFilter(self.log_filter)
        return done


async def _off_loop(fn: Callable[[], None], timeout_s: float, name: str) -> bool:
    """Run blocking ``fn`` in a daemon thread; wait at most ``timeout_s`` for it.

    A daemon thread (not the loop's executor) so an export stuck on a dead
    collector can neither block the loop nor delay the process's exit.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def run() -> None:
        try:
            fn()
        except Exception:
            log.exception("OpenTelemetry %s failed", name)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(finished)

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout_s)
    except TimeoutError:
        return False
    return True


def build_telemetry(
    endpoint: str,
    env: Mapping[str, str],
    histograms: names.HistogramAggregation = names.HistogramAggregation.EXPONENTIAL,
) -> Telemetry | None:
    """The providers ``--otlp-endpoint``, ``--otlp-histograms`` and ``env`` ask for, or
    ``None`` when export is off."""
    settings = otlp_settings(endpoint, env)
    return Telemetry(settings, env, histograms) if settings.enabled else None
