"""The chunk-size advisor on llama.cpp's real server: fitted at one n_batch, checked at the other.

Fitted while llama.cpp runs with ``n_batch`` 2048 (whole prompts in one step), the advisor's
row for 512 is set against a measured 512 run; and the other way round (fitted at 512, the
unchunked row against a 2048 run). Every cell must hold ``TOLERANCE`` both ways: an
existing stream's worst gap while the long prompt is prefilled, its token rate over the
steps that carried the prompt, the new request's first token; and the stalls per stream
exactly (``tests.realbackend.advisorload``: the runs and the table, shared with vLLM's).

llama.cpp's ``n_batch`` holds the streams' decode tokens too, so a 512 step carries 504
prompt tokens with 8 streams decoding (the advisor's chunk is the prompt piece: the row
asked for is 504). On CPU a prompt piece costs more the more of its prompt is in context,
which the fit's context term ``x (L + x)`` takes up where the steps tell it from 0. What
moves the cells the most is the shared 2-core machine's speed between the fit and the
measured run (both print their one-stream decode step). The fit prompts come in four
sizes: unsplit, four points tell a context term from the rate with a residual left to
judge it by; at 512 their pieces (504 and last pieces of 204, 308, 108 and 408 tokens, at
contexts 0 to 1,008) tell a fixed cost per prefill step and a context term from the rate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.realbackend.advisorload import (
    Direction,
    advice,
    keep_for_replay,
    measured_run,
    timeline,
    undisturbed_fit,
    undisturbed_measured,
)
from tests.realbackend.client import Prompts
from tests.realbackend.llamacpp_server import LlamaCppServer, LlamaCppSettings
from tests.realbackend.recorder import ProxyFactory

pytestmark = [pytest.mark.realbackend, pytest.mark.timeout(240)]

STREAMS = 8
LONG = 1200
"""The measured long prompt (at 512: three pieces of 504)."""
FIT_PROMPTS = [1200, 800, 600, 900]
"""The long prompts the advisor fits from, one at a time (four sizes: unsplit, they tell a
context term from the rate with a residual to judge it by)."""
PREFILL_S_PER_TOKEN = 1 / 250
"""About what this CPU takes per prompt token (sizes the streams, not a tolerance)."""
TOLERANCE = 0.20
"""Each predicted time or rate against the measured one, both ways (docs/advisor.md#validation:
every cell within 19.9% in the 16 directions of 2026-12-07; the suite's ``--reruns 2``
retries a run that the machine's speed moved past it)."""
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


def _stream_tokens(step_s: float) -> int:
    """Each measured stream's output: it outlasts the prefill (and fits the KV cache)."""
    return int(LONG * PREFILL_S_PER_TOKEN / step_s) + 40


async def _fit_then_measure(
    fit_batch: int,
    other_batch: int,
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> Direction:
    """Fit at ``fit_batch``, measure at ``other_batch``: the fit's row against the run."""
    prompts = Prompts(tokenizer_json, f"advisor-{fit_batch}")
    fit_server = llamacpp_factory(n_batch=fit_batch)
    proxy, fit_run = await undisturbed_fit(
        f"fit at {fit_batch}",
        functools.partial(recorded_proxy, fit_server.url, provider="llama.cpp"),
        prompts,
        FIT_PROMPTS,
        streams=STREAMS,
        prefill_s_per_token=PREFILL_S_PER_TOKEN,
        most_tokens=_most_tokens(FIT_PROMPTS),
    )
    other = llamacpp_factory(n_batch=other_batch)
    m = await undisturbed_measured(
        f"measured at {other_batch}",
        functools.partial(recorded_proxy, other.url, provider="llama.cpp", advisor=False),
        functools.partial(
            measured_run,
            prompts=prompts,
            budget=other_batch,
            streams=STREAMS,
            long_prompt=LONG,
            stream_tokens=_stream_tokens,
        ),
    )
    # The row of the prompt piece the other n_batch leaves beside the decoding streams.
    candidate = "none" if other_batch >= m.prompt_tokens else str(other_batch - STREAMS)
    backend = await advice(proxy.admin_url, m.prompt_tokens, STREAMS, candidate)
    assert backend["status"] == "ok", f"{backend['missing']}\n{timeline(proxy)}"
    d = Direction("n_batch", fit_batch, STREAMS, backend, m, fit_run)
    keep_for_replay(proxy, d)
    print("\n" + d.table())
    return d


async def test_fitted_unchunked_predicts_a_512_run(
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> None:
    """Fitted on whole prompts, the row of the 504-token piece: every cell within
    ``TOLERANCE``, three stalls per stream."""
    d = await _fit_then_measure(2048, 512, llamacpp_factory, recorded_proxy, tokenizer_json)
    assert d.fit["chunked"] is False
    assert d.steps == 3
    failures = d.failures(TOLERANCE)
    assert not failures, d.table() + "\n" + "\n".join(failures)


async def test_fitted_at_512_finds_the_chunk_and_predicts_one_stall_at_2048(
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> None:
    """The other way round: the chunk (512 minus the 8 decode tokens), every cell of the
    unchunked row within ``TOLERANCE`` and the single stall."""
    d = await _fit_then_measure(512, 2048, llamacpp_factory, recorded_proxy, tokenizer_json)
    assert d.fit["chunked"] is True
    assert abs(d.fit["chunk_size"] - (512 - STREAMS)) <= 0.1 * 512
    assert d.steps == 1
    failures = d.failures(TOLERANCE)
    assert not failures, d.table() + "\n" + "\n".join(failures)
