"""vLLM's OpenAI server (CPU build) in a child process we own, from its own virtualenv.

vLLM pins its own torch and friends, so it lives in a separate virtualenv
(``.venv-vllm`` at the repository root, or ``$TOKENSTAMP_VLLM_PYTHON``), made by
``make install-vllm``. The model is the same random Llama as llama.cpp's, in
Hugging Face form, written by that venv's python (it has ``safetensors``).
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
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[2]
SERVED_NAME = "tiny"


def vllm_python() -> Path:
    """The python of vLLM's virtualenv (may not exist)."""
    env = os.environ.get("TOKENSTAMP_VLLM_PYTHON")
    return Path(env) if env else REPO / ".venv-vllm" / "bin" / "python"


def write_hf_model(python: Path) -> Path:
    """Generate (or find cached) the Hugging Face model folder with vLLM's python."""
    out = subprocess.run(
        [str(python), "-m", "tests.realbackend.modelgen", "hf"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"model generation failed: {out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


class VllmServer:
    """``with VllmServer(python, model, port) as srv: srv.url`` — a vLLM server process."""

    def __init__(self, python: Path, model: Path, port: int) -> None:
        self.python = python
        self.model = model
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="vllm-", suffix=".log", delete=False)  # noqa: SIM115
        self.started_s = 0.0
        """Seconds from spawning the process to a healthy server."""

    def start(self, timeout_s: float = 240.0) -> VllmServer:
        """Spawn the server and wait until ``/health`` answers 200."""
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("TOKENSTAMP_VLLM_CPUS", "1"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        cmd = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
            "--max-num-seqs", "16", "--disable-uvicorn-access-log",
        ]  # fmt: skip
        t0 = time.monotonic()
        # Its own process group: the API server spawns the engine core; a stuck
        # shutdown is ended by signalling the group we created, by its id.
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.started_s = time.monotonic() - t0
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"vLLM not healthy after {timeout_s} s: {self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the server, then its process group if it lingers; idempotent."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # engine-core children left behind
        self._log.close()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log."""
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-chars:]

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        Path(self._log.name).unlink(missing_ok=True)
