"""A real Prometheus server for tests: scrapes given targets every second."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need_prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail(
            "the prometheus binary is missing: run `make install-test` (Debian `prometheus`)"
        )
    return path


class PrometheusServer:
    """``async with PrometheusServer({"tokenstamp": ["127.0.0.1:9464"]}) as prom``."""

    def __init__(
        self,
        jobs: dict[str, list[str]],
        *,
        interval: str = "1s",
        rule_files: list[Path] | None = None,
        extra_args: list[str] | None = None,
        features: list[str] | None = None,
    ) -> None:
        """``features``: ``--enable-feature`` values (``native-histograms``: scrape protobuf
        first and keep native histograms)."""
        self.jobs = jobs
        self.interval = interval
        self.rule_files = rule_files or []
        self.extra_args = list(extra_args or [])
        if features:
            self.extra_args.append("--enable-feature=" + ",".join(features))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="tokenstamp-prom-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def _config(self) -> str:
        lines = [
            "global:",
            f"  scrape_interval: {self.interval}",
            f"  evaluation_interval: {self.interval}",
        ]
        if self.rule_files:
            lines.append("rule_files:")
            lines += [f"  - {p}" for p in self.rule_files]
        lines.append("scrape_configs:")
        for job, targets in self.jobs.items():
            lines += [
                f"  - job_name: {job}",
                f"    scrape_interval: {self.interval}",
                "    static_configs:",
                f"      - targets: [{', '.join(repr(t) for t in targets)}]",
            ]
        return "\n".join(lines) + "\n"

    async def __aenter__(self) -> PrometheusServer:
        binary = need_prometheus()
        d = Path(self._dir.name)
        (d / "prometheus.yml").write_text(self._config())
        self._log = open(d / "log.txt", "wb")  # noqa: SIM115 - closed in __aexit__
        self._proc = subprocess.Popen(
            [binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *self.extra_args],
            stdout=subprocess.DEVNULL, stderr=self._log,
        )  # fmt: skip
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                try:
                    async with s.get(self.url + "/-/ready") as r:
                        if r.status == 200:
                            return self
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError("prometheus did not start: " + (d / "log.txt").read_text()[-2000:])

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
        self._dir.cleanup()

    async def api(self, path: str, **params: str) -> Any:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + "/api/v1/" + path, params=params) as r:
                body = await r.json()
        if body.get("status") != "success":
            raise AssertionError(f"prometheus {path} {params}: {body}")
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the vector's samples."""
        data = await self.api("query", query=expr)
        return list(data["result"])

    async def wait_for(self, expr: str, predicate: Any, timeout_s: float = 20.0) -> list[Any]:
        """Poll ``expr`` until ``predicate(result)`` holds; fail with the last result."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        result: list[Any] = []
        while loop.time() < deadline:
            result = await self.query(expr)
            if predicate(result):
                return result
            await asyncio.sleep(0.25)
        raise AssertionError(f"{expr} never satisfied the condition; last result {result}")

    async def scraped(self, job: str) -> None:
        """Wait until every target of ``job`` has been scraped successfully at least once."""
        await self.wait_for(
            f'up{{job="{job}"}}', lambda r: r and all(x["value"][1] == "1" for x in r)
        )
