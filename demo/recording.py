"""The demo's sink: the Prometheus sink, also keeping every record of a run."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from exporters.prometheus import PrometheusSink
from proxy.core.records import PrefillRecord, RequestRecord, StallRecord


class RecordingSink(PrometheusSink):
    """The Prometheus sink, also keeping every record (the demo reads its tables from them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.records: dict[str, RequestRecord] = {}
        """Finished requests by request id."""
        self.stalls: list[StallRecord] = []
        """Every stall, in the order they became final."""
        self.prefills: list[PrefillRecord] = []
        """Every finished prefill, in order."""

    def request_finished(self, record: RequestRecord) -> None:
        """Count it, and keep it."""
        super().request_finished(record)
        self.records[record.request_id] = record

    def stall(self, record: StallRecord) -> None:
        """Count it, and keep it."""
        super().stall(record)
        self.stalls.append(record)

    def prefill_done(self, record: PrefillRecord) -> None:
        """Count it, and keep it."""
        super().prefill_done(record)
        self.prefills.append(record)
