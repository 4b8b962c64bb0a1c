"""The step cost model of the simulated accelerator, and predictions derived from it.

Pure: no asyncio, no clock. One engine step decodes one token for every running
sequence and may carry prefill work (like vLLM V1, prefill and decode share a
batch). Its duration is::

    step_s(b, p) = decode_base_s + decode_per_seq_s * b + prefill_s_per_token * p

for any non-empty step (``b`` decoding sequences, ``p`` prompt tokens computed);
a step that only prefills (``b == 0``) still pays ``decode_base_s`` once, the
fixed cost of a forward pass. An empty step costs nothing.

The ``predict_*`` helpers answer, from the model alone, what the engine will do
in the seed's scenarios; tests check the engine's planner against them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CostModel:
    """Step durations of one simulated accelerator. Validated on construction."""

    decode_base_s: float
    """Fixed cost of a forward pass (s): what a decode step costs apart from its sequences."""
    decode_per_seq_s: float
    """Extra decode cost per sequence in the batch (s)."""
    prefill_s_per_token: float
    """Prefill cost per prompt token computed (s); its inverse is the prefill throughput."""
    chunk_size: int | None = None
    """Prompt tokens per step (chunked prefill), or None: a whole prompt in one step."""
    max_num_seqs: int = 256
    """Most sequences running at once (prefilling or decoding)."""

    def __post_init__(self) -> None:
        for key in ("decode_base_s", "decode_per_seq_s", "prefill_s_per_token"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key}: expected a number of seconds, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{key}: expected a finite number >= 0, got {value!r}")
        if self.chunk_size is not None and not _positive_int(self.chunk_size):
            raise ValueError(
                f"chunk_size: expected an integer >= 1 or None, got {self.chunk_size!r}"
            )
        if not _positive_int(self.max_num_seqs):
            raise ValueError(f"max_num_seqs: expected an integer >= 1, got {self.max_num_seqs!r}")

    def decode_s(self, decode_batch: int) -> float:
        """Duration (s) of a pure decode step of ``decode_batch`` >= 1 sequences."""
        return self.step_s(decode_batch, 0)

    def step_s(self, decode_batch: int, prefill_tokens: int) -> float:
        """Duration (s) of one step decoding ``decode_batch`` sequences and prefilling tokens.

        0 for an empty step; ``decode_base_s`` is paid once by any non-empty step.
        """
        if decode_batch < 0 or prefill_tokens < 0:
            raise ValueError(f"step_s: negative work ({decode_batch=}, {prefill_tokens=})")
        if decode_batch == 0 and prefill_tokens == 0:
            return 0.0
        decode = self.decode_per_seq_s * decode_batch
        return self.decode_base_s + decode + self.prefill_s_per_token * prefill_tokens

    def prefill_pieces(self, prompt_tokens: int) -> tuple[int, ...]:
        """How a prompt of ``prompt_tokens`` (to compute) is split over steps when alone."""
        if prompt_tokens <= 0:
            return ()
        if self.chunk_size is None:
            return (prompt_tokens,)
        full, rest = divmod(prompt_tokens, self.chunk_size)
        return (self.chunk_size,) * full + ((rest,) if rest else ())


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def seed_cost_model(chunk_size: int | None = None) -> CostModel:
    """The seed text's accelerator: decode(1) 22 ms, decode(40) 25 ms, 4,000 tokens in 143 ms."""
    per_seq_s = 0.003 / 39
    return CostModel(
        decode_base_s=0.022 - per_seq_s,
        decode_per_seq_s=per_seq_s,
        prefill_s_per_token=0.143 / 4000,
        chunk_size=chunk_size,
        max_num_seqs=256,
    )


@dataclass(frozen=True, slots=True)
class StutterPrediction:
    """What one long prompt does to ``n_streams`` streams already decoding (the seed's table)."""

    steady_gap_s: float
    """Gap between two tokens of an existing stream with no prefill going on: decode(n)."""
    worst_gap_s: float
    """Largest gap of an existing stream while the new prompt is prefilled (longest step)."""
    prefill_steps: int
    """Steps that carry a piece of the new prompt (1 unchunked)."""
    prefill_window_s: float
    """From the start of the first step carrying the prompt to the end of the last one."""
    tokens_during_prefill: int
    """Tokens one existing stream emits in the window (start, end]: one per prefill step."""
    token_rate_during_prefill_per_s: float
    """``tokens_during_prefill / prefill_window_s``: an existing stream's output rate meanwhile."""
    ttft_s: float
    """New request's time to first token, counted from its arrival at a step boundary.

    Convention: the request reaches the engine exactly when a step ends and is
    admitted into the very next step (no queueing), so TTFT equals the prefill
    window. Arriving at a random point of a running step adds the rest of that
    step: up to ``steady_gap_s`` more.
    """


def predict_seed_stutter(
    cost: CostModel, n_streams: int = 40, prompt_tokens: int = 4000
) -> StutterPrediction:
    """Predict the seed's scenario: ``n_streams`` decoding, one ``prompt_tokens`` prompt arrives.

    The prompt is alone in the waiting queue and the batch has room for it. Every
    step that carries a prefill piece also decodes all ``n_streams`` existing
    sequences (the new one only starts decoding after its first token), so the
    unchunked worst gap is decode(n) + prefill, not prefill alone as in the seed.
    """
    if n_streams < 1 or prompt_tokens < 1:
        raise ValueError("predict_seed_stutter: n_streams and prompt_tokens must be >= 1")
    steady_s = cost.decode_s(n_streams)
    steps_s = [cost.step_s(n_streams, piece) for piece in cost.prefill_pieces(prompt_tokens)]
    window_s = sum(steps_s)
    return StutterPrediction(
        steady_gap_s=steady_s,
        worst_gap_s=max(steps_s),
        prefill_steps=len(steps_s),
        prefill_window_s=window_s,
        tokens_during_prefill=len(steps_s),
        token_rate_during_prefill_per_s=len(steps_s) / window_s,
        ttft_s=window_s,
    )


@dataclass(frozen=True, slots=True)
class SinglePrediction:
    """Latency of one request served alone (nothing else running or waiting)."""

    ttft_s: float
    """Arrival (on an idle engine) to first token: the steps of its prefill."""
    tpot_s: float
    """Time per output token after the first: decode(1)."""
    e2e_s: float
    """Arrival to last token: ``ttft_s + (output_tokens - 1) * tpot_s``."""


def predict_single(
    cost: CostModel, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0
) -> SinglePrediction:
    """Predict TTFT, TPOT and E2E of one request alone; ``cached_tokens`` are not prefilled."""
    if prompt_tokens < 1 or output_tokens < 1 or not 0 <= cached_tokens < prompt_tokens:
        raise ValueError(
            "predict_single: need prompt_tokens >= 1, output_tokens >= 1, "
            "0 <= cached_tokens < prompt_tokens"
        )
    pieces = cost.prefill_pieces(prompt_tokens - cached_tokens)
    ttft_s = sum(cost.step_s(0, piece) for piece in pieces)
    tpot_s = cost.decode_s(1)
    return SinglePrediction(
        ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=ttft_s + (output_tokens - 1) * tpot_s
    )


def prompt_tokens_for_ttft(cost: CostModel, ttft_s: float) -> int:
    """Longest prompt (tokens) whose TTFT alone on an idle engine is at most ``ttft_s``.

    Raises ValueError when not even a one-token prompt fits.
    """
    if predict_single(cost, 1, 1).ttft_s > ttft_s:
        raise ValueError(f"prompt_tokens_for_ttft: {ttft_s} s is below a one-token prefill")
    if cost.prefill_s_per_token == 0:
        raise ValueError("prompt_tokens_for_ttft: prefill is free, any prompt fits")
    # TTFT grows with the prompt; bisect between a fitting and a non-fitting length.
    low, high = 1, math.ceil(ttft_s / cost.prefill_s_per_token) + 1
    while high - low > 1:
        mid = (low + high) // 2
        if predict_single(cost, mid, 1).ttft_s <= ttft_s:
            low = mid
        else:
            high = mid
    return low
