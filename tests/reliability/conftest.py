"""Fixtures of the reliability suite: misbehaving upstreams, child processes, leak probes.

The figures table (faults survived, bad inputs, load, RSS) is printed at the
end of the run by ``pytest_terminal_summary``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import tests.reliability.helpers  # noqa: F401  (registers the hypothesis profiles)
from tests.reliability.figures import Figures
from tests.reliability.procs import Child, ProxyProcess, spawn_backend, spawn_proxy
from tests.reliability.rawserver import Behaviour, RawUpstream

_FIGURES = pytest.StashKey[Figures]()


@pytest.fixture(scope="session")
def figures(pytestconfig: pytest.Config) -> Figures:
    """The session's figures table."""
    return pytestconfig.stash.setdefault(_FIGURES, Figures())


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    """Print the figures table when the reliability suite ran."""
    figs = config.stash.get(_FIGURES, None)
    if figs is None or figs.empty:
        return
    terminalreporter.section("tokenstamp reliability figures")
    for line in figs.render():
        terminalreporter.write_line(line)


@pytest.fixture
async def raw_upstream() -> AsyncIterator[Callable[[Behaviour], Awaitable[RawUpstream]]]:
    """Start raw upstreams scripted by a behaviour; all closed at the end."""
    started: list[RawUpstream] = []

    async def make(behave: Behaviour) -> RawUpstream:
        up = await RawUpstream(behave).start()
        started.append(up)
        return up

    yield make
    for up in started:
        await up.close()


@pytest.fixture
async def proxy_process() -> AsyncIterator[Callable[..., Awaitable[ProxyProcess]]]:
    """Start ``tokenstamp serve`` child processes; each is stopped at the end."""
    started: list[ProxyProcess] = []

    async def make(upstream_url: str, *flags: str) -> ProxyProcess:
        p = await spawn_proxy(upstream_url, *flags)
        started.append(p)
        return p

    yield make
    for p in started:
        await p.child.stop(timeout_s=5)


@pytest.fixture
async def load_backend() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Start ``tests.reliability.loadbackend`` processes; each gives its base URL."""
    started: list[Child] = []

    async def make(keepalive_s: float = 75.0) -> str:
        child, url = await spawn_backend(keepalive_s)
        started.append(child)
        return url

    yield make
    for child in started:
        await child.stop(timeout_s=5)
