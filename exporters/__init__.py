"""Exporters: turn the timing core's records into Prometheus, OpenTelemetry, JSONL."""
