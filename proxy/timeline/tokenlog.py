"""Per-request token timelines, and fanning one stream's events out to several watchers.

``TokenLog`` keeps, for the last ``capacity`` requests, when each was forwarded,
when every output event arrived and when it finished: what the demo measures
the seed's table from and what a timeline view draws. Bounded: at most
``capacity`` requests and ``max_tokens`` stamps per request are kept.
Pure: no framework imports.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

from proxy.core.timing import StreamWatcher


@dataclass(slots=True)
class Timeline:
    """What one request's stream looked like at the proxy (monotonic ns)."""

    request_id: str
    """The proxy's request id (the client's X-Request-Id when it sent one)."""
    forwarded_ns: int | None = None
    """``tf``: sent upstream."""
    token_ns: list[int] = field(default_factory=list)
    """Arrival of every output event, first token first."""
    end_ns: int | None = None
    """End of the stream, once finished."""
    dropped: int = 0
    """Stamps not kept because the stream passed ``max_tokens``."""

    @property
    def first_token_ns(self) -> int | None:
        """``t1``, once the first output event arrived."""
        return self.token_ns[0] if self.token_ns else None

    def gaps_ns(self) -> list[tuple[int, int]]:
        """Every gap as (start, end)."""
        t = self.token_ns
        return list(itertools.pairwise(t))


class TokenLog:
    """A ``StreamWatcher`` that remembers recent requests' timelines."""

    __slots__ = ("_capacity", "_max_tokens", "timelines")

    def __init__(self, capacity: int = 1024, max_tokens: int = 100_000) -> None:
        if capacity < 1 or max_tokens < 1:
            raise ValueError("TokenLog: capacity and max_tokens must be >= 1")
        self._capacity = capacity
        self._max_tokens = max_tokens
        self.timelines: OrderedDict[str, Timeline] = OrderedDict()
        """Timelines by request id, oldest first."""

    def _get(self, request_id: str) -> Timeline:
        tl = self.timelines.get(request_id)
        if tl is None:
            tl = Timeline(request_id)
            self.timelines[request_id] = tl
            while len(self.timelines) > self._capacity:
                self.timelines.popitem(last=False)
        return tl

    def _stamp(self, request_id: str, ns: int) -> None:
        tl = self._get(request_id)
        if len(tl.token_ns) < self._max_tokens:
            tl.token_ns.append(ns)
        else:
            tl.dropped += 1

    def forwarded(self, request_id: str, forwarded_ns: int) -> None:
        """Record ``tf``."""
        self._get(request_id).forwarded_ns = forwarded_ns

    def first_token(self, request_id: str, first_token_ns: int) -> None:
        """Record ``t1``."""
        self._stamp(request_id, first_token_ns)

    def gap(self, request_id: str, start_ns: int, end_ns: int) -> None:
        """Record the output event that ended a gap."""
        self._stamp(request_id, end_ns)

    def finished(self, request_id: str, end_ns: int) -> None:
        """Record the end."""
        self._get(request_id).end_ns = end_ns


class FanoutWatcher:
    """Passes every stream event to each watcher in order.

    A stream timer unpacks ``watchers`` and calls each one's ``gap`` itself, so
    the per-token fan-out costs no call of its own; ``gap`` here serves other callers.
    """

    __slots__ = ("watchers",)

    def __init__(self, *watchers: StreamWatcher) -> None:
        self.watchers = watchers
        """The watchers, called in this order (fixed once built: stream timers share them)."""

    def forwarded(self, request_id: str, forwarded_ns: int) -> None:
        """Fan out ``forwarded``."""
        for w in self.watchers:
            w.forwarded(request_id, forwarded_ns)

    def first_token(self, request_id: str, first_token_ns: int) -> None:
        """Fan out ``first_token``."""
        for w in self.watchers:
            w.first_token(request_id, first_token_ns)

    def gap(self, request_id: str, start_ns: int, end_ns: int) -> None:
        """Fan out ``gap``."""
        for w in self.watchers:
            w.gap(request_id, start_ns, end_ns)

    def finished(self, request_id: str, end_ns: int) -> None:
        """Fan out ``finished``."""
        for w in self.watchers:
            w.finished(request_id, end_ns)
