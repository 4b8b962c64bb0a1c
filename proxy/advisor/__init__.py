"""The chunk-size advisor: a cost model fitted per backend from the proxy's own observations.

``observations`` collects bounded windows of what the streams did (a ``StreamWatcher``
and a fan-out subscriber, O(1) per token); ``fit`` turns them into the cost model; ``predict``
turns the cost model into the seed's trade table for candidate chunk sizes, a
recommendation, the capacity and a separate prefill pool; ``report`` renders
that as JSON and as text; ``web`` serves ``GET /advice`` and publishes the gauges;
``cli`` is ``tokenstamp advise``. The first four are pure (no framework imports).
"""
