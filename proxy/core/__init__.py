"""The pure observation core: bytes and nanosecond stamps in, events and records out.

``decoders`` turn upstream bytes into events (SSE, NDJSON, each API's chunk
meaning); ``timing`` keeps one request's stamps (t0, tf, t1, gaps);
``backend_view`` and ``stall_detector`` watch all streams of one backend and
name the prefills that froze them; ``records`` is the contract every exporter
reads (the records, and the ``Sink``'s events a subscriber takes). Also the bounded labels, the
prompt-size hint and usage injection. Nothing here imports asyncio, aiohttp,
prometheus_client or OpenTelemetry, and nothing here imports the rest of
tokenstamp: the clock is a parameter, so all of it runs under a fake clock.
"""
