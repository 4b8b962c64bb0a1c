"""llama.cpp's own HTTP server (the ``xllamacpp`` wheel) in a child process we own.

``LlamaCppServer`` starts ``python -m tests.realbackend.llamacpp_server ...``
(this file) on a free loopback port, waits for ``/health``, and stops it by its
process id (``procserver``). Run as a module, this file configures
``xllamacpp.CommonParams`` and serves until SIGTERM.

Settings that matter for the tests: ``n_parallel`` slots must exceed the number
of concurrent streams (else a new request queues for a slot instead of stalling
the others); ``n_batch`` is the prefill chunk (a prompt longer than it is
computed in pieces, each mixed with one decode step of the running streams);
one CPU thread keeps a step's timing steady on a shared two-core machine and
leaves the other core to the proxy and the client. ``chat_template`` replaces
the model's own (llama.cpp's ``--chat-template``): a template whose assistant
turn opens ``<think>`` makes the server stream ``reasoning_content``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from tests.realbackend.procserver import REPO, ServerProcess


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
    chat_template: str = ""
    """A Jinja chat template to use instead of the model's (empty: the model's)."""


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="serve a GGUF model with xllamacpp until SIGTERM")
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--n-batch", type=int, default=2048)
    p.add_argument("--n-parallel", type=int, default=12)
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--chat-template", default="")
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
    if args.chat_template:
        params.chat_template = args.chat_template
    server = xllamacpp.Server(params)
    print(f"serving on {server.listening_address}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    sys.stdout.flush()
    os._exit(0)


class LlamaCppServer(ServerProcess):
    """``with LlamaCppServer(model, port) as srv: srv.url`` — a llama.cpp server process."""

    name = "llama.cpp server"

    def __init__(self, model: Path, port: int, settings: LlamaCppSettings | None = None) -> None:
        super().__init__(port, "llamacpp-")
        self.model = model
        self.settings = settings or LlamaCppSettings()

    def start(self, timeout_s: float = 60.0) -> Self:
        """Spawn the process and wait until ``/health`` answers 200."""
        s = self.settings
        # As a module from the repository root: it imports ``tests.realbackend``.
        cmd = [
            sys.executable, "-m", "tests.realbackend.llamacpp_server",
            "--model", str(self.model), "--port", str(self.port),
            "--n-batch", str(s.n_batch), "--n-parallel", str(s.n_parallel),
            "--n-ctx", str(s.n_ctx), "--threads", str(s.threads),
        ]  # fmt: skip
        if s.chat_template:
            cmd += ["--chat-template", s.chat_template]
        return self._spawn(cmd, timeout_s, cwd=REPO)


if __name__ == "__main__":
    raise SystemExit(main())
