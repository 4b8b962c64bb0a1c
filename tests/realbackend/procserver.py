"""An HTTP server in a child process we own: spawn, wait for ``/health``, stop by pid.

``ServerProcess`` is the part llama.cpp's and vLLM's servers share: the log
file, the health poll, SIGTERM then SIGKILL by process id, and the context
manager. A subclass names itself, builds its command line and calls
``_spawn``; the class attributes say how it is polled and stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

REPO = Path(__file__).resolve().parents[2]
"""The repository root (a child started with ``-m tests...`` runs from here)."""


class ServerProcess:
    """A loopback server process; ``with Sub(...) as srv: srv.url`` starts and stops it."""

    name = "server"
    """How errors name the server."""
    poll_s = 0.05
    """Pause between two ``/health`` polls while starting."""
    stop_grace_s = 10.0
    """How long ``stop`` waits after SIGTERM before SIGKILL."""
    own_group = False
    """Start the child in its own process group and SIGKILL the group when stopping
    (for a server that spawns children of its own)."""
    tail_chars = 3000
    """How much of the log an error message quotes."""

    def __init__(self, port: int, log_prefix: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)  # noqa: SIM115
        self.started_s = 0.0
        """Seconds from spawning the process to a healthy server."""

    def _spawn(
        self,
        cmd: list[str],
        timeout_s: float,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Self:
        """Run ``cmd`` (output to the log) and wait until ``/health`` answers 200."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=self.own_group,
        )
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.started_s = time.monotonic() - t0
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(self.poll_s)
        tail = self.log_tail()  # before stop() closes the log
        self.stop()
        raise RuntimeError(f"{self.name} not healthy after {timeout_s} s: {tail}")

    def _sigkill(self, pid: int) -> None:
        if self.own_group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, its sockets reset by the kernel."""
        if self.proc is not None and self.proc.poll() is None:
            self._sigkill(self.proc.pid)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM by pid, SIGKILL after ``stop_grace_s``; idempotent."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                self._sigkill(proc.pid)
                proc.wait()
        if proc is not None and self.own_group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # children left behind
        self._log.close()

    def log_tail(self, chars: int | None = None) -> str:
        """The end of the server's log (``tail_chars`` unless told)."""
        self._log.flush()
        text = Path(self._log.name).read_text(errors="replace")
        return text[-(chars or self.tail_chars) :]

    def start(self, timeout_s: float = 60.0) -> Self:
        """Spawn the server and wait until it is healthy (a subclass builds the command)."""
        raise NotImplementedError(f"{type(self).__name__} must define start()")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        Path(self._log.name).unlink(missing_ok=True)
