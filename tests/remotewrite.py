"""Prometheus remote write for tests: float samples and native histograms into a real Prometheus.

Prometheus 2.42 (Debian 12's) has no OTLP receiver, and promtool 2.42 cannot
write native histograms in ``test rules`` input series; its remote-write
receiver (``--web.enable-remote-write-receiver``) takes native histograms
(``--enable-feature=native-histograms``). The messages are ``prompb``'s
(``prometheus/prompb/types.proto`` and ``remote.proto``), declared here field
for field so no generated code is needed; the body is snappy's block format,
written as one literal (valid snappy, just uncompressed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto

#: (message, [(field, number, type, repeated, type name or "", oneof index or None)]).
_MESSAGES: list[tuple[str, list[tuple[str, int, int, bool, str, int | None]]]] = [
    ("Label", [("name", 1, _F.TYPE_STRING, False, "", None),
               ("value", 2, _F.TYPE_STRING, False, "", None)]),
    ("Sample", [("value", 1, _F.TYPE_DOUBLE, False, "", None),
                ("timestamp", 2, _F.TYPE_INT64, False, "", None)]),
    ("BucketSpan", [("offset", 1, _F.TYPE_SINT32, False, "", None),
                    ("length", 2, _F.TYPE_UINT32, False, "", None)]),
    ("Histogram", [
        ("count_int", 1, _F.TYPE_UINT64, False, "", 0),
        ("count_float", 2, _F.TYPE_DOUBLE, False, "", 0),
        ("sum", 3, _F.TYPE_DOUBLE, False, "", None),
        ("schema", 4, _F.TYPE_SINT32, False, "", None),
        ("zero_threshold", 5, _F.TYPE_DOUBLE, False, "", None),
        ("zero_count_int", 6, _F.TYPE_UINT64, False, "", 1),
        ("zero_count_float", 7, _F.TYPE_DOUBLE, False, "", 1),
        ("negative_spans", 8, _F.TYPE_MESSAGE, True, ".prompb.BucketSpan", None),
        ("negative_deltas", 9, _F.TYPE_SINT64, True, "", None),
        ("negative_counts", 10, _F.TYPE_DOUBLE, True, "", None),
        ("positive_spans", 11, _F.TYPE_MESSAGE, True, ".prompb.BucketSpan", None),
        ("positive_deltas", 12, _F.TYPE_SINT64, True, "", None),
        ("positive_counts", 13, _F.TYPE_DOUBLE, True, "", None),
        ("reset_hint", 14, _F.TYPE_INT32, False, "", None),  # an enum on the wire
        ("timestamp", 15, _F.TYPE_INT64, False, "", None),
    ]),
    ("TimeSeries", [("labels", 1, _F.TYPE_MESSAGE, True, ".prompb.Label", None),
                    ("samples", 2, _F.TYPE_MESSAGE, True, ".prompb.Sample", None),
                    ("histograms", 4, _F.TYPE_MESSAGE, True, ".prompb.Histogram", None)]),
    ("WriteRequest", [("timeseries", 1, _F.TYPE_MESSAGE, True, ".prompb.TimeSeries", None)]),
]  # fmt: skip
_ONEOFS = {"Histogram": ("count", "zero_count")}


def _classes() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="tokenstamp_tests_prompb.proto", package="prompb", syntax="proto3"
    )
    for name, fields in _MESSAGES:
        msg = proto.message_type.add(name=name)
        for oneof in _ONEOFS.get(name, ()):
            msg.oneof_decl.add(name=oneof)
        for fname, number, ftype, repeated, type_name, oneof_index in fields:
            f = msg.field.add(name=fname, number=number, type=ftype)
            f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if type_name:
                f.type_name = type_name
            if oneof_index is not None:
                f.oneof_index = oneof_index
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prompb.{name}"))
        for name, _ in _MESSAGES
    }


PROMPB = _classes()
"""The prompb message classes by name."""


def snappy_block(data: bytes) -> bytes:
    """``data`` in snappy's block format as one literal (no compression, valid for any reader)."""
    out = bytearray()
    n = len(data)
    while True:  # the uncompressed length, a varint
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            break
    if data:
        size = len(data) - 1
        if size < 60:
            out.append(size << 2)
        else:
            width = (size.bit_length() + 7) // 8
            out.append((59 + width) << 2)
            out += size.to_bytes(width, "little")
        out += data
    return bytes(out)


@dataclass(frozen=True, slots=True)
class NativeHistogram:
    """One native histogram sample (Prometheus's sparse layout, counts absolute per bucket)."""

    schema: int
    """Resolution: bucket boundaries are powers of ``2 ** (2 ** -schema)`` (-4..8)."""
    count: int
    """Observations, the zero bucket's included."""
    sum: float
    """Sum of the observations."""
    zero_count: int = 0
    """Observations in the zero bucket."""
    zero_threshold: float = 0.0
    """Upper bound of the zero bucket (0: exact zeros only)."""
    positive: Mapping[int, int] = field(default_factory=dict)
    """Bucket index to count: bucket ``i`` holds ``(base**(i-1), base**i]``."""


def _spans_and_deltas(buckets: Mapping[int, int]) -> tuple[list[tuple[int, int]], list[int]]:
    """Prometheus's spans (offset from the previous span's end, length) and count deltas."""
    spans: list[tuple[int, int]] = []
    deltas: list[int] = []
    previous_index: int | None = None
    previous_count = 0
    for index in sorted(i for i, c in buckets.items() if c):
        if previous_index is None:
            spans.append((index, 1))
        elif index == previous_index + 1:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((index - previous_index - 1, 1))
        deltas.append(buckets[index] - previous_count)
        previous_index, previous_count = index, buckets[index]
    return spans, deltas


@dataclass(slots=True)
class WriteBatch:
    """Series to remote-write: float samples and native histograms, by label set."""

    series: list[Any] = field(default_factory=list)

    def _series(self, labels: Mapping[str, str]) -> Any:
        ts = PROMPB["TimeSeries"]()
        for name in sorted(labels):  # Prometheus wants them sorted, __name__ first
            if labels[name] != "":
                ts.labels.add(name=name, value=labels[name])
        self.series.append(ts)
        return ts

    def sample(self, labels: Mapping[str, str], value: float, timestamp_ms: int) -> None:
        """One float sample of the series ``labels`` (``__name__`` included)."""
        self._series(labels).samples.add(value=value, timestamp=timestamp_ms)

    def histogram(self, labels: Mapping[str, str], h: NativeHistogram, timestamp_ms: int) -> None:
        """One native histogram sample of the series ``labels``."""
        p = self._series(labels).histograms.add(
            count_int=h.count, sum=h.sum, schema=h.schema, zero_threshold=h.zero_threshold,
            zero_count_int=h.zero_count, timestamp=timestamp_ms,
        )  # fmt: skip
        spans, deltas = _spans_and_deltas(h.positive)
        for offset, length in spans:
            p.positive_spans.add(offset=offset, length=length)
        p.positive_deltas.extend(deltas)

    def body(self) -> bytes:
        """The snappy-framed ``WriteRequest``."""
        request = PROMPB["WriteRequest"]()
        request.timeseries.extend(self.series)
        return snappy_block(request.SerializeToString())


async def remote_write(url: str, batches: Sequence[WriteBatch]) -> None:
    """POST each batch to ``url`` (``.../api/v1/write``) in order; fail on a refusal."""
    headers = {
        "Content-Encoding": "snappy",
        "Content-Type": "application/x-protobuf",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
    async with aiohttp.ClientSession() as session:
        for batch in batches:
            async with session.post(url, data=batch.body(), headers=headers) as resp:
                if resp.status >= 300:
                    raise AssertionError(f"remote write refused: {resp.status} {await resp.text()}")
