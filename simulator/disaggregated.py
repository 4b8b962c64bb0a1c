"""Disaggregated serving: a prefill pool and a decode pool behind one endpoint (pure).

Two :class:`~simulator.planner.StepPlanner` run on their own timelines, each
stepped by its own loop of the engine (or by a test's fake clock). Requests
queue at the prefill pool, whose steps compute prompts and decode nothing; a
step that completes a prompt also sends its KV to the decode pool (the
technique's ``kv_transfer_s_per_token`` per prompt token, inside the step) and
emits the first token with it. The sequence then joins the decode pool's next
step; decode steps never carry prefill, so no prompt ever stalls a stream.

Both pools use the same cost model (one kind of accelerator); the KV budget,
if any, bounds the decode pool, where the caches live while sequences decode.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.cost import CostModel
from simulator.planner import StepPlanner
from simulator.records import FinishRecord
from simulator.steps import Phase, SequenceSpec
from simulator.techniques import Techniques
from simulator.tokens import PrefixCache


class DisaggregatedPlanner:
    """A prefill pool handing prefilled sequences to a decode pool."""

    def __init__(
        self,
        cost: CostModel,
        prefix_cache: PrefixCache | None,
        techniques: Techniques,
    ) -> None:
        """Both pools empty; ``techniques.disaggregated`` must be set."""
        if techniques.disaggregated is None:
            raise ValueError("DisaggregatedPlanner: techniques.disaggregated is not set")
        self.decode = StepPlanner(cost, None, techniques, pool="decode")
        """The decode pool: decodes handed-over sequences, never prefills."""
        # The prefill pool holds a sequence only until its first token: no KV budget there.
        prefill_techniques = replace(techniques, kv_budget=None, speculative=None)
        self.prefill = StepPlanner(
            cost,
            prefix_cache,
            prefill_techniques,
            pool="prefill",
            hand_off=self.decode.add_prefilled,
        )
        """The prefill pool: computes prompts, emits first tokens, decodes nothing."""

    @property
    def lanes(self) -> tuple[StepPlanner, StepPlanner]:
        """The two pools, each stepped on its own timeline: prefill, then decode."""
        return (self.prefill, self.decode)

    @property
    def cost(self) -> CostModel:
        """The cost model of both pools."""
        return self.decode.cost

    @property
    def num_waiting(self) -> int:
        """Requests queued at either pool."""
        return self.prefill.num_waiting + self.decode.num_waiting

    @property
    def num_running(self) -> int:
        """Sequences prefilling or decoding, both pools."""
        return self.prefill.num_running + self.decode.num_running

    @property
    def num_decoding(self) -> int:
        """Sequences in the decode pool's batch."""
        return self.decode.num_decoding

    def add(self, spec: SequenceSpec) -> None:
        """Queue a request at the prefill pool."""
        if self.decode.phase(spec.response_id) is not None:
            raise ValueError(f"{spec.response_id}: duplicate response id")
        self.prefill.add(spec)

    def phase(self, response_id: str) -> Phase | None:
        """Phase of a live request in either pool."""
        return self.prefill.phase(response_id) or self.decode.phase(response_id)

    def cached_tokens(self, response_id: str) -> int:
        """Cached prompt tokens of a running request."""
        return self.prefill.cached_tokens(response_id) or self.decode.cached_tokens(response_id)

    def abort(self, response_id: str, now_ns: int) -> FinishRecord | None:
        """Drop a request from whichever pool holds it."""
        return self.prefill.abort(response_id, now_ns) or self.decode.abort(response_id, now_ns)
