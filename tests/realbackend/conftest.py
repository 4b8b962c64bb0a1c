"""Fixtures for tests against real inference servers: models, servers, proxies.

The model is generated once and cached on disk (``modelgen``); a server runs
in a child process started here and stopped by its pid. llama.cpp tests are
part of the default run (marker ``realbackend``); vLLM tests need the separate
virtualenv of ``make install-vllm`` (marker ``vllm``).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from proxy.config import HostPort, ProxyConfig
from tests.promserver import free_port
from tests.realbackend.llamacpp_server import LlamaCppServer, LlamaCppSettings
from tests.realbackend.modelgen import write_gguf
from tests.realbackend.recorder import RecordedProxy, start_recorded_proxy
from tests.realbackend.vllm_server import VllmServer, vllm_python, write_hf_model


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "realbackend: runs a real inference server (llama.cpp, vLLM) on CPU"
    )
    config.addinivalue_line("markers", "vllm: needs vLLM in .venv-vllm (make install-vllm)")


def _need(module: str, package: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{package} is missing: run `make install-test` (pip install {package})")


@pytest.fixture(scope="session")
def gguf_model() -> Path:
    """The random test model as GGUF (generated once, cached)."""
    _need("gguf", "gguf")
    _need("tokenizers", "tokenizers")
    return write_gguf()


@pytest.fixture(scope="session")
def tokenizer_json(gguf_model: Path) -> Path:
    """The model's tokenizer (for prompt sizes)."""
    return gguf_model.parent / "tokenizer.json"


@pytest.fixture
def llamacpp_factory(gguf_model: Path) -> Iterator[Callable[..., LlamaCppServer]]:
    """Start llama.cpp servers with given settings; all are stopped after the test."""
    _need("xllamacpp", "xllamacpp")
    started: list[LlamaCppServer] = []

    def make(**settings: int | str) -> LlamaCppServer:
        srv = LlamaCppServer(gguf_model, free_port(), LlamaCppSettings(**settings))
        started.append(srv)
        return srv.start()

    yield make
    for srv in started:
        srv.__exit__(None, None, None)


@pytest.fixture(scope="session")
def llamacpp(gguf_model: Path) -> Iterator[LlamaCppServer]:
    """One llama.cpp server for the session: n_batch 2048 (a 2,000-token prompt in one step)."""
    _need("xllamacpp", "xllamacpp")
    with LlamaCppServer(gguf_model, free_port(), LlamaCppSettings(n_batch=2048)) as srv:
        yield srv


@pytest.fixture(scope="session")
def vllm_model() -> tuple[Path, Path]:
    """vLLM's python (``.venv-vllm``) and the random model as a Hugging Face folder.

    Skipped when that virtualenv is missing, unless ``TOKENSTAMP_REQUIRE_VLLM=1``
    (``make test-vllm`` sets it), which turns the skip into a failure.
    """
    python = vllm_python()
    if not python.exists():
        msg = f"vLLM is not installed at {python}: run `make install-vllm`"
        if os.environ.get("TOKENSTAMP_REQUIRE_VLLM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    t0 = time.monotonic()
    model = write_hf_model(python)
    print(f"\nvLLM: model ready in {time.monotonic() - t0:.1f} s")
    return python, model


@pytest.fixture(scope="session")
def vllm(vllm_model: tuple[Path, Path]) -> Iterator[VllmServer]:
    """vLLM serving the random model (``tiny``) for the session, with the CPU build's default
    ``--max-num-batched-tokens`` (2048) given explicitly."""
    python, model = vllm_model
    with VllmServer(python, model, free_port()) as srv:
        print(f"\nvLLM: server healthy in {srv.started_s:.1f} s")
        yield srv


@pytest.fixture
def vllm_factory(vllm_model: tuple[Path, Path]) -> Iterator[Callable[..., VllmServer]]:
    """Start vLLM servers with another ``--max-num-batched-tokens``; stopped after the test."""
    python, model = vllm_model
    started: list[VllmServer] = []

    def make(max_num_batched_tokens: int) -> VllmServer:
        srv = VllmServer(python, model, free_port(), max_num_batched_tokens)
        started.append(srv)
        return srv.start()

    yield make
    for srv in started:
        srv.__exit__(None, None, None)


@pytest.fixture
async def recorded_proxy() -> AsyncIterator[Callable[..., object]]:
    """Start in-process proxies with recorders; closed at the end of the test."""
    started: list[RecordedProxy] = []

    async def make(upstream_url: str, **overrides: object) -> RecordedProxy:
        cfg = ProxyConfig(
            upstream=upstream_url,
            listen=HostPort("127.0.0.1", 0),
            admin=HostPort("127.0.0.1", 0),
            backend_name="real-backend",
            **overrides,  # type: ignore[arg-type]
        )
        p = await start_recorded_proxy(cfg)
        started.append(p)
        return p

    yield make
    for p in started:
        await p.running.close(drain_timeout_s=1.0)
