"""proxy.edge.heap: the once-a-second malloc_trim, and its absence off glibc."""

from __future__ import annotations

import asyncio
import logging
import platform

import pytest

import proxy.edge.heap
from proxy.edge.heap import HeapTrimmer
from proxy.edge.tasks import TaskSet


@pytest.fixture
def no_malloc_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    """A C library without malloc_trim (musl, macOS)."""
    monkeypatch.setattr(proxy.edge.heap, "_glibc_malloc_trim", lambda: None)


def test_trim_calls_malloc_trim_with_no_padding() -> None:
    pads: list[int] = []

    def fake(pad: int) -> int:
        pads.append(pad)
        return 1

    trimmer = HeapTrimmer(fake)
    assert trimmer.available
    assert trimmer.trim() is True
    assert pads == [0]
    assert trimmer.trims == 1


@pytest.mark.usefixtures("no_malloc_trim")
def test_without_malloc_trim_nothing_runs() -> None:
    trimmer = HeapTrimmer()
    assert not trimmer.available
    assert trimmer.trim() is False
    assert trimmer.trims == 0


@pytest.mark.usefixtures("no_malloc_trim")
async def test_unavailable_run_returns_at_once() -> None:
    trimmer = HeapTrimmer()
    async with asyncio.timeout(1):
        await trimmer.run(every_s=3600)


async def test_run_trims_until_cancelled() -> None:
    third = asyncio.Event()

    def fake(pad: int) -> int:
        if trimmer.trims >= 3:
            third.set()
        return 0

    trimmer = HeapTrimmer(fake)
    tasks = TaskSet()
    task = tasks.spawn(trimmer.run(every_s=0.001))
    async with asyncio.timeout(5):
        await third.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_failing_trim_is_logged_once_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    def broken(pad: int) -> int:
        raise OSError("no")

    trimmer = HeapTrimmer(broken)
    with caplog.at_level(logging.ERROR, logger="tokenstamp.heap"):
        async with asyncio.timeout(1):
            await trimmer.run(every_s=0.001)
    assert trimmer.trims == 1
    assert "malloc_trim failed" in caplog.text


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_malloc_trim_is_found_and_callable() -> None:
    trimmer = HeapTrimmer()
    assert trimmer.available
    trimmer.trim()  # 0 or 1: whether anything was released depends on the heap
    assert trimmer.trims == 1
