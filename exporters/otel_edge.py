"""What the HTTP edge counts itself, as OpenTelemetry instruments observed at each collection.

The same as ``exporters.prometheus.BodyBudgetMetrics`` and ``TenantOverflowMetrics``
(names, units and attributes from ``exporters.names``): the request-body budget's bytes
held, its size and its refusals; the requests whose tenant was folded into ``other``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from exporters import names
from exporters.otel_fit import METER_NAME
from proxy import __version__
from proxy.core.records import Backend

BudgetReading = Callable[[], tuple[int, int, int]]
"""Reads the budget now: bytes held, the budget's size, bodies refused so far."""


def observe_body_budget(
    meter_provider: MeterProvider, backend: Backend, read: BudgetReading
) -> None:
    """Register the budget's observable gauges and counter on ``meter_provider``."""
    meter = meter_provider.get_meter(METER_NAME, __version__)
    attrs = dict(zip(names.BACKEND_ATTRS, backend, strict=True))

    def one(index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read()[index], attrs)]

        return observe

    for inst, index in ((names.BODY_HELD, 0), (names.BODY_BUDGET, 1)):
        meter.create_observable_gauge(
            inst.name, [one(index)], unit=inst.unit, description=inst.description
        )
    inst = names.BODY_REFUSED
    meter.create_observable_counter(
        inst.name, [one(2)], unit=inst.unit, description=inst.description
    )


def observe_tenant_overflow(
    meter_provider: MeterProvider, backend: Backend, read: Callable[[], int]
) -> None:
    """Register ``tokenstamp.tenants.overflow`` (``read``: requests folded so far)."""
    meter = meter_provider.get_meter(METER_NAME, __version__)
    attrs = dict(zip(names.BACKEND_ATTRS, backend, strict=True))

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(read(), attrs)]

    inst = names.TENANTS_OVERFLOW
    meter.create_observable_counter(
        inst.name, [observe], unit=inst.unit, description=inst.description
    )
