"""The stutter workload's client, in a process of its own.

A client sharing the proxy's event loop would wait for the proxy's work on
other streams before it reads its own bytes: it would measure the test's
scheduling, not the proxy. So the workload runs here, in a child process, on
the same system-wide monotonic clock.

Reads a plan (JSON) on stdin: ``url``, ``streams`` (``[request_id, body]``),
``stagger_s``, ``warm_events``, ``long`` (``[request_id, body]``). Starts the
streams ``stagger_s`` apart; once every stream has ``warm_events`` output
events (or one has ended), sends the long request; waits for everything.
Prints one JSON object: a capture per request, and how long this process
waited for a CPU (``/proc/self/task/*/schedstat``) while it ran.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from dataclasses import asdict
from typing import Any

from proxy.edge.tasks import TaskSet
from tests.realbackend.client import Capture
from tests.realbackend.rawclient import RawExchange, stream_raw
from tests.realbackend.sched import Boost, run_queue_wait_ns


def _dump(cap: Capture) -> dict[str, Any]:
    out = asdict(cap)
    out["body"] = bytes(cap.body).decode("utf-8", "replace")
    out["events"] = len(cap.events)
    return out


async def run(plan: dict[str, Any]) -> dict[str, Any]:
    """Run ``plan``; every capture keyed by request id."""
    url = plan["url"]
    tasks = TaskSet()
    caps: list[asyncio.Task[RawExchange]] = []
    reads: dict[str, int] = {}
    ids = [request_id for request_id, _ in plan["streams"]]
    timeout_s = float(plan.get("timeout_s", 240))
    for request_id, body in plan["streams"]:
        caps.append(tasks.spawn(stream_raw(url, body, request_id, progress=reads)))
        await asyncio.sleep(float(plan.get("stagger_s", 0)))
    # A read carries one event, about: wait for the role chunk plus ``warm_events``.
    warm = int(plan.get("warm_events", 0)) + 1
    for _ in range(20000):  # bounded: at most ~100 s of polling
        if all(reads.get(i, 0) >= warm for i in ids) or any(t.done() for t in caps):
            break
        await asyncio.sleep(0.005)
    results = []
    if plan.get("long"):
        request_id, body = plan["long"]
        results.append(await asyncio.wait_for(stream_raw(url, body, request_id), timeout_s))
    results += await asyncio.wait_for(asyncio.gather(*caps), timeout_s)
    parsed = [r.parse() for r in results]
    return {c.request_id: _dump(c) for c in parsed}


def main() -> int:
    """Plan on stdin, captures on stdout."""
    plan = json.load(sys.stdin)
    wait0 = run_queue_wait_ns()
    gc.disable()  # a bounded run of a small process: no collection pauses in the stamps
    with Boost():
        out = asyncio.run(run(plan))
    gc.enable()
    json.dump({"captures": out, "run_queue_wait_ns": run_queue_wait_ns() - wait0}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
