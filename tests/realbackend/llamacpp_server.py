"""llama.cpp's own HTTP server (the ``xllamacpp`` wheel) in a child process we own.

``LlamaCppServer`` starts ``python llamacpp_server.py ...`` (this file) on a free
loopback port, waits for ``/health``, and stops it by its process id. Run as a
script, this file configures ``xllamacpp.CommonParams`` and serves until SIGTERM.

Settings that matter for the tests: ``n_parallel`` slots must exceed the number
of concurrent streams (else a new request queues for a slot instead of stalling
the others); ``n_batch`` is the prefill chunk (a prompt longer than it is
computed in pieces, each mixed with one decode step of the running streams);
one CPU thread keeps a step's timing steady on a shared two-core machine and
leaves the other core to the proxy and the client.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


@dataclass(frozen=True, slots=True)
class LlamaCppSettings:
    """How the server is configured."""

    n_batch: int = 2048
    """Logical batch: prompt tokens computed per step (the prefill chunk)."""
    n_parallel: int = 12
    """Slots: concurrent requests served without queueing."""
    n_ctx: int = 8192
    """KV cache size shared by all slots (``kv_unified``)."""
    threads: int = 1
    """CPU threads for decode and prefill."""


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="serve a GGUF model with xllamacpp until SIGTERM")
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--n-batch", type=int, default=2048)
    p.add_argument("--n-parallel", type=int, default=12)
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--nice", type=int, default=10)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then exit at once (no C++ teardown to wait for)."""
    args = _args(argv)
    # The proxy and the client measure: they get the CPU first when they need it.
    os.nice(args.nice)
    # Block the stop signals before the server's threads exist, so they inherit
    # the mask and the main thread receives them in sigwait.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    import xllamacpp  # type: ignore[import-untyped]

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_parallel = args.n_parallel
    params.cont_batching = True
    params.kv_unified = True
    params.n_ctx = args.n_ctx
    params.n_batch = args.n_batch
    params.n_ubatch = args.n_batch
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.sampling.temp = 0.0
    server = xllamacpp.Server(params)
    print(f"serving on {server.listening_address}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    sys.stdout.flush()
    os._exit(0)


class LlamaCppServer:
    """``with LlamaCppServer(model, port) as srv: srv.url`` — a llama.cpp server process."""

    def __init__(self, model: Path, port: int, settings: LlamaCppSettings | None = None) -> None:
        self.model = model
        self.port = port
        self.settings = settings or LlamaCppSettings()
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="llamacpp-", suffix=".log", delete=False)  # noqa: SIM115
        self.started_s = 0.0
        """Seconds from spawning the process to a healthy server."""

    def start(self, timeout_s: float = 60.0) -> LlamaCppServer:
        """Spawn the process and wait until ``/health`` answers 200."""
        s = self.settings
        cmd = [
            sys.executable, __file__, "--model", str(self.model), "--port", str(self.port),
            "--n-batch", str(s.n_batch), "--n-parallel", str(s.n_parallel),
            "--n-ctx", str(s.n_ctx), "--threads", str(s.threads),
        ]  # fmt: skip
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.started_s = time.monotonic() - t0
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"llama.cpp server not healthy after {timeout_s} s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, its sockets reset by the kernel."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM by pid, SIGKILL after 10 s; idempotent."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        self._log.close()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-chars:]

    def __enter__(self) -> LlamaCppServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        Path(self._log.name).unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
