"""The advisor's fitted cost model of each backend as OpenTelemetry gauges.

The same five gauges as ``exporters.prometheus.BackendFitGauges`` (names,
units and attributes from ``exporters.names``), observed at each collection
from the last published ``BackendFitRecord``: a parameter not fitted yet is
not observed (absent, as in the scrape).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from exporters import names
from proxy import __version__
from proxy.core.backend_fit import BackendFitRecord
from proxy.core.records import Backend

METER_NAME = "tokenstamp"
"""Instrumentation scope (the same as ``exporters.otel``)."""


def chunk_gauge_value(record: BackendFitRecord) -> float | None:
    """``tokenstamp.backend.prefill_chunk``: the chunk size, 0 when unchunked, None unknown."""
    if record.chunked is True and record.chunk_size is not None:
        return float(record.chunk_size)
    return 0.0 if record.chunked is False else None


class OtelBackendFitGauges:
    """Observable gauges of the fitted parameters on an injected ``MeterProvider``."""

    def __init__(self, meter_provider: MeterProvider) -> None:
        meter = meter_provider.get_meter(METER_NAME, __version__)
        self._fits: dict[Backend, BackendFitRecord] = {}
        for inst, read in (
            (names.PREFILL_RATE, lambda r: r.prefill_tokens_per_s),
            (names.DECODE_STEP_BASE, lambda r: r.decode_base_s),
            (names.DECODE_STEP_PER_STREAM, lambda r: r.decode_per_stream_s),
            (names.PREFILL_STEP, lambda r: r.prefill_step_s),
            (names.PREFILL_CHUNK, chunk_gauge_value),
        ):
            assert inst.kind is names.Kind.GAUGE, inst.name
            meter.create_observable_gauge(
                inst.name, [self._callback(read)], unit=inst.unit, description=inst.description
            )

    def publish(self, record: BackendFitRecord) -> None:
        """Observe ``record``'s parameters from the next collection on."""
        self._fits[record.backend] = record

    def _callback(
        self, read: Callable[[BackendFitRecord], float | None]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            out = []
            for backend, record in self._fits.items():
                value = read(record)
                if value is not None:
                    attrs = dict(zip(names.BACKEND_ATTRS, backend, strict=True))
                    out.append(Observation(value, attrs))
            return out

        return observe
