"""Child processes of a benchmark run: started on free loopback ports, always stopped.

``Children`` is a context manager: every process it started is stopped when the
block ends, normally or by an exception (SIGTERM, then SIGKILL after a grace
period). Each child's output goes to a log file, so a full pipe can never
block it, and its tail is shown when it fails to start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

_TERM_GRACE_S = 3.0
_LOG_TAIL_BYTES = 2000


class ChildError(RuntimeError):
    """A child process failed to start or died."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(slots=True)
class Child:
    """One started process."""

    name: str
    """What it is (for messages)."""
    popen: subprocess.Popen[bytes]
    """The process."""
    log_path: Path
    """Where its stdout and stderr go."""

    @property
    def pid(self) -> int:
        """Its process id (the one whose CPU is measured)."""
        return self.popen.pid

    def log_tail(self) -> str:
        """The last part of its output."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-_LOG_TAIL_BYTES:].decode(errors="replace").strip()

    def check_alive(self) -> None:
        """Raise ``ChildError`` (with its output) if it has exited."""
        rc = self.popen.poll()
        if rc is not None:
            raise ChildError(f"{self.name} exited with status {rc}:\n{self.log_tail()}")

    def wait_listening(self, port: int, timeout_s: float = 20.0) -> None:
        """Block until it accepts TCP connections on 127.0.0.1:``port``."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ChildError(
                    f"{self.name} did not listen on port {port} within {timeout_s:g} s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)


class Children:
    """Starts processes and stops all of them when the ``with`` block ends."""

    def __init__(self) -> None:
        self._children: list[Child] = []
        self._logdir = tempfile.TemporaryDirectory(prefix="tokenstamp-bench-")

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def workdir(self, name: str) -> Path:
        """An empty folder for one child's own files (configs, pid files), removed at the end."""
        safe = "".join(c if c.isalnum() else "_" for c in name)
        path = Path(self._logdir.name) / f"work-{safe}"
        path.mkdir(exist_ok=True)
        return path

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        """Start ``argv`` with ``env`` added to this process's environment."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        safe = "".join(c if c.isalnum() else "_" for c in name)
        log_path = Path(self._logdir.name) / f"{len(self._children):02d}-{safe}.log"
        with open(log_path, "wb") as log:
            try:
                popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=full_env,
                    start_new_session=True,  # our Ctrl-C does not hit it; we stop it ourselves
                )
            except OSError as exc:
                raise ChildError(f"{name}: cannot start {argv[0]!r}: {exc}") from None
        child = Child(name, popen, log_path)
        self._children.append(child)
        return child

    def stop_all(self) -> None:
        """SIGTERM every child still running, SIGKILL what remains after the grace period."""
        running = [c for c in self._children if c.popen.poll() is None]
        for c in running:
            _signal(c.popen, signal.SIGTERM)
        deadline = time.monotonic() + _TERM_GRACE_S
        for c in running:
            try:
                c.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(c.popen, signal.SIGKILL)
                c.popen.wait()
        self._children.clear()
        self._logdir.cleanup()


def _signal(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        # The child leads its own session: signal its group, which holds
        # anything it started too, and only that.
        os.killpg(popen.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        popen.send_signal(sig)
