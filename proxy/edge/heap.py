"""Giving the C heap's free pages back to the OS, once a second, on glibc.

Why: asyncio reads every socket with ``sock.recv(256 KiB)``; CPython allocates
the full 256 KiB for each read and shrinks it to the bytes received. Once
glibc's dynamic mmap threshold has risen past that size (it rises when a
larger mmapped block is freed), those buffers come from the main heap, which
then fragments: under steady streaming load the heap grew from 11 to 20 MiB
and RSS from 48 to 60 MiB in steps over 5 minutes, while malloc's in-use bytes
(10.4 MiB) and Python's objects stayed flat. The growth is free heap memory;
``malloc_trim(0)`` hands its pages back (RSS stays at 51-52 MiB) for about
0.25 ms a call (p99 0.75 ms), spent on the event loop between reads: a quarter
of the CPU one proxied request costs, once a second.

Pinning the mmap threshold (``MALLOC_MMAP_THRESHOLD_=131072``) stops the
growth too, but turns every socket read into an mmap/mremap/munmap round trip
(about 10 us a read, and a stream reads about once a token), so it is not done.

Other C libraries (musl, macOS) have no ``malloc_trim``: there the trimmer
is off. glibc's ``malloc_trim`` covers every arena, threads' ones included.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger("tokenstamp.heap")

TRIM_EVERY_S = 1.0
"""Seconds between two trims: frequent enough that little is left to hand back
each time (each call stays well under a millisecond), rarely enough that its
cost is noise."""


def _glibc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the running process, or ``None`` without one."""
    try:
        libc = ctypes.CDLL(None)  # the interpreter's own symbols: libc among them
    except OSError:
        return None
    fn = getattr(libc, "malloc_trim", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` on demand; does nothing where the C library lacks it."""

    __slots__ = ("_trim", "trims")

    def __init__(self, trim: Callable[[int], int] | None = None) -> None:
        """Use glibc's ``malloc_trim`` unless ``trim`` (same signature) is given."""
        self._trim = trim if trim is not None else _glibc_malloc_trim()
        self.trims = 0
        """Calls made so far."""

    @property
    def available(self) -> bool:
        """The C library can trim (glibc)."""
        return self._trim is not None

    def trim(self) -> bool:
        """Hand free heap pages back to the OS; whether any memory was released."""
        if self._trim is None:
            return False
        self.trims += 1
        return bool(self._trim(0))

    async def run(self, every_s: float = TRIM_EVERY_S) -> None:
        """Trim every ``every_s`` seconds until cancelled (returns at once when unavailable)."""
        if self._trim is None:
            return
        while True:
            await asyncio.sleep(every_s)
            try:
                self.trim()
            except Exception:  # housekeeping never breaks traffic
                log.exception("malloc_trim failed; heap trimming stops")
                return
