"""Child processes of the suite (the real proxy command, the load backend) and /proc readings.

The proxy runs as ``python -m proxy.cli serve`` exactly as a user starts it;
its URLs are read from its start-up log line. Everything it logs is kept in
``log_lines`` (the secrets tests read it).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from proxy.edge.tasks import TaskSet

ROOT = Path(__file__).resolve().parents[2]
_PROXYING = re.compile(
    r"tokenstamp proxying (http://\S+) -> \S+ \(metrics on (http://\S+)/metrics\)"
)


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS`` of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def fd_census(pid: int | str = "self") -> tuple[int, int]:
    """(open file descriptors, of which sockets) of a process."""
    base = f"/proc/{pid}/fd"
    total = sockets = 0
    for name in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue  # closed while we looked
        total += 1
        sockets += target.startswith("socket:")
    return total, sockets


@dataclass
class Child:
    """A started child process whose output lines are collected."""

    proc: asyncio.subprocess.Process
    log_lines: list[str] = field(default_factory=list)
    _tasks: TaskSet = field(default_factory=TaskSet)

    @property
    def pid(self) -> int:
        """Process id."""
        return self.proc.pid

    async def _pump(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.log_lines.append(line.decode("utf-8", "replace").rstrip("\n"))

    async def wait_line(self, pattern: re.Pattern[str], timeout_s: float = 20.0) -> re.Match[str]:
        """The first output line matching ``pattern`` (already seen or still to come)."""
        async with asyncio.timeout(timeout_s):
            while True:
                for line in self.log_lines:
                    if m := pattern.search(line):
                        return m
                if self.proc.returncode is not None:
                    raise RuntimeError("child exited:\n" + "\n".join(self.log_lines[-30:]))
                await asyncio.sleep(0.02)

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send ``sig`` and wait for the exit status (killed after ``timeout_s``)."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
            try:
                async with asyncio.timeout(timeout_s):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self._tasks.cancel_all()
        assert self.proc.returncode is not None
        return self.proc.returncode


async def spawn(*args: str, env: dict[str, str] | None = None) -> Child:
    """Start ``python args...`` in the repository root, stdout and stderr merged."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT, env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    child = Child(proc)
    assert proc.stdout is not None
    _ = child._tasks.spawn(child._pump(proc.stdout))
    return child


@dataclass
class ProxyProcess:
    """``tokenstamp serve`` running as its own process."""

    child: Child
    url: str
    admin_url: str

    @property
    def pid(self) -> int:
        """Process id."""
        return self.child.pid


async def spawn_proxy(upstream_url: str, *flags: str) -> ProxyProcess:
    """Start the proxy command on free ports in front of ``upstream_url``."""
    child = await spawn(
        "-m", "proxy.cli", "serve", "--upstream", upstream_url,
        "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
        "--backend-name", "test-backend", "--provider", "vllm", *flags,
    )  # fmt: skip
    m = await child.wait_line(_PROXYING)
    return ProxyProcess(child, m.group(1), m.group(2))


async def spawn_backend(keepalive_s: float = 1.0) -> tuple[Child, str]:
    """Start ``tests.reliability.loadbackend``; its child and base URL."""
    child = await spawn("-m", "tests.reliability.loadbackend", "--port", "0",
                        "--keepalive", str(keepalive_s))  # fmt: skip
    m = await child.wait_line(re.compile(r"listening on (\d+)"))
    return child, f"http://127.0.0.1:{m.group(1)}"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition as ``{'name{labels}': value}`` (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        v for k, v in samples.items()
        if (k == name or k.startswith(name + "{")) and all(w in k for w in want)
    )  # fmt: skip
