"""Pure step planner of the simulated engine: continuous batching without a clock.

The engine calls :meth:`StepPlanner.plan` to fix the next step's work, waits
the step's duration, then :meth:`StepPlanner.commit` with the step's start and
end times to get the ground-truth records and the tokens to deliver. Tests
drive the same two calls with made-up times.

Scheduling (FIFO throughout):

- A step decodes one token for every running sequence whose prefill finished
  in an earlier step.
- Unchunked (``chunk_size is None``): if the batch has room, the head of the
  waiting queue is admitted and its whole prompt (minus cached tokens) is
  computed in this step; one prompt per step.
- Chunked: up to ``chunk_size`` prompt tokens per step, first to partly
  prefilled running sequences (in admission order), then to waiting requests
  admitted in arrival order while the batch has room.
- A sequence whose prefill completes emits its first token at the end of that
  step; every decoded sequence emits one. A sequence is done when it has emitted
  its output length, and leaves the batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from simulator.cost import CostModel
from simulator.records import FinishRecord, PrefillRecord, StepRecord, TokenRecord
from simulator.tokens import PrefixCache


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


class _Sequence:
    """Mutable progress of one sequence (planner-internal)."""

    __slots__ = (
        "cached",
        "computed",
        "emitted",
        "phase",
        "prefill_start_ns",
        "prefill_steps",
        "spec",
    )

    def __init__(self, spec: SequenceSpec) -> None:
        self.spec = spec
        self.phase = Phase.WAITING
        self.cached = 0
        self.computed = 0
        self.emitted = 0
        self.prefill_start_ns: int | None = None
        self.prefill_steps = 0


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
    """``cost.step_s(len(decode_ids), prefill_tokens)``."""

    @property
    def decode_batch(self) -> int:
        """Number of decoding sequences."""
        return len(self.decode_ids)

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


class StepPlanner:
    """Continuous-batching scheduler over a cost model; optional prefix cache."""

    def __init__(self, cost: CostModel, prefix_cache: PrefixCache | None = None) -> None:
        """Empty engine state for ``cost``; ``prefix_cache`` None disables caching."""
        self._cost = cost
        self._cache = prefix_cache
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, _Sequence] = {}  # insertion order = admission order
        self._pending: StepPlan | None = None
        self._next_step = 0

    @property
    def cost(self) -> CostModel:
        """The cost model steps are timed with."""
        return self._cost

    @property
    def num_waiting(self) -> int:
        """Requests not yet admitted."""
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Sequences admitted (prefilling or decoding)."""
        return len(self._running)

    @property
    def num_decoding(self) -> int:
        """Running sequences past their first token."""
        return sum(1 for s in self._running.values() if s.phase is Phase.DECODING)

    def phase(self, response_id: str) -> Phase | None:
        """Phase of a live request, None when unknown, finished or aborted."""
        seq = self._running.get(response_id)
        if seq is not None:
            return seq.phase
        waiting = any(s.spec.response_id == response_id for s in self._waiting)
        return Phase.WAITING if waiting else None

    def cached_tokens(self, response_id: str) -> int:
        """Cached prompt tokens of a running request (0 before admission)."""
        seq = self._running.get(response_id)
        return 0 if seq is None else seq.cached

    def add(self, spec: SequenceSpec) -> None:
        """Queue a request (FIFO)."""
        if spec.prompt_tokens < 1 or spec.output_tokens < 1:
            raise ValueError(f"{spec.response_id}: prompt_tokens and output_tokens must be >= 1")
        if spec.response_id in self._running or any(
            s.spec.response_id == spec.response_id for s in self._waiting
        ):
            raise ValueError(f"{spec.response_id}: duplicate response id")
        self._waiting.append(_Sequence(spec))

    def abort(self, response_id: str, now_ns: int) -> FinishRecord | None:
        """Drop a request wherever it is; its finish record, or None if it was not live."""
        seq = self._running.pop(response_id, None)
        if seq is None:
            for candidate in self._waiting:
                if candidate.spec.response_id == response_id:
                    seq = candidate
                    self._waiting.remove(candidate)
                    break
        if seq is None:
            return None
        seq.phase = Phase.FINISHED
        spec = seq.spec
        return FinishRecord(
            spec.response_id, spec.x_request_id, "abort", seq.emitted, spec.arrival_ns, now_ns
        )

    def plan(self) -> StepPlan | None:
        """Fix the next step's work (admitting requests), or None when there is nothing to do."""
        if self._pending is not None:
            raise RuntimeError("plan: the previous step was not committed")
        decode_ids = tuple(rid for rid, s in self._running.items() if s.phase is Phase.DECODING)
        pieces: list[PrefillPiece] = []
        chunk = self._cost.chunk_size
        if chunk is None:
            if self._waiting and len(self._running) < self._cost.max_num_seqs:
                seq = self._admit()
                pieces.append(self._piece(seq, self._remaining(seq)))
        else:
            budget = chunk
            for seq in self._running.values():
                if budget == 0:
                    break
                if seq.phase is Phase.PREFILLING:
                    budget -= self._take(seq, budget, pieces)
            while budget > 0 and self._waiting and len(self._running) < self._cost.max_num_seqs:
                budget -= self._take(self._admit(), budget, pieces)
        if not decode_ids and not pieces:
            return None
        plan = StepPlan(
            step=self._next_step,
            decode_ids=decode_ids,
            prefill=tuple(pieces),
            duration_s=self._cost.step_s(len(decode_ids), sum(p.tokens for p in pieces)),
        )
        self._next_step += 1
        self._pending = plan
        return plan

    def _admit(self) -> _Sequence:
        seq = self._waiting.popleft()
        seq.phase = Phase.PREFILLING
        if self._cache is not None:
            seq.cached = self._cache.match(seq.spec.block_hashes, seq.spec.prompt_tokens)
            seq.computed = seq.cached
        self._running[seq.spec.response_id] = seq
        return seq

    @staticmethod
    def _remaining(seq: _Sequence) -> int:
        return seq.spec.prompt_tokens - seq.computed

    def _take(self, seq: _Sequence, budget: int, pieces: list[PrefillPiece]) -> int:
        # ``computed`` advances at commit; within one plan a sequence gets one piece.
        tokens = min(self._remaining(seq), budget)
        pieces.append(self._piece(seq, tokens))
        return tokens

    def _piece(self, seq: _Sequence, tokens: int) -> PrefillPiece:
        spec = seq.spec
        return PrefillPiece(
            spec.response_id, spec.x_request_id, tokens, tokens == self._remaining(seq)
        )

    def commit(self, plan: StepPlan, start_ns: int, end_ns: int) -> StepResult:
        """Apply a planned step that ran from ``start_ns`` to ``end_ns``; its records.

        Requests aborted while the step ran emit nothing.
        """
        if plan is not self._pending:
            raise RuntimeError("commit: not the planned step")
        self._pending = None
        tokens: list[TokenRecord] = []
        prefills: list[PrefillRecord] = []
        finishes: list[FinishRecord] = []
        for piece in plan.prefill:
            seq = self._running.get(piece.response_id)
            if seq is None:
                continue
            spec = seq.spec
            if seq.prefill_start_ns is None:
                seq.prefill_start_ns = start_ns
            seq.prefill_steps += 1
            seq.computed += piece.tokens
            if piece.completes:
                seq.phase = Phase.DECODING
                if self._cache is not None:
                    self._cache.insert(spec.block_hashes)
                prefills.append(
                    PrefillRecord(
                        spec.response_id,
                        spec.x_request_id,
                        spec.prompt_tokens,
                        seq.cached,
                        spec.arrival_ns,
                        seq.prefill_start_ns,
                        end_ns,
                        seq.prefill_steps,
                    )
                )
                self._emit(seq, plan.step, end_ns, tokens, finishes)
        for response_id in plan.decode_ids:
            seq = self._running.get(response_id)
            if seq is not None:
                self._emit(seq, plan.step, end_ns, tokens, finishes)
        step = StepRecord(
            step=plan.step,
            start_ns=start_ns,
            end_ns=end_ns,
            duration_s=plan.duration_s,
            decode_batch=plan.decode_batch,
            prefill_tokens=plan.prefill_tokens,
            prefill_response_ids=tuple(p.response_id for p in plan.prefill),
            prefill_x_request_ids=tuple(p.x_request_id for p in plan.prefill),
        )
        return StepResult(step, tuple(tokens), tuple(prefills), tuple(finishes))

    def _emit(
        self,
        seq: _Sequence,
        step: int,
        end_ns: int,
        tokens: list[TokenRecord],
        finishes: list[FinishRecord],
    ) -> None:
        spec = seq.spec
        tokens.append(TokenRecord(spec.response_id, spec.x_request_id, seq.emitted, step, end_ns))
        seq.emitted += 1
        if seq.emitted >= spec.output_tokens:
            seq.phase = Phase.FINISHED
            del self._running[spec.response_id]
            finishes.append(
                FinishRecord(
                    spec.response_id,
                    spec.x_request_id,
                    spec.finish_reason,
                    seq.emitted,
                    spec.arrival_ns,
                    end_ns,
                )
            )
