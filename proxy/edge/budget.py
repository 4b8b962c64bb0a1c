"""The request-body budget: how many bytes of request bodies the proxy holds at once.

An observed request's body is read whole before it is forwarded (the proxy
parses it: the model, the prompt's size, the usage it asks for), up to
``--max-body-bytes`` each. That bounds one request, not their sum: a few
hundred uploads just under the limit would hold gigabytes. ``BodyBudget``
bounds the sum (``--body-budget``): a body is reserved before its first byte
is kept (``Content-Length`` known) or as it grows (chunked), and released once
the request has gone upstream. A body that does not fit is refused with 503
and ``Retry-After`` (``Refused``), and the connection is closed, since its
bytes were not read. The default is a quarter of the memory the process may
use: the container's cgroup limit where there is one, else the machine's RAM.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("tokenstamp.proxy")

RETRY_AFTER_S = 1
"""What a refused client is told to wait (``Retry-After``): bodies go upstream in milliseconds."""

_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def memory_limit_bytes() -> int | None:
    """The memory this process may use: the cgroup's limit, else physical RAM (None: unknown)."""
    limits: list[int] = []
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text(encoding="ascii").strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for "none"
            limits.append(int(text))
    with contextlib.suppress(OSError, ValueError, AttributeError):  # not POSIX: unknown
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return min(limits) if limits else None


def default_budget(max_body_bytes: int) -> int:
    """A quarter of ``memory_limit_bytes``, never less than one body of ``max_body_bytes``."""
    memory = memory_limit_bytes()
    quarter = memory // 4 if memory else 1 << 30
    return max(quarter, max_body_bytes)


class BodyBudget:
    """Request-body bytes held at once across all connections, bounded by ``limit``."""

    __slots__ = ("held", "limit", "refused")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a body budget must be > 0 bytes, got {limit}")
        self.limit = limit
        """Most bytes held at once."""
        self.held = 0
        """Bytes reserved right now."""
        self.refused = 0
        """Bodies refused so far because they did not fit."""

    def hold(self) -> BodyHold:
        """A new, empty reservation for one request's body."""
        return BodyHold(self)


class BodyHold:
    """One request's share of the budget: grown before bytes are kept, released once."""

    __slots__ = ("budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        """The budget it is a share of."""
        self.size = 0
        """Bytes this request holds."""

    def grow(self, n: int) -> bool:
        """Reserve ``n`` more bytes; False (counted as refused) when they do not fit."""
        budget = self.budget
        if budget.held + n > budget.limit:
            budget.refused += 1
            return False
        budget.held += n
        self.size += n
        return True

    def release(self) -> None:
        """Give every byte back (idempotent): the body went upstream, or was dropped."""
        if self.size:
            self.budget.held -= self.size
            self.size = 0


def budget_message(budget: BodyBudget, want: int | None) -> str:
    """The 503's message for a body that did not fit."""
    size = f"a request body of {want} bytes" if want is not None else "this request body"
    return (
        f"the proxy holds {budget.held} of its {budget.limit} bytes of request bodies; "
        f"{size} does not fit now: retry shortly (--body-budget)"
    )
