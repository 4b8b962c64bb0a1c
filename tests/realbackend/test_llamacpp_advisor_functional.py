"""The chunk-size advisor on llama.cpp's real server: fitted at one n_batch, checked at the other.

Fitted while llama.cpp runs with ``n_batch`` 2048 (whole prompts in one step),
the advisor's row for 512 must match a measured 512 run within 25%: its worst
gap, and the number of stalls the long prompt causes in each stream; and the
other way round (fitted at 512, the unchunked row against a 2048 run).

Where the 25% come from: llama.cpp's ``n_batch`` holds the streams' decode tokens
too, so a 512 step carries 504 prompt tokens with 8 streams decoding (the
advisor's chunk is the prompt piece: the row asked for is 504); on CPU a whole
prompt costs more per token than its pieces, which the advisor's context term
``x (L + x)`` takes up where the steps tell it from 0 but also charges to the pieces
after context (docs/advisor.md#validation); and, the most, the shared
2-core machine's speed moving between the fit and the measured run (both print
their one-stream decode step: it moved by up to 70% between the two here). The
fit prompts come in four sizes: unsplit, four points tell a context term from the
rate with a residual left to judge it by; at 512 their pieces (504 and last pieces
of 204, 308, 108 and 408 tokens, at contexts 0 to 1,008) tell a fixed cost per
prefill step and a context term from the rate.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.realbackend.advisorload import decode_step_s, fit_workload, read_stream, window_cells
from tests.realbackend.client import Prompts, chat
from tests.realbackend.llamacpp_server import LlamaCppServer, LlamaCppSettings
from tests.realbackend.recorder import ProxyFactory, RecordedProxy

pytestmark = [pytest.mark.realbackend, pytest.mark.timeout(240)]

STREAMS = 8
LONG = 1200
"""The measured long prompt (at 512: three pieces of 504)."""
FIT_PROMPTS = [1200, 800, 600, 900]
"""The long prompts the advisor fits from, one at a time (four sizes: unsplit, they tell a
context term from the rate with a residual to judge it by)."""
PREFILL_S_PER_TOKEN = 1 / 250
"""About what this CPU takes per prompt token (sizes the streams, not a tolerance)."""
TOLERANCE = 0.25
KV_TOKENS = LlamaCppSettings().n_ctx
"""The KV cache every slot shares (``kv_unified``): the streams and the prompts must fit."""
TEMPLATE_TOKENS = 32
"""What the chat template adds to a prompt, at most (a bound, for the KV budget)."""


def _most_tokens(long_prompts: list[int]) -> int:
    """The first fit stream's output at most: what the KV cache holds beside the long prompts
    (a slot may keep a finished one for reuse; llama.cpp ends every stream at once when it is
    full). Eight streams step several times slower than one, so they still outlast the rest."""
    room = (KV_TOKENS - sum(p + TEMPLATE_TOKENS + 2 for p in long_prompts)) // STREAMS
    return room - 24 - TEMPLATE_TOKENS - 8 * (STREAMS - 1)


async def _measured_run(proxy: RecordedProxy, prompts: Prompts) -> tuple[float, int, int]:
    """8 streams, one long prompt: (median over streams of the worst gap in its window, median
    stalls per stream, its prompt tokens)."""
    step_s = await decode_step_s(proxy, prompts, "probe")
    # Beside the fit run's: how much the machine's speed moved between the two.
    print(f"\nmeasured run: one-stream step {step_s * 1e3:.1f} ms")
    connector = aiohttp.TCPConnector(limit=0)
    text = prompts.text(LONG)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with asyncio.TaskGroup() as group:
            for i in range(STREAMS):
                body = chat(prompts.text(24), int(LONG * PREFILL_S_PER_TOKEN / step_s) + 40)
                group.create_task(read_stream(session, proxy.url, body, f"m-{i}"))
            await asyncio.sleep(20 * step_s + 1.0)
            await read_stream(session, proxy.url, chat(text, 2), "m-long")
    proxy.settle()
    cells = window_cells(proxy, "m-long", [f"m-{i}" for i in range(STREAMS)])
    record = proxy.sink.requests["m-long"]
    assert prompts.count(text) <= record.prompt_tokens < prompts.count(text) + 32  # + template
    assert record.prompt_tokens is not None, "llama.cpp sent no usage"
    return cells.worst_gap_s, cells.stalls, record.prompt_tokens


async def _advice(admin_url: str, prompt_tokens: int, chunk: str) -> dict[str, Any]:
    query = {"prompt_tokens": str(prompt_tokens), "streams": str(STREAMS), "chunk_sizes": chunk}
    async with aiohttp.ClientSession() as session:
        async with session.get(admin_url + "/advice", params=query) as resp:
            data: dict[str, Any] = await resp.json()
    (backend,) = data["backends"]
    return backend


async def _fit_then_measure(
    fit_batch: int,
    other_batch: int,
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> tuple[dict[str, Any], float, int, int]:
    """Fit at ``fit_batch``, measure at ``other_batch``: (advice, worst gap, stalls, predicted)."""
    prompts = Prompts(tokenizer_json, f"advisor-{fit_batch}")
    fit_server = llamacpp_factory(n_batch=fit_batch)
    proxy = await recorded_proxy(fit_server.url, provider="llama.cpp")
    await fit_workload(
        proxy,
        prompts,
        FIT_PROMPTS,
        streams=STREAMS,
        prefill_s_per_token=PREFILL_S_PER_TOKEN,
        most_tokens=_most_tokens(FIT_PROMPTS),
    )
    other = llamacpp_factory(n_batch=other_batch)
    measured_proxy = await recorded_proxy(other.url, provider="llama.cpp", advisor=False)
    worst_s, stalls, tokens = await _measured_run(measured_proxy, prompts)
    # The row of the prompt piece the other n_batch leaves beside the decoding streams.
    candidate = "none" if other_batch >= tokens else str(other_batch - STREAMS)
    backend = await _advice(proxy.admin_url, tokens, candidate)
    print(f"\nllama.cpp fitted at n_batch {fit_batch}: {backend['fit']}")
    assert backend["status"] == "ok", backend["missing"]
    (row,) = backend["table"]
    predicted_stalls = 1 if candidate == "none" else math.ceil(tokens / (other_batch - STREAMS))
    print(_table(fit_batch, other_batch, backend["fit"], row, worst_s, predicted_stalls, stalls))
    return backend, worst_s, stalls, predicted_stalls


def _table(
    fit_batch: int,
    other_batch: int,
    fit: dict[str, Any],
    row: dict[str, Any],
    worst_s: float,
    predicted_stalls: int,
    stalls: int,
) -> str:
    """The validation table: profile (the server's settings), fitted, predicted, measured."""
    d = fit["decode_step_s"]
    err = row["worst_gap_s"] / worst_s - 1
    return "\n".join([
        f"profile: llama.cpp n_batch {fit_batch} (prompt piece {fit_batch - STREAMS} with "
        f"{STREAMS} streams decoding) -> measured at n_batch {other_batch}",
        f"fitted: decode {d['base'] * 1e3:.1f} ms + {d['per_stream'] * 1e3:.2f} ms x streams, "
        f"prefill {fit['prefill_tokens_per_s']:.0f} tokens/s, "
        f"{fit['prefill_step_s'] * 1e3:.0f} ms a prefill step, chunk {fit['chunk_size']}"
        + (f" ({fit['observations']['prefill_step_note']})" if fit["prefill_step_s"] == 0 else ""),
        f"context term {fit['prefill_context_s'] * 1e9:.2f} us a token per 1,000 of context: "
        f"{fit['observations']['prefill_context_note']}",
        f"range seen {fit['range']}; row extrapolation {row['extrapolation']}",
        f"{row['prompt_tokens']}-token prompt, {STREAMS} streams, chunk {row['chunk_size']}: "
        f"worst gap predicted {row['worst_gap_s'] * 1e3:.0f} ms / measured "
        f"{worst_s * 1e3:.0f} ms ({err:+.0%}); stalls per stream predicted "
        f"{predicted_stalls} / measured {stalls}",
    ])  # fmt: skip


async def test_fitted_unchunked_predicts_a_512_run(
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> None:
    backend, worst_s, stalls, predicted_stalls = await _fit_then_measure(
        2048, 512, llamacpp_factory, recorded_proxy, tokenizer_json
    )
    assert backend["fit"]["chunked"] is False
    (row,) = backend["table"]
    assert abs(row["worst_gap_s"] - worst_s) <= TOLERANCE * worst_s
    assert predicted_stalls == stalls


async def test_fitted_at_512_finds_the_chunk_and_predicts_one_stall_at_2048(
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> None:
    """The other way round: the chunk (512 minus the 8 decode tokens), the unchunked worst gap
    within 25% (the fixed cost per prefill step, where the pieces show one, is not spread
    over the tokens of the small pieces the fit saw) and the single stall."""
    backend, worst_s, stalls, predicted_stalls = await _fit_then_measure(
        512, 2048, llamacpp_factory, recorded_proxy, tokenizer_json
    )
    assert backend["fit"]["chunked"] is True
    assert abs(backend["fit"]["chunk_size"] - (512 - STREAMS)) <= 0.1 * 512
    (row,) = backend["table"]
    assert abs(row["worst_gap_s"] - worst_s) <= TOLERANCE * worst_s
    assert predicted_stalls == stalls == 1
