"""Value types of the step planner: requests, planned steps and what a step produced.

Pure, like :mod:`simulator.planner`, which re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from simulator.records import FinishRecord, PrefillRecord, StepRecord, TokenRecord


class Phase(StrEnum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """A request as the planner needs it."""

    response_id: str
    """Unique id of the request (its response id)."""
    x_request_id: str | None
    """The client's ``X-Request-Id`` header, if any (copied into records)."""
    prompt_tokens: int
    """Prompt length (tokens), >= 1."""
    output_tokens: int
    """Tokens to emit, >= 1."""
    finish_reason: Literal["length", "stop"]
    """Reason reported when ``output_tokens`` are out."""
    arrival_ns: int
    """Monotonic time the engine received it."""
    block_hashes: tuple[bytes, ...] = ()
    """Prefix-cache block hashes of the prompt (empty: never a cache hit)."""
    reasoning_tokens: int = 0
    """Of each choice's ``output_tokens``, how many come first as reasoning (a reasoning
    model thinks before it answers); they cost decode steps like any token."""
    choices: int = 1
    """Choices decoded side by side after one prefill (the request's ``n``): each takes a
    place in the batch and emits a token every step."""


@dataclass(frozen=True, slots=True)
class PrefillPiece:
    """Prompt tokens of one request computed in a step."""

    response_id: str
    """The request."""
    x_request_id: str | None
    """The request's ``X-Request-Id`` header, if any."""
    tokens: int
    """Prompt tokens computed in this step."""
    completes: bool
    """True when this piece finishes the prompt (the request's first token comes out)."""


@dataclass(frozen=True, slots=True)
class StepPlan:
    """The work of one step, fixed before it runs."""

    step: int
    """Step index."""
    decode_ids: tuple[str, ...]
    """Sequences decoding one token, in admission order."""
    prefill: tuple[PrefillPiece, ...]
    """Prefill pieces, in FIFO order."""
    duration_s: float
    """``cost.step_s(decode_batch, prefill_tokens)``, plus the techniques' extra costs."""
    waiting: int = 0
    """Requests still queued once the step's admissions were made."""
    running: int = 0
    """Sequences in the batch (prefilling or decoding) once the step's admissions were made."""
    extra_choices: int = 0
    """Sequences decoded beyond one per request: ``sum(n - 1)`` over requests with ``n > 1``."""

    @property
    def decode_batch(self) -> int:
        """Number of decoding sequences (every choice of a request counts)."""
        return len(self.decode_ids) + self.extra_choices

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens computed in this step."""
        return sum(piece.tokens for piece in self.prefill)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a committed step produced, in record form."""

    step: StepRecord
    """The step itself."""
    tokens: tuple[TokenRecord, ...]
    """Tokens emitted at the step's end (first tokens included)."""
    prefills: tuple[PrefillRecord, ...]
    """Prefills that completed in the step."""
    finishes: tuple[FinishRecord, ...]
    """Requests that emitted their last token in the step."""
    handoffs: tuple[Handoff, ...] = ()
    """Sequences a prefill pool passed to the decode pool at the step's end."""


@dataclass(frozen=True, slots=True)
class Handoff:
    """A prefilled sequence moving from a prefill pool to a decode pool (disaggregated)."""

    spec: SequenceSpec
    """The request."""
    cached_tokens: int
    """Prompt tokens its prefill found in the prefix cache."""
    emitted: int
    """Tokens already emitted (1: the first token came with the KV)."""
    first_answer_ns: int | None = None
    """Emit time of its first answer token, when it came with the KV (no reasoning)."""


class StepOutput:
    """The records one step's commit collects, in order (the planner's scratch list)."""

    __slots__ = ("finishes", "handoffs", "prefills", "tokens")

    def __init__(self) -> None:
        self.tokens: list[TokenRecord] = []
        self.prefills: list[PrefillRecord] = []
        self.finishes: list[FinishRecord] = []
        self.handoffs: list[Handoff] = []
