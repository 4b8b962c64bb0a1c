"""The simulated inference engine: the step planner run in real time with asyncio.

One background task loops: plan a step, sleep until the step's end on the
monotonic clock, commit it, hand each request's tokens of the step to its queue
(one event; several tokens with speculative decoding) and record the ground
truth. Disaggregated, each pool has such a loop of its own. Sleep overshoot does
not accumulate: back-to-back steps are scheduled on an ideal timeline (step
``k`` ends at the ideal end of step ``k - 1`` plus its modelled duration); when
the engine has fallen more than 5 ms behind (a GC pause, an overloaded machine)
the timeline restarts from now instead of bursting to catch up. With nothing to
do the loop waits on an event (static batching: or until its batch has filled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from simulator.disaggregated import DisaggregatedPlanner
from simulator.planner import SequenceSpec, StepPlanner, StepResult
from simulator.profile import Profile
from simulator.records import GroundTruth
from simulator.tokens import PrefixCache

_log = logging.getLogger(__name__)

MAX_CATCH_UP_NS = 5_000_000
"""Most a step is shortened to make up for the lateness of the one before it (ns).

Overshoot of the event loop's timers (about a millisecond) is made up by the
next step; a longer hiccup (GC pause, busy machine) restarts the timeline.
"""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything an engine needs; validated on construction."""

    profile: Profile
    """Cost model and served-model defaults."""
    prefix_cache: bool = False
    """Cache prompt blocks (16 tokens) and skip their prefill on a hit."""
    prefix_cache_blocks: int = 1 << 16
    """Prefix-cache capacity in blocks (LRU beyond)."""
    ground_truth_path: Path | None = None
    """Append every record as a JSON line to this file, when set."""
    ground_truth_limit: int = 200_000
    """Records kept in memory (newest)."""

    def __post_init__(self) -> None:
        if self.prefix_cache_blocks < 1:
            raise ValueError(f"prefix_cache_blocks: expected >= 1, got {self.prefix_cache_blocks}")
        if self.ground_truth_limit < 1:
            raise ValueError(f"ground_truth_limit: expected >= 1, got {self.ground_truth_limit}")


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One output token delivered to a request's handler (for each of its choices: they
    emit in the same steps)."""

    index: int
    """Index of the event's first token (0 for the first token)."""
    emit_ns: int
    """Monotonic time the engine emitted it (end of its step)."""
    finish_reason: Literal["length", "stop"] | None
    """Set on the event holding the request's last token."""
    tokens: int = 1
    """Tokens in the event: emitted by one step (more than 1 with speculative decoding)."""


class RequestHandle:
    """A submitted request: its tokens arrive on :meth:`next_event`."""

    def __init__(self, spec: SequenceSpec) -> None:
        """Handle for ``spec``; created by :meth:`Engine.submit`."""
        self.spec = spec
        self.cached_tokens = 0
        """Prompt tokens served from the prefix cache (known from the first token on)."""
        self.done = False
        """True once the last token was queued, or the request ended otherwise."""
        self._queue: asyncio.Queue[TokenEvent | None] = asyncio.Queue()

    @property
    def response_id(self) -> str:
        """The request's response id."""
        return self.spec.response_id

    def ready(self) -> bool:
        """True when :meth:`next_event` would not wait."""
        return not self._queue.empty()

    async def next_event(self) -> TokenEvent | None:
        """The next token, or None when the request was aborted or the engine closed."""
        return await self._queue.get()

    def _put(self, event: TokenEvent | None) -> None:
        if event is None or event.finish_reason is not None:
            self.done = True
        self._queue.put_nowait(event)


class Engine:
    """Continuous-batching engine over :class:`StepPlanner`, in real time."""

    def __init__(
        self, config: EngineConfig, *, clock_ns: Callable[[], int] = time.monotonic_ns
    ) -> None:
        """An idle engine; :meth:`start` runs it. ``clock_ns`` must be monotonic."""
        self.config = config
        self.ground_truth = GroundTruth(config.ground_truth_limit, config.ground_truth_path)
        """Records of every step, token, prefill and finish."""
        self._clock_ns = clock_ns
        self._cache = PrefixCache(config.prefix_cache_blocks) if config.prefix_cache else None
        profile = config.profile
        self._planner: StepPlanner | DisaggregatedPlanner
        if profile.techniques.disaggregated is not None:
            self._planner = DisaggregatedPlanner(profile.cost, self._cache, profile.techniques)
            self._lanes: tuple[StepPlanner, ...] = self._planner.lanes
        else:
            self._planner = StepPlanner(profile.cost, self._cache, profile.techniques)
            self._lanes = (self._planner,)
        self._handles: dict[str, RequestHandle] = {}
        self._wakes = tuple(asyncio.Event() for _ in self._lanes)
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def profile(self) -> Profile:
        """The profile the engine runs."""
        return self.config.profile

    @property
    def num_waiting(self) -> int:
        """Requests queued, not yet admitted."""
        return self._planner.num_waiting

    @property
    def num_running(self) -> int:
        """Sequences in the batch (prefilling or decoding)."""
        return self._planner.num_running

    @property
    def num_decoding(self) -> int:
        """Sequences in the batch past their first token."""
        return self._planner.num_decoding

    async def start(self) -> None:
        """Start the step loop (idempotent)."""
        if self._closed:
            raise RuntimeError("engine: closed")
        if not self._tasks:
            self.ground_truth.open()
            loop = asyncio.get_running_loop()
            # Strong references live in self._tasks until close().
            self._tasks = [
                loop.create_task(self._run(lane, wake), name=f"sim-engine-{i}")
                for i, (lane, wake) in enumerate(zip(self._lanes, self._wakes, strict=True))
            ]

    async def close(self) -> None:
        """Stop the loop; pending requests get None (idempotent)."""
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_all()
        self.ground_truth.close()

    def submit(
        self,
        response_id: str,
        *,
        prompt_tokens: int,
        output_tokens: int,
        finish_reason: Literal["length", "stop"],
        x_request_id: str | None = None,
        block_hashes: tuple[bytes, ...] = (),
        reasoning_tokens: int = 0,
        choices: int = 1,
    ) -> RequestHandle:
        """Queue a request (FIFO); its handle yields its tokens as steps emit them.

        ``reasoning_tokens``: the first tokens of each choice are reasoning (recorded in
        the ground truth); ``choices``: ``n``, decoded side by side.
        """
        if self._closed or not self._tasks or any(t.done() for t in self._tasks):
            raise RuntimeError("engine: not running")
        spec = SequenceSpec(
            response_id=response_id,
            x_request_id=x_request_id,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            finish_reason=finish_reason,
            arrival_ns=self._clock_ns(),
            block_hashes=block_hashes if self._cache is not None else (),
            reasoning_tokens=reasoning_tokens,
            choices=choices,
        )
        self._planner.add(spec)
        handle = RequestHandle(spec)
        self._handles[response_id] = handle
        self._wake_all()
        return handle

    def abort(self, response_id: str) -> bool:
        """Remove a request from the engine (client gone); True if it was still live."""
        record = self._planner.abort(response_id, self._clock_ns())
        handle = self._handles.pop(response_id, None)
        if handle is not None and not handle.done:
            handle._put(None)
        if record is None:
            return False
        self.ground_truth.extend((record,))
        return True

    def clear_prefix_cache(self) -> None:
        """Forget every cached prompt block."""
        if self._cache is not None:
            self._cache.clear()

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.set()

    async def _run(self, lane: StepPlanner, wake: asyncio.Event) -> None:
        ideal_end_ns: int | None = None
        try:
            while True:
                wake.clear()
                plan = lane.plan(self._clock_ns())
                if plan is None:
                    ideal_end_ns = None
                    admit_ns = lane.next_admission_ns()
                    if admit_ns is None:
                        await wake.wait()
                    else:  # static batching: the batch fills until then
                        with contextlib.suppress(TimeoutError):
                            delay_s = max(0, admit_ns - self._clock_ns()) / 1e9
                            await asyncio.wait_for(wake.wait(), delay_s)
                    continue
                start_ns = self._clock_ns()
                duration_ns = round(plan.duration_s * 1e9)
                ideal_start_ns = start_ns
                if ideal_end_ns is not None and start_ns - ideal_end_ns <= MAX_CATCH_UP_NS:
                    ideal_start_ns = ideal_end_ns
                target_ns = ideal_start_ns + duration_ns
                # Always yield once, so handlers write even when the engine runs late.
                await asyncio.sleep(max(0, target_ns - self._clock_ns()) / 1e9)
                end_ns = self._clock_ns()
                self._deliver(lane.commit(plan, start_ns, end_ns))
                # A handoff, or room made in the batch, may give another lane work.
                self._wake_all()
                ideal_end_ns = target_ns
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("simulator engine loop failed")
            raise
        finally:
            self._fail_all()

    def _deliver(self, result: StepResult) -> None:
        finish_reasons = {f.response_id: f.finish_reason for f in result.finishes}
        for prefill in result.prefills:
            handle = self._handles.get(prefill.response_id)
            if handle is not None:
                handle.cached_tokens = prefill.cached_tokens
        events: dict[str, TokenEvent] = {}  # a request's tokens of one step: one event
        for token in result.tokens:
            if token.choice:
                continue  # every choice emits what choice 0 does
            first = events.get(token.response_id)
            if first is None:
                events[token.response_id] = TokenEvent(token.index, token.emit_ns, None)
            else:
                events[token.response_id] = replace(first, tokens=first.tokens + 1)
        for response_id, event in events.items():
            handle = self._handles.get(response_id)
            if handle is None:
                continue
            reason = finish_reasons.get(response_id)
            handle._put(replace(event, finish_reason=reason if reason != "abort" else None))
        for finish in result.finishes:
            self._handles.pop(finish.response_id, None)
        self.ground_truth.extend((result.step, *result.prefills, *result.tokens, *result.finishes))

    def _fail_all(self) -> None:
        handles, self._handles = self._handles, {}
        for handle in handles.values():
            if not handle.done:
                handle._put(None)
