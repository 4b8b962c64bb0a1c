"""An independent reader of Prometheus's protobuf exposition, for the tests.

``io/prometheus/client/metrics.proto`` (field numbers as Prometheus publishes
them, proto3 like Prometheus's own copy) declared as a ``FileDescriptorProto``
in code, its message classes made by the ``google.protobuf`` runtime; and a
reader of the length-delimited stream. Nothing here is shared with the
encoder under test.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

F = descriptor_pb2.FieldDescriptorProto

_MESSAGES: dict[str, list[tuple[str, int, int, str, bool]]] = {
    # message: (field, number, type, message type, repeated)
    "LabelPair": [("name", 1, F.TYPE_STRING, "", False), ("value", 2, F.TYPE_STRING, "", False)],
    "Gauge": [("value", 1, F.TYPE_DOUBLE, "", False)],
    "Counter": [
        ("value", 1, F.TYPE_DOUBLE, "", False),
        ("exemplar", 2, F.TYPE_MESSAGE, "Exemplar", False),
        ("created_timestamp", 3, F.TYPE_MESSAGE, ".google.protobuf.Timestamp", False),
    ],
    "Quantile": [("quantile", 1, F.TYPE_DOUBLE, "", False), ("value", 2, F.TYPE_DOUBLE, "", False)],
    "Summary": [
        ("sample_count", 1, F.TYPE_UINT64, "", False),
        ("sample_sum", 2, F.TYPE_DOUBLE, "", False),
        ("quantile", 3, F.TYPE_MESSAGE, "Quantile", True),
        ("created_timestamp", 4, F.TYPE_MESSAGE, ".google.protobuf.Timestamp", False),
    ],
    "Untyped": [("value", 1, F.TYPE_DOUBLE, "", False)],
    "Histogram": [
        ("sample_count", 1, F.TYPE_UINT64, "", False),
        ("sample_count_float", 4, F.TYPE_DOUBLE, "", False),
        ("sample_sum", 2, F.TYPE_DOUBLE, "", False),
        ("bucket", 3, F.TYPE_MESSAGE, "Bucket", True),
        ("created_timestamp", 15, F.TYPE_MESSAGE, ".google.protobuf.Timestamp", False),
        ("schema", 5, F.TYPE_SINT32, "", False),
        ("zero_threshold", 6, F.TYPE_DOUBLE, "", False),
        ("zero_count", 7, F.TYPE_UINT64, "", False),
        ("zero_count_float", 8, F.TYPE_DOUBLE, "", False),
        ("negative_span", 9, F.TYPE_MESSAGE, "BucketSpan", True),
        ("negative_delta", 10, F.TYPE_SINT64, "", True),
        ("negative_count", 11, F.TYPE_DOUBLE, "", True),
        ("positive_span", 12, F.TYPE_MESSAGE, "BucketSpan", True),
        ("positive_delta", 13, F.TYPE_SINT64, "", True),
        ("positive_count", 14, F.TYPE_DOUBLE, "", True),
        ("exemplars", 16, F.TYPE_MESSAGE, "Exemplar", True),
    ],
    "Bucket": [
        ("cumulative_count", 1, F.TYPE_UINT64, "", False),
        ("cumulative_count_float", 4, F.TYPE_DOUBLE, "", False),
        ("upper_bound", 2, F.TYPE_DOUBLE, "", False),
        ("exemplar", 3, F.TYPE_MESSAGE, "Exemplar", False),
    ],
    "BucketSpan": [
        ("offset", 1, F.TYPE_SINT32, "", False),
        ("length", 2, F.TYPE_UINT32, "", False),
    ],
    "Exemplar": [
        ("label", 1, F.TYPE_MESSAGE, "LabelPair", True),
        ("value", 2, F.TYPE_DOUBLE, "", False),
        ("timestamp", 3, F.TYPE_MESSAGE, ".google.protobuf.Timestamp", False),
    ],
    "Metric": [
        ("label", 1, F.TYPE_MESSAGE, "LabelPair", True),
        ("gauge", 2, F.TYPE_MESSAGE, "Gauge", False),
        ("counter", 3, F.TYPE_MESSAGE, "Counter", False),
        ("summary", 4, F.TYPE_MESSAGE, "Summary", False),
        ("untyped", 5, F.TYPE_MESSAGE, "Untyped", False),
        ("histogram", 7, F.TYPE_MESSAGE, "Histogram", False),
        ("timestamp_ms", 6, F.TYPE_INT64, "", False),
    ],
    "MetricFamily": [
        ("name", 1, F.TYPE_STRING, "", False),
        ("help", 2, F.TYPE_STRING, "", False),
        ("type", 3, F.TYPE_ENUM, "MetricType", False),
        ("metric", 4, F.TYPE_MESSAGE, "Metric", True),
        ("unit", 5, F.TYPE_STRING, "", False),
    ],
}
METRIC_TYPES = ("COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM", "GAUGE_HISTOGRAM")


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(
        name="tokenstamp_test/io/prometheus/client/metrics.proto",
        package="io.prometheus.client",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    enum = f.enum_type.add(name="MetricType")
    for number, name in enumerate(METRIC_TYPES):
        enum.value.add(name=name, number=number)
    for message, fields in _MESSAGES.items():
        m = f.message_type.add(name=message)
        for name, number, kind, type_name, repeated in fields:
            field = m.field.add(name=name, number=number, type=kind)
            field.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
            if type_name:
                field.type_name = (
                    type_name if type_name.startswith(".") else f".io.prometheus.client.{type_name}"
                )
    return f


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(_file())
    return {
        name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"io.prometheus.client.{name}")
        )
        for name in _MESSAGES
    }


CLASSES = _classes()
MetricFamily = CLASSES["MetricFamily"]


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A base-128 varint at ``pos``: (value, position after it)."""
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def parse_delimited(data: bytes) -> list[Any]:
    """Every ``MetricFamily`` of a delimited stream; fails on trailing garbage."""
    out = []
    pos = 0
    while pos < len(data):
        size, pos = read_varint(data, pos)
        assert pos + size <= len(data), "a message runs past the end"
        family = MetricFamily()
        family.ParseFromString(data[pos : pos + size])
        out.append(family)
        pos += size
    return out


def native_buckets(h: Any) -> dict[int, int]:
    """A ``Histogram``'s positive native buckets as index -> count (spans and deltas undone)."""
    out: dict[int, int] = {}
    index = 0
    count = 0
    deltas = iter(h.positive_delta)
    for n, span in enumerate(h.positive_span):
        index = span.offset if n == 0 else index + span.offset
        for _ in range(span.length):
            count += next(deltas)
            out[index] = count
            index += 1
    assert next(deltas, None) is None, "more deltas than spans cover"
    return out
