"""The proxies the conformance suite holds side by side, each in front of one upstream URL.

- ``tokenstamp``: ``start_proxy`` as ``tokenstamp serve`` runs it: the front
  (``proxy.edge.front``) on the listener, the observed routes on tokenstamp's
  own upstream client, everything else on aiohttp's.
- ``aiohttp``: the same application (``create_app``) served by aiohttp's own
  server, without the front: what aiohttp's server answers to the same bytes.
- ``passthrough``: ``bench/passthrough.py``, aiohttp's server and aiohttp's
  client with no observation: the reference for what aiohttp's *client* does
  with a misbehaving upstream.
- ``nginx``: nginx 1.22 as the benchmark configures it (``bench/nginx.py``:
  HTTP/1.1 upstream keep-alive, ``proxy_buffering off``), a child process;
  absent (``None``) when nginx is not installed.

Every target listens on 127.0.0.1 and is stopped by ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from bench.children import free_ports
from bench.nginx import find_program
from bench.passthrough import create_app as passthrough_app
from exporters.prometheus import PrometheusSink
from proxy.config import HostPort, ProxyConfig
from proxy.edge.app import create_app
from proxy.edge.server import RunningProxy, proxy_app_runner, start_proxy

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Target:
    """One proxy under test: its name and where clients connect."""

    name: str
    port: int
    proxy: RunningProxy | None = None
    """The running tokenstamp (``tokenstamp`` only): its registry, state and front."""

    @property
    def url(self) -> str:
        """Base URL clients use."""
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Targets:
    """Started targets, by name; ``close`` stops them all."""

    by_name: dict[str, Target] = field(default_factory=dict)
    _runners: list[web.AppRunner] = field(default_factory=list)
    _proxies: list[RunningProxy] = field(default_factory=list)
    _children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _dirs: list[tempfile.TemporaryDirectory[str]] = field(default_factory=list)

    def __getitem__(self, name: str) -> Target:
        return self.by_name[name]

    def __iter__(self):
        return iter(self.by_name.values())

    async def close(self) -> None:
        """Stop every target."""
        for p in self._proxies:
            await p.close(drain_timeout_s=0.5)
        for r in self._runners:
            await r.cleanup()
        for c in self._children:
            c.terminate()
            try:
                c.wait(5)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        for d in self._dirs:
            d.cleanup()


def proxy_config(upstream: str, **overrides: object) -> ProxyConfig:
    """The configuration every tokenstamp and aiohttp target of the suite runs with."""
    values: dict[str, object] = {
        "upstream": upstream,
        "listen": HostPort("127.0.0.1", 0),
        "admin": HostPort("127.0.0.1", 0),
        "backend_name": "conformance",
        "provider": "vllm",
        "header_timeout_s": 5.0,
        "body_timeout_s": 5.0,
        "read_timeout_s": 5.0,
    }
    values.update(overrides)
    return ProxyConfig(**values)  # type: ignore[arg-type]


async def _serve_app(
    app: web.Application, targets: Targets, runner: web.AppRunner | None = None
) -> int:
    runner = runner or web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    targets._runners.append(runner)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner.addresses[0][1]


def _wait_listening(port: int, child: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        if child.poll() is not None:
            raise RuntimeError(f"nginx exited with status {child.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def nginx_available() -> bool:
    """nginx is installed (Debian: ``nginx-light``; ``make test`` installs it)."""
    return find_program("nginx") is not None


async def start_targets(
    upstream: str,
    names: tuple[str, ...] = ("tokenstamp", "aiohttp", "passthrough", "nginx"),
    **overrides: object,
) -> Targets:
    """Start the named targets in front of ``upstream`` (nginx only where installed).

    ``overrides`` are ``ProxyConfig`` fields for the tokenstamp and aiohttp targets.
    """
    targets = Targets()
    try:
        for name in names:
            if name == "tokenstamp":
                p = await start_proxy(
                    proxy_config(upstream, **overrides), registry=CollectorRegistry()
                )
                targets._proxies.append(p)
                targets.by_name[name] = Target(name, int(p.url.rsplit(":", 1)[1]), proxy=p)
            elif name == "aiohttp":
                cfg = proxy_config(upstream, **overrides)
                app = create_app(cfg, sink=PrometheusSink(CollectorRegistry()))
                # aiohttp's server exactly as tokenstamp runs it, only without the front.
                port = await _serve_app(app, targets, proxy_app_runner(app, cfg))
                targets.by_name[name] = Target(name, port)
            elif name == "passthrough":
                app = passthrough_app(upstream)
                runner = web.AppRunner(
                    app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True
                )
                port = await _serve_app(app, targets, runner)
                targets.by_name[name] = Target(name, port)
            elif name == "nginx":
                if not nginx_available():
                    continue
                (port,) = free_ports(1)
                workdir = tempfile.TemporaryDirectory(prefix="tokenstamp-nginx-")
                targets._dirs.append(workdir)
                child = subprocess.Popen(
                    [sys.executable, "-m", "bench.nginx", "--upstream", upstream,
                     "--listen", f"127.0.0.1:{port}", "--dir", workdir.name],
                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                targets._children.append(child)
                await asyncio.to_thread(_wait_listening, port, child)
                targets.by_name[name] = Target(name, port)
            else:
                raise ValueError(f"unknown target {name!r}")
    except BaseException:
        await targets.close()
        raise
    return targets


@contextlib.asynccontextmanager
async def running_targets(
    upstream: str, *names: str, **overrides: object
) -> AsyncIterator[Targets]:
    """``start_targets`` as an ``async with`` block."""
    targets = await start_targets(
        upstream, names or ("tokenstamp", "aiohttp", "passthrough", "nginx"), **overrides
    )
    try:
        yield targets
    finally:
        await targets.close()
