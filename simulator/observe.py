"""What the simulated engine did to its streams around one long prompt, from its ground truth.

The counterpart of :func:`simulator.cost.predict_seed_stutter`: the same figures,
taken from the engine's step and prefill records instead of the cost model. The
records carry ``time.monotonic_ns()`` of the engine's process (system-wide on
Linux), so a proxy on the same machine can set its own stamps against them:

- model vs engine: how well the engine keeps to its cost model (timer overshoot
  of a millisecond or so; a step after a late one is shortened by up to
  :data:`simulator.engine.MAX_CATCH_UP_NS`);
- engine vs proxy: delivery, i.e. the server writing a step's tokens, the proxy
  reading and stamping them, and a request's trip through the proxy.

An existing stream emits a token at the end of every step, so its gaps are the
engine's step periods (end of one step to the end of the next).

:func:`observe_phases` is the engine's side of a reasoning model's request: its
first token, its first answer token and the reasoning between them.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from simulator.records import FinishRecord, PrefillRecord, Record, StepRecord


@dataclass(frozen=True, slots=True)
class ObservedStutter:
    """What one long prompt did to the streams already decoding, as the engine recorded it."""

    steady_gap_s: float
    """Median step period of the last steps before the prompt arrived (decode steps)."""
    worst_gap_s: float
    """Longest step period overlapping the prompt's arrival to first token, among steps
    that decoded existing streams: an existing stream's worst gap meanwhile."""
    prefill_steps: int
    """Steps that carried a piece of the prompt."""
    prefill_window_s: float
    """Start of the first step carrying the prompt to its first token (the model's window)."""
    queue_s: float
    """Arrival to the start of that step: the rest of the step running when it arrived."""
    ttft_s: float
    """Arrival at the engine to first token: ``queue_s + prefill_window_s``."""


def observe_stutter(
    records: Iterable[Record], x_request_id: str, *, steady_steps: int = 8
) -> ObservedStutter:
    """The engine's figures for the prompt sent with ``X-Request-Id: x_request_id``.

    ``records`` must hold that request's prefill record and the steps around
    it (``GET /sim/ground_truth``). Raises ValueError when they do not.
    """
    steps: list[StepRecord] = []
    prefill: PrefillRecord | None = None
    for record in records:
        if isinstance(record, StepRecord):
            steps.append(record)
        elif isinstance(record, PrefillRecord) and record.x_request_id == x_request_id:
            prefill = record
    if prefill is None:
        raise ValueError(f"observe_stutter: no prefill record for {x_request_id!r}")
    steps.sort(key=lambda s: s.step)
    # (start, end) of every gap a stream decoding in two consecutive steps sees.
    gaps = [
        (a.end_ns, b.end_ns)
        for a, b in itertools.pairwise(steps)
        if b.step == a.step + 1 and a.decode_batch and b.decode_batch
    ]
    before = [end - start for start, end in gaps if end <= prefill.arrival_ns]
    during = [
        end - start for start, end in gaps if end > prefill.arrival_ns and start < prefill.end_ns
    ]
    if not before or not during:
        raise ValueError(f"observe_stutter: no decode steps around {x_request_id!r}")
    return ObservedStutter(
        steady_gap_s=statistics.median(before[-steady_steps:]) / 1e9,
        worst_gap_s=max(during) / 1e9,
        prefill_steps=prefill.steps,
        prefill_window_s=(prefill.end_ns - prefill.start_ns) / 1e9,
        queue_s=(prefill.start_ns - prefill.arrival_ns) / 1e9,
        ttft_s=(prefill.end_ns - prefill.arrival_ns) / 1e9,
    )


@dataclass(frozen=True, slots=True)
class ObservedPhases:
    """A reasoning model's request as the engine recorded it: thinking, then answering."""

    ttft_s: float
    """Arrival at the engine to its first token (reasoning or answer)."""
    answer_ttft_s: float | None
    """Arrival to its first answer token; None when reasoning used up its length."""
    reasoning_s: float | None
    """First token to the first answer token (to the last token when none came); None
    when it did not reason."""
    reasoning_tokens: int
    """Tokens it spent reasoning, all choices (what its usage reports)."""
    output_tokens: int
    """Tokens it emitted, all choices, reasoning included."""


def observe_phases(records: Iterable[Record], x_request_id: str) -> ObservedPhases:
    """The engine's figures for the request sent with ``X-Request-Id: x_request_id``.

    ``records`` must hold its prefill and finish records (``GET /sim/ground_truth``);
    ValueError when they do not.
    """
    prefill: PrefillRecord | None = None
    finish: FinishRecord | None = None
    for record in records:
        if isinstance(record, PrefillRecord) and record.x_request_id == x_request_id:
            prefill = record
        elif isinstance(record, FinishRecord) and record.x_request_id == x_request_id:
            finish = record
    if prefill is None or finish is None:
        raise ValueError(f"observe_phases: no prefill and finish records for {x_request_id!r}")
    first_ns, answer_ns = prefill.end_ns, finish.first_answer_ns
    return ObservedPhases(
        ttft_s=(first_ns - prefill.arrival_ns) / 1e9,
        answer_ttft_s=None if answer_ns is None else (answer_ns - finish.arrival_ns) / 1e9,
        reasoning_s=(
            ((finish.end_ns if answer_ns is None else answer_ns) - first_ns) / 1e9
            if finish.reasoning_tokens
            else None
        ),
        reasoning_tokens=finish.reasoning_tokens,
        output_tokens=finish.output_tokens,
    )
