"""Drive N requests through the core with the proxy's default sinks: the per-request cost.

Issue 30's measure: run it under callgrind for two request counts and divide the
difference of the instruction counts by the difference of the counts (start-up
cancels out); instruction counts are deterministic on a shared machine (with a
fixed hash seed). From the checkout's root, so its modules are the ones imported::

    export PYTHONPATH=$PWD PYTHONHASHSEED=0
    valgrind --tool=callgrind --callgrind-out-file=/tmp/a.out python scripts/request_cost.py 200
    valgrind --tool=callgrind --callgrind-out-file=/tmp/b.out python scripts/request_cost.py 1200

The default sinks are what ``proxy.edge.server`` builds without options: the
Prometheus exporter and the advisor's observations in one fan-out; the stall view
and the advisor as the watchers. ``CONCURRENCY`` streams overlap (or the second
argument's number), each of
``TOKENS`` output events, one every ``STEP_NS`` (no stalls); a finished stream's
slot starts the next request, so prefill windows close while others decode.
"""

from __future__ import annotations

import sys

from prometheus_client import CollectorRegistry

from exporters.fanout import Fanout
from exporters.prometheus import PrometheusSink
from proxy.advisor.observations import AdvisorObservations
from proxy.core.backend_view import BackendView
from proxy.core.records import Backend, Outcome, RequestLabels
from proxy.core.timing import StreamTimer, gap_targets
from proxy.timeline.tokenlog import FanoutWatcher

TOKENS = 10
CONCURRENCY = 8
STEP_NS = 20_000_000


def run(requests: int, concurrency: int = CONCURRENCY) -> int:
    """Run ``requests`` requests, ``concurrency`` at a time; return how many stalls the
    view reported (0 expected)."""
    backend = Backend("vllm", "127.0.0.1:8000")
    prom = PrometheusSink(CollectorRegistry())
    advised = AdvisorObservations(backend)
    fanout = Fanout(prom, advised)
    view = BackendView(backend, fanout)
    watcher = FanoutWatcher(view, advised)
    gaps = gap_targets(watcher)
    labels = RequestLabels("chat", "model", backend)
    now = 1_000_000_000
    started = 0
    slots: list[tuple[StreamTimer, int]] = []  # (timer, events so far)

    def start() -> tuple[StreamTimer, int]:
        nonlocal started
        rid = f"req-{started}"
        started += 1
        view.describe(rid, labels, prompt_tokens_hint=200)
        timer = StreamTimer(
            rid,
            labels,
            arrival_ns=now,
            start_unix_ns=1_700_000_000_000_000_000 + now,
            sink=fanout,
            watcher=watcher,
            request_model="model",
            watcher_gaps=gaps,
        )
        timer.streamed = True
        timer.forwarded(now + 50_000)
        return timer, -(len(slots) % 3)  # staggered: slots finish at different steps

    for _ in range(min(concurrency, requests)):
        slots.append(start())
    finished = 0
    while finished < requests:
        now += STEP_NS
        for k, (timer, seen) in enumerate(slots):
            now += STEP_NS // (4 * concurrency)
            if seen < 0:
                slots[k] = (timer, seen + 1)
                continue
            if seen == 0:
                timer.output(now)
            else:
                timer.token(now)
            events = seen + 1
            slots[k] = (timer, events)
            if events == TOKENS:
                timer.prompt_tokens, timer.completion_tokens = 200, TOKENS
                timer.finish(now + 100_000, Outcome.OK, 200)
                finished += 1
                if started < requests:
                    slots[k] = start()
        slots = [s for s in slots if s[1] < TOKENS]
    view.flush(now + 10 * STEP_NS)
    return sum(
        int(s.value)
        for m in prom.registry.collect()
        if m.name == "tokenstamp_stalls"
        for s in m.samples
        if s.name.endswith("_total")
    )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    print(run(*args) if args else run(1000))
