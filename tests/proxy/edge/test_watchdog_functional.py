"""The body watchdog: one timer for every body."""

from __future__ import annotations

import asyncio

from proxy.edge.tasks import TaskSet
from proxy.edge.watchdog import Watchdogs


class _Body:
    """A body being relayed, as the watchdog reads it (the relay's progress and expiry)."""

    def __init__(self) -> None:
        self.received_bytes = 0
        self.waiting_for_data = True
        self.expired = False
        self.cut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def expire(self) -> None:
        self.expired = True
        if not self.cut.done():
            self.cut.set_result(None)


async def _relay(dogs: Watchdogs, body: _Body, trickle_s: float | None, last_byte: list[float]):
    """Wait while watched, as a relay does; bytes arrive every ``trickle_s`` (None: never)."""
    loop = asyncio.get_running_loop()
    last_byte.append(loop.time())
    dog = dogs.watch(body)
    try:
        while True:
            done, _ = await asyncio.wait({body.cut}, timeout=trickle_s or 3600)
            if done:
                raise TimeoutError("expired by the watchdog")
            body.received_bytes += 1
            last_byte[-1] = loop.time()
    finally:
        dogs.unwatch(dog)


async def test_one_timer_cuts_the_silent_body_only_after_two_periods_of_silence():
    period = 0.1
    dogs = Watchdogs(period)
    loop = asyncio.get_running_loop()
    silent, alive, paused = _Body(), _Body(), _Body()
    paused.waiting_for_data = False  # the relay waits on its client: never cut for that
    marks: dict[str, list[float]] = {"silent": [], "alive": [], "paused": []}
    tasks = TaskSet()
    alive_task = tasks.spawn(_relay(dogs, alive, 0.02, marks["alive"]))
    paused_task = tasks.spawn(_relay(dogs, paused, None, marks["paused"]))
    await asyncio.sleep(0.15)  # the silent one enters between two looks
    silent_task = tasks.spawn(_relay(dogs, silent, None, marks["silent"]))
    await asyncio.sleep(0.01)
    assert len(dogs) == 3
    try:
        await silent_task
    except TimeoutError:
        cut_after = loop.time() - marks["silent"][-1]
    else:
        raise AssertionError("the silent body was not cut")
    assert 2 * period <= cut_after < 3 * period + 0.5  # upper bound: slack for a busy host
    await asyncio.sleep(4 * period)
    assert not alive_task.done()
    assert not paused_task.done()
    assert len(dogs) == 2
    alive_task.cancel()
    paused_task.cancel()
    await asyncio.gather(alive_task, paused_task, return_exceptions=True)
    assert len(dogs) == 0  # nothing watched: the timer is stopped


class _BrokenBody:
    """A body whose progress cannot be read (after entry)."""

    received_bytes = 0
    expired = False

    @property
    def waiting_for_data(self) -> bool:
        raise RuntimeError("progress unknown")

    def expire(self) -> None:
        raise AssertionError("never found silent: its look fails")


async def test_a_body_whose_look_fails_does_not_stop_the_watch_over_the_others(caplog):
    dogs = Watchdogs(0.05)
    tasks = TaskSet()
    broken = dogs.watch(_BrokenBody())
    try:
        silent = tasks.spawn(_relay(dogs, _Body(), None, []))  # watched after the broken one
        await asyncio.wait({silent}, timeout=1.0)
        if not silent.done():
            silent.cancel()
    finally:
        dogs.unwatch(broken)
    assert isinstance(silent.exception(), TimeoutError)  # cut all the same
    assert "looking at a body failed" in caplog.text


async def test_bodies_one_after_another_are_each_cut_when_silent():
    """The timer is not cancelled when the last body leaves: a body watched while it is
    still armed, and one watched after it ran out with nothing to watch, are both cut."""
    period = 0.05
    dogs = Watchdogs(period)
    loop = asyncio.get_running_loop()
    tasks = TaskSet()
    dogs.unwatch(dogs.watch(_Body()))  # a body that ended at once: the timer stays armed
    for wait_s in (0.0, 3 * period):  # while armed; after the look that found nothing
        await asyncio.sleep(wait_s)
        marks: list[float] = []
        silent = tasks.spawn(_relay(dogs, _Body(), None, marks))
        await asyncio.wait({silent}, timeout=20 * period)
        if not silent.done():
            silent.cancel()
            raise AssertionError(f"a silent body watched {wait_s:g} s after the last was not cut")
        assert isinstance(silent.exception(), TimeoutError)
        assert loop.time() - marks[-1] >= 2 * period  # never before two periods of silence
        assert len(dogs) == 0
