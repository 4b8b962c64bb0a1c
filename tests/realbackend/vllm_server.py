"""vLLM's OpenAI server (CPU build) in a child process we own, from its own virtualenv.

vLLM pins its own torch and friends, so it lives in a separate virtualenv
(``.venv-vllm`` at the repository root, or ``$TOKENSTAMP_VLLM_PYTHON``), made by
``make install-vllm``. The model is the same random Llama as llama.cpp's, in
Hugging Face form, written by that venv's python (it has ``safetensors``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Self

from tests.realbackend.procserver import REPO, ServerProcess

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


class VllmServer(ServerProcess):
    """``with VllmServer(python, model, port) as srv: srv.url`` — a vLLM server process."""

    name = "vLLM"
    poll_s = 0.25
    stop_grace_s = 20.0
    # Its own process group: the API server spawns the engine core; a stuck
    # shutdown is ended by signalling the group we created, by its id.
    own_group = True
    tail_chars = 4000

    def __init__(self, python: Path, model: Path, port: int) -> None:
        super().__init__(port, "vllm-")
        self.python = python
        self.model = model

    def start(self, timeout_s: float = 240.0) -> Self:
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
        return self._spawn(cmd, timeout_s, env=env)
