"""The engine's own per-request timings in OpenAI-compatible answers: vLLM ``metrics``, SGLang
``meta_info``.

vLLM (``docs/features/per_request_metrics.md``; server flag
``--enable-per-request-metrics``): the answer, and in a stream the final usage
chunk (so only with ``stream_options.include_usage``, which the proxy injects),
carries a top-level ``metrics`` object: ``queue_time_ms`` (waiting in the
scheduler queue), ``time_to_first_token_ms`` (from scheduling to the first
output token: the engine's prefill), ``generation_time_ms`` (first to last
output token), ``mean_itl_ms``, ``tokens_per_second``. Any of them may be
``null``; the whole object is ``null`` for ``n > 1``. With
``--per-request-spec-decode-metrics summary`` (or ``detailed``) it also holds
``speculative_decoding.mean_acceptance_length`` (tokens per verification step,
bonus token included; ``docs/features/speculative_decoding/acceptance_metrics.md``).

SGLang: its native answers carry ``meta_info``; its OpenAI-compatible routes put
it on each choice when the request asks with ``return_meta_info: true``. With
``--enable-metrics`` it holds ``queue_time`` (seconds, ``forward_entry_time -
wait_queue_entry_time``) and the stamps ``forward_entry_time`` and
``prefill_finished_time`` on one engine clock (their difference: the prefill);
``e2e_latency`` (seconds); with speculative decoding ``spec_verify_ct``
(verification steps), so ``completion_tokens / spec_verify_ct`` is the mean
acceptance length (``spec_accept_length`` where a newer server sends it).

Pure: no I/O; never raises on bad data (a field of the wrong type or range is
unknown).
"""

from __future__ import annotations

import math
from typing import Any

from proxy.core.records import BackendTimings

_MS = 1e3


def _number(v: Any) -> float | None:
    """A finite non-negative number (not a bool), else ``None``."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer beyond any float
        return None
    return f if math.isfinite(f) and f >= 0 else None


def _ms(v: Any) -> float | None:
    n = _number(v)
    return None if n is None else n / _MS


def _acceptance(v: float | None) -> float | None:
    """A mean acceptance length: at least one token per step, else unknown."""
    return v if v is not None and v >= 1.0 else None


def vllm_timings(metrics: dict[str, Any]) -> BackendTimings | None:
    """vLLM's per-request ``metrics`` object; ``None`` when it says nothing."""
    spec = metrics.get("speculative_decoding")
    acceptance = (
        _acceptance(_number(spec.get("mean_acceptance_length"))) if isinstance(spec, dict) else None
    )
    t = BackendTimings(
        prefill_s=_ms(metrics.get("time_to_first_token_ms")),
        decode_s=_ms(metrics.get("generation_time_ms")),
        per_token_s=_ms(metrics.get("mean_itl_ms")),
        queue_s=_ms(metrics.get("queue_time_ms")),
        acceptance_length=acceptance,
    )
    return None if t == _NOTHING else t


def sglang_timings(meta: dict[str, Any]) -> BackendTimings | None:
    """SGLang's ``meta_info``; ``None`` when it has no timing or speculative-decoding field."""
    entered = _number(meta.get("forward_entry_time"))
    prefilled = _number(meta.get("prefill_finished_time"))
    prefill = prefilled - entered if entered and prefilled and prefilled >= entered else None
    acceptance = _acceptance(_number(meta.get("spec_accept_length")))
    if acceptance is None:
        steps = _number(meta.get("spec_verify_ct"))
        tokens = _number(meta.get("completion_tokens"))
        if steps and tokens is not None:
            acceptance = _acceptance(tokens / steps)
    t = BackendTimings(
        prefill_s=prefill,
        total_s=_number(meta.get("e2e_latency")),
        queue_s=_number(meta.get("queue_time")),
        acceptance_length=acceptance,
    )
    return None if t == _NOTHING else t


_NOTHING = BackendTimings()


def engine_timings(obj: dict[str, Any], choices: object) -> BackendTimings | None:
    """The engine's timings in one chunk or body: vLLM's ``metrics``, else SGLang's ``meta_info``.

    ``choices`` is the chunk's ``choices`` value (SGLang's ``meta_info`` rides a choice).
    Called off the per-token path: only for chunks with usage or a finish reason.
    """
    metrics = obj.get("metrics")
    if isinstance(metrics, dict):
        return vllm_timings(metrics)
    meta = obj.get("meta_info")
    if isinstance(meta, dict):
        return sglang_timings(meta)
    if isinstance(choices, list):
        for c in choices:
            if isinstance(c, dict):
                meta = c.get("meta_info")
                if isinstance(meta, dict):
                    return sglang_timings(meta)
    return None
