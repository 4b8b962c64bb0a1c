"""The advisor against the simulator: fitted from live traffic, then checked run by run.

A cost profile is drawn at random (``ADVISOR_SEED`` reproduces one; none of its
parameters is the seed text's); the simulator serves it behind the proxy; the
fit workload (``advisorkit.fit_workload``) runs through the proxy; ``/advice``
then gives the fitted model and the table. Each predicted row is compared
with the simulator run at that chunk size: worst gap and token rate from its
ground truth, the new request's TTFT through the proxy.

Tolerances: 10% (the issue's). Where they come from: the fit reads the
proxy's stamps, which carry delivery jitter (about a millisecond on a busy
2-core machine, against steps of 15-30 ms); medians per stream count and
telescoping sums over a prefill keep the fitted parameters within a few
percent. A TTFT also depends on when the request lands in the running step
(0 to one step; the model counts half), which is up to ±(half a step) of a
TTFT of 0.3-1 s. A step the simulator's engine ran more than 5 ms late (its process
waited for a CPU) is the machine, not the modelled accelerator: it is left out of the
measured worst gap (and counted in the table).
"""

from __future__ import annotations

import os
import random

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.advisor.predict import DEFAULT_CHUNK_SIZES
from tests.proxy.advisor.advisorkit import (
    Measured,
    fit_workload,
    get_advice,
    measure,
    random_profile,
    start_proxy_for,
    start_sim,
)
from tests.proxy.advisor.test_advise_functional import advise

TOLERANCE = 0.10
STREAMS = 8


def _rel(got: float, want: float) -> float:
    return abs(got - want) / want


def _c(chunk: int | None) -> str:
    return "none" if chunk is None else str(chunk)


@pytest.mark.timeout(90)
async def test_fit_and_every_predicted_row_match_the_simulator(aiohttp_server):
    seed = int(os.environ.get("ADVISOR_SEED", random.SystemRandom().randrange(10**6)))
    rng = random.Random(seed)
    profile = random_profile(rng)
    cost = profile.cost
    assert cost.chunk_size is not None
    prompts = [rng.randrange(3000, 7000) for _ in range(4)]
    sim_url = await start_sim(aiohttp_server, profile)
    proxy, _ = await start_proxy_for(sim_url)
    try:
        await fit_workload(proxy.url, cost.decode_s(STREAMS), prompts)
        prompt = rng.randrange(3000, 7000)
        advice = await get_advice(proxy.admin_url, prompt_tokens=str(prompt), streams=str(STREAMS))
        async with aiohttp.ClientSession() as session:
            async with session.get(proxy.admin_url + "/metrics") as resp:
                metrics = await resp.text()
        rc, printed, _ = await advise(
            proxy.admin_url, "--prompt-tokens", str(prompt), "--streams", str(STREAMS)
        )
    finally:
        await proxy.close(drain_timeout_s=1.0)
    (backend,) = advice["backends"]
    assert backend["status"] == "ok", backend["missing"]
    assert rc == 0
    print("\n" + printed)
    fit = backend["fit"]
    gauges = {
        (s.name, s.labels["server_address"]): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name.startswith("tokenstamp_backend_")
    }
    assert gauges == {  # the /advice fit refreshed them; no traffic came since
        ("tokenstamp_backend_prefill_rate", "sim"): pytest.approx(fit["prefill_tokens_per_s"]),
        ("tokenstamp_backend_decode_step_base_seconds", "sim"): pytest.approx(
            fit["decode_step_s"]["base"]
        ),
        ("tokenstamp_backend_decode_step_per_stream_seconds", "sim"): pytest.approx(
            fit["decode_step_s"]["per_stream"]
        ),
        ("tokenstamp_backend_prefill_step_seconds", "sim"): pytest.approx(
            fit["prefill_step_s"], abs=1e-12
        ),
        ("tokenstamp_backend_prefill_chunk", "sim"): fit["chunk_size"],
    }
    want = {
        "base": cost.decode_base_s,
        "per_stream": cost.decode_per_seq_s,
        "rate": 1 / cost.prefill_s_per_token,
        "chunk": cost.chunk_size,
    }
    got = {
        "base": fit["decode_step_s"]["base"],
        "per_stream": fit["decode_step_s"]["per_stream"],
        "rate": fit["prefill_tokens_per_s"],
        "chunk": fit["chunk_size"],
    }
    measured: dict[int | None, Measured] = {}
    for chunk in DEFAULT_CHUNK_SIZES:
        measured[chunk] = await measure(aiohttp_server, profile, chunk, prompt, STREAMS)

    lines = [
        f"\nprofile {profile.name} (ADVISOR_SEED={seed}); fit prompts {prompts}",
        f"{'parameter':<22}{'profile':>12}{'fitted':>12}{'error':>8}",
        f"{'decode base':<22}{want['base'] * 1e3:>9.2f} ms{got['base'] * 1e3:>9.2f} ms"
        f"{_rel(got['base'], want['base']):>8.1%}",
        f"{'decode per stream':<22}{want['per_stream'] * 1e3:>9.3f} ms"
        f"{got['per_stream'] * 1e3:>9.3f} ms{_rel(got['per_stream'], want['per_stream']):>8.1%}",
        f"{'prefill tokens/s':<22}{want['rate']:>12,.0f}{got['rate']:>12,.0f}"
        f"{_rel(got['rate'], want['rate']):>8.1%}",
        f"{'chunk size':<22}{want['chunk']:>12}{_c(got['chunk']):>12}"
        f"{_rel(got['chunk'] or 0, want['chunk']):>8.1%}",
        f"{prompt}-token prompt, {STREAMS} streams decoding: predicted / measured (error)",
        f"{'chunk':>6}{'worst gap ms':>26}{'rate during prefill /s':>28}{'TTFT ms':>28}",
    ]
    errors = []
    for row in backend["table"]:
        m = measured[row["chunk_size"]]
        cells = []
        for key, scale, value in (
            ("worst_gap_s", 1e3, m.worst_gap_s),
            ("rate_during_prefill_per_s", 1, m.rate_during_prefill_per_s),
            ("ttft_s", 1e3, m.ttft_s),
        ):
            err = _rel(row[key], value)
            errors.append((row["chunk_size"], key, err))
            cells.append(f"{row[key] * scale:>9.1f} / {value * scale:>7.1f} ({err:>5.1%})")
        late = f"  ({m.late_steps} late steps left out)" if m.late_steps else ""
        lines.append(f"{_c(row['chunk_size']):>6}" + "".join(f"{c:>28}" for c in cells) + late)
    print("\n".join(lines))

    for key in ("base", "per_stream", "rate"):
        assert _rel(got[key], want[key]) <= TOLERANCE, (key, got[key], want[key])
    assert fit["chunked"] is True
    assert _rel(got["chunk"], want["chunk"]) <= TOLERANCE, (got["chunk"], want["chunk"])
    assert [r["chunk_size"] for r in backend["table"]] == list(DEFAULT_CHUNK_SIZES)
    bad = [e for e in errors if e[2] > TOLERANCE]
    assert bad == [], bad
