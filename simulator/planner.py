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
- A request with ``n > 1`` choices is prefilled once and then decodes its choices
  side by side: each takes a place in the batch, costs a decoding sequence and
  emits a token every step (all choices have the same length and end together).
  Reasoning tokens are the first tokens of each choice and cost what any token
  costs; the planner only notes when the first answer token came out.

The batch has room while it holds fewer than ``max_num_seqs`` sequences and,
with a KV budget, fewer than the budget's ``max_seqs``. The other techniques
(:mod:`simulator.techniques`) change these rules only when they are on:
speculative decoding lets a decoded sequence emit ``1 + accepted`` tokens per
step at a higher step cost; static batching admits a whole batch into one step
and nothing more until the batch is done; a planner built with ``hand_off`` is a
disaggregated prefill pool (it never decodes; a prefilled sequence leaves with
its first token, after its KV transfer, for the decode pool's
:meth:`StepPlanner.add_prefilled`)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Literal

from simulator.cost import CostModel
from simulator.records import FinishRecord, PrefillRecord, StepRecord, TokenRecord
from simulator.steps import (
    Handoff,
    Phase,
    PrefillPiece,
    SequenceSpec,
    StepOutput,
    StepPlan,
    StepResult,
)
from simulator.techniques import Techniques
from simulator.tokens import PrefixCache

__all__ = [
    "Handoff",
    "Phase",
    "PrefillPiece",
    "SequenceSpec",
    "StepPlan",
    "StepPlanner",
    "StepResult",
]


class _Sequence:
    """Mutable progress of one sequence (planner-internal)."""

    __slots__ = (
        "cached",
        "computed",
        "emitted",
        "first_answer_ns",
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
        self.emitted = 0  # per choice
        self.first_answer_ns: int | None = None
        self.prefill_start_ns: int | None = None
        self.prefill_steps = 0


class StepPlanner:
    """Continuous-batching scheduler over a cost model; optional prefix cache and techniques."""

    def __init__(
        self,
        cost: CostModel,
        prefix_cache: PrefixCache | None = None,
        techniques: Techniques | None = None,
        *,
        pool: Literal["mixed", "prefill", "decode"] = "mixed",
        hand_off: Callable[[Handoff], None] | None = None,
    ) -> None:
        """Empty engine state for ``cost``; ``prefix_cache`` None disables caching.

        ``pool`` names the accelerator in step records; ``hand_off`` (a prefill
        pool's) receives every sequence whose prefill completed.
        """
        self._cost = cost
        self._cache = prefix_cache
        self._tech = techniques or Techniques()
        self._pool = pool
        self._hand_off = hand_off
        spec = self._tech.speculative
        self._rng = random.Random(spec.seed if spec is not None else 0)
        self._waiting: deque[_Sequence] = deque()
        self._ready: deque[_Sequence] = deque()  # prefilled elsewhere, waiting for room
        self._running: dict[str, _Sequence] = {}  # insertion order = admission order
        self._pending: StepPlan | None = None
        self._next_step = 0

    @property
    def cost(self) -> CostModel:
        """The cost model steps are timed with."""
        return self._cost

    @property
    def techniques(self) -> Techniques:
        """The techniques the planner applies."""
        return self._tech

    @property
    def num_waiting(self) -> int:
        """Requests not yet admitted."""
        return len(self._waiting) + len(self._ready)

    @property
    def num_running(self) -> int:
        """Sequences admitted (prefilling or decoding; every choice of a request counts)."""
        return sum(s.spec.choices for s in self._running.values())

    @property
    def num_decoding(self) -> int:
        """Running sequences past their first token."""
        return sum(1 for s in self._running.values() if s.phase is Phase.DECODING)

    def phase(self, response_id: str) -> Phase | None:
        """Phase of a live request, None when unknown, finished or aborted."""
        seq = self._running.get(response_id)
        if seq is not None:
            return seq.phase
        waiting = any(s.spec.response_id == response_id for s in (*self._waiting, *self._ready))
        return Phase.WAITING if waiting else None

    def cached_tokens(self, response_id: str) -> int:
        """Cached prompt tokens of a running request (0 before admission)."""
        seq = self._running.get(response_id)
        return 0 if seq is None else seq.cached

    def next_admission_ns(self) -> int | None:
        """When a plan that returned None for want of time may admit (static batching's fill
        window); None when only a new request or a committed step can change the plan."""
        static = self._tech.static_batching
        if static is None or self._running or not self._waiting:
            return None
        return self._waiting[0].spec.arrival_ns + round(static.fill_s * 1e9)

    def add(self, spec: SequenceSpec) -> None:
        """Queue a request (FIFO)."""
        if spec.prompt_tokens < 1 or spec.output_tokens < 1 or spec.choices < 1:
            raise ValueError(
                f"{spec.response_id}: prompt_tokens, output_tokens and choices must be >= 1"
            )
        if spec.reasoning_tokens < 0:
            raise ValueError(f"{spec.response_id}: reasoning_tokens must be >= 0")
        if self.phase(spec.response_id) is not None:
            raise ValueError(f"{spec.response_id}: duplicate response id")
        self._waiting.append(_Sequence(spec))

    def add_prefilled(self, handoff: Handoff) -> None:
        """Take over a sequence prefilled by another pool; it decodes once the batch has room."""
        if self.phase(handoff.spec.response_id) is not None:
            raise ValueError(f"{handoff.spec.response_id}: duplicate response id")
        seq = _Sequence(handoff.spec)
        seq.phase = Phase.DECODING
        seq.cached = handoff.cached_tokens
        seq.computed = handoff.spec.prompt_tokens
        seq.emitted = handoff.emitted
        seq.first_answer_ns = handoff.first_answer_ns
        self._ready.append(seq)

    def abort(self, response_id: str, now_ns: int) -> FinishRecord | None:
        """Drop a request wherever it is; its finish record, or None if it was not live."""
        seq = self._running.pop(response_id, None)
        for queue in (self._waiting, self._ready):
            for candidate in queue:
                if seq is None and candidate.spec.response_id == response_id:
                    seq = candidate
                    queue.remove(candidate)
                    break
        if seq is None:
            return None
        seq.phase = Phase.FINISHED
        return self._finish_record(seq, "abort", now_ns)

    @staticmethod
    def _finish_record(
        seq: _Sequence, reason: Literal["length", "stop", "abort"], end_ns: int
    ) -> FinishRecord:
        spec = seq.spec
        return FinishRecord(
            spec.response_id,
            spec.x_request_id,
            reason,
            seq.emitted * spec.choices,
            spec.arrival_ns,
            end_ns,
            reasoning_tokens=min(spec.reasoning_tokens, seq.emitted) * spec.choices,
            first_answer_ns=seq.first_answer_ns,
            choices=spec.choices,
        )

    def _room(self) -> bool:
        kv = self._tech.kv_budget
        limit = self._cost.max_num_seqs if kv is None else min(self._cost.max_num_seqs, kv.max_seqs)
        return self.num_running < limit

    def plan(self, now_ns: int | None = None) -> StepPlan | None:
        """Fix the next step's work (admitting requests), or None when there is nothing to do.

        ``now_ns`` matters only to static batching: before the fill window of
        the first waiting request is over, nothing is admitted (None: admit now).
        """
        if self._pending is not None:
            raise RuntimeError("plan: the previous step was not committed")
        while self._ready and self._room():
            seq = self._ready.popleft()
            self._running[seq.spec.response_id] = seq
        decoding = [s for s in self._running.values() if s.phase is Phase.DECODING]
        decode_ids = tuple(s.spec.response_id for s in decoding)
        extra_choices = sum(s.spec.choices - 1 for s in decoding)
        pieces: list[PrefillPiece] = []
        chunk = self._cost.chunk_size
        if self._tech.static_batching is not None:
            wake_ns = self.next_admission_ns()
            if wake_ns is not None and (now_ns is None or now_ns >= wake_ns):
                # The whole batch is prefilled in one pass, then decodes in lockstep.
                while self._waiting and self._room():
                    seq = self._admit()
                    pieces.append(self._piece(seq, self._remaining(seq)))
        elif chunk is None:
            if self._waiting and self._room():
                seq = self._admit()
                pieces.append(self._piece(seq, self._remaining(seq)))
        else:
            budget = chunk
            for seq in self._running.values():
                if budget == 0:
                    break
                if seq.phase is Phase.PREFILLING:
                    budget -= self._take(seq, budget, pieces)
            while budget > 0 and self._waiting and self._room():
                budget -= self._take(self._admit(), budget, pieces)
        if not decode_ids and not pieces:
            return None
        plan = StepPlan(
            step=self._next_step,
            decode_ids=decode_ids,
            prefill=tuple(pieces),
            duration_s=self._duration_s(len(decode_ids) + extra_choices, pieces),
            waiting=self.num_waiting,
            running=self.num_running,
            extra_choices=extra_choices,
        )
        self._next_step += 1
        self._pending = plan
        return plan

    def _duration_s(self, decode_batch: int, pieces: list[PrefillPiece]) -> float:
        duration_s = self._cost.step_s(decode_batch, sum(p.tokens for p in pieces))
        if self._tech.speculative is not None:
            duration_s += self._tech.speculative.extra_s(decode_batch)
        disaggregated = self._tech.disaggregated
        if self._hand_off is not None and disaggregated is not None:
            for piece in pieces:
                if piece.completes:
                    prompt = self._running[piece.response_id].spec.prompt_tokens
                    duration_s += disaggregated.transfer_s(prompt)
        return duration_s

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
        out = StepOutput()
        for piece in plan.prefill:
            seq = self._running.get(piece.response_id)
            if seq is not None:
                self._prefilled(seq, piece, start_ns, end_ns, plan.step, out)
        speculative = self._tech.speculative
        drafted = accepted = 0
        for response_id in plan.decode_ids:
            seq = self._running.get(response_id)
            if seq is None:
                continue
            n = 1
            if speculative is not None:
                # One draw per request: its choices keep the same length.
                choices = seq.spec.choices
                drafted += speculative.draft_tokens * choices
                n = min(1 + speculative.accepted(self._rng), seq.spec.output_tokens - seq.emitted)
                accepted += (n - 1) * choices
            for _ in range(n):
                self._emit(seq, plan.step, end_ns, out)
        kv = self._tech.kv_budget
        step = StepRecord(
            step=plan.step,
            start_ns=start_ns,
            end_ns=end_ns,
            duration_s=plan.duration_s,
            decode_batch=plan.decode_batch,
            prefill_tokens=plan.prefill_tokens,
            prefill_response_ids=tuple(p.response_id for p in plan.prefill),
            prefill_x_request_ids=tuple(p.x_request_id for p in plan.prefill),
            pool=self._pool,
            waiting=plan.waiting,
            running=plan.running,
            kv_tokens_used=0 if kv is None else plan.running * kv.tokens_per_seq,
            drafted_tokens=drafted,
            accepted_tokens=accepted,
        )
        return StepResult(
            step, tuple(out.tokens), tuple(out.prefills), tuple(out.finishes), tuple(out.handoffs)
        )

    def _prefilled(
        self,
        seq: _Sequence,
        piece: PrefillPiece,
        start_ns: int,
        end_ns: int,
        step: int,
        out: StepOutput,
    ) -> None:
        spec = seq.spec
        if seq.prefill_start_ns is None:
            seq.prefill_start_ns = start_ns
        seq.prefill_steps += 1
        seq.computed += piece.tokens
        if not piece.completes:
            return
        seq.phase = Phase.DECODING
        if self._cache is not None:
            self._cache.insert(spec.block_hashes)
        disaggregated = self._tech.disaggregated
        transfer_s = 0.0
        if self._hand_off is not None and disaggregated is not None:
            transfer_s = disaggregated.transfer_s(spec.prompt_tokens)
        out.prefills.append(
            PrefillRecord(
                spec.response_id,
                spec.x_request_id,
                spec.prompt_tokens,
                seq.cached,
                spec.arrival_ns,
                seq.prefill_start_ns,
                end_ns,
                seq.prefill_steps,
                transfer_s,
            )
        )
        self._emit(seq, step, end_ns, out)
        if self._hand_off is not None and spec.response_id in self._running:
            del self._running[spec.response_id]
            handoff = Handoff(spec, seq.cached, seq.emitted, seq.first_answer_ns)
            out.handoffs.append(handoff)
            self._hand_off(handoff)

    def _emit(self, seq: _Sequence, step: int, end_ns: int, out: StepOutput) -> None:
        spec = seq.spec
        index = seq.emitted
        for choice in range(spec.choices):
            out.tokens.append(
                TokenRecord(spec.response_id, spec.x_request_id, index, step, end_ns, choice)
            )
        if index == spec.reasoning_tokens:
            seq.first_answer_ns = end_ns
        seq.emitted += 1
        if seq.emitted >= spec.output_tokens:
            seq.phase = Phase.FINISHED
            del self._running[spec.response_id]
            out.finishes.append(self._finish_record(seq, spec.finish_reason, end_ns))
