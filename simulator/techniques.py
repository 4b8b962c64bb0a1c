"""The seed's optimisations as the simulator models them, each with its cost stated.

Pure: no asyncio, no clock. A :class:`Techniques` value travels in the profile
(``simulator/profiles/*.json`` keys ``speculative``, ``kv_budget``,
``static_batching``, ``disaggregated``); every technique is off by default, and
with all of them off the engine behaves exactly as plain continuous batching.
Prefix reuse is not here: it is an engine switch (``--prefix-cache``) over
:class:`simulator.tokens.PrefixCache`.

- Speculative decoding: each step, a draft proposes ``draft_tokens`` tokens per
  decoding sequence and the one forward pass checks them; each drafted token is
  accepted with probability ``acceptance_rate`` as long as the ones before it
  were, so a sequence emits ``1 + accepted`` tokens per step, in one event. The
  step costs ``draft_tokens x draft_s_per_token`` (the draft's passes) plus
  ``decode_batch x draft_tokens x verify_s_per_token`` (the extra positions the
  check reads) more than a plain one. Draws come from ``random.Random(seed)``.
- KV-cache budget: every running sequence holds an attention cache of
  ``tokens_per_seq`` tokens, allocated on admission (its context window); at
  most ``capacity_tokens // tokens_per_seq`` sequences run, the rest queue. A
  smaller cache per sequence fits more of them.
- Static batching: a batch is formed from the requests waiting when the engine
  is idle (after waiting up to ``fill_s`` from the first one for more to
  arrive), all its prompts are prefilled in one step, and no request joins
  until every member is done.
- Disaggregated prefill and decode: prompts are computed on a prefill pool of
  their own, whose step carries no decoding; the prompt's KV is then sent to the
  decode pool (``kv_transfer_s_per_token x prompt_tokens``, during which the
  prefill pool starts nothing new), the first token with it. Decode steps never
  carry prefill.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Speculative:
    """Draft-and-verify decoding: a draft length, an acceptance rate and their cost."""

    draft_tokens: int = 4
    """Tokens drafted per sequence per step (k)."""
    acceptance_rate: float = 0.7
    """Probability a drafted token is accepted, given the ones before it were."""
    draft_s_per_token: float = 0.0005
    """Cost (s) of drafting one token for the whole batch (one pass of a small draft model)."""
    verify_s_per_token: float = 0.00001
    """Extra cost (s) of checking one drafted token of one sequence in the target's pass."""
    seed: int = 0
    """Seed of the acceptance draws (the same seed and requests give the same tokens)."""

    def __post_init__(self) -> None:
        _require_int(self, "draft_tokens", 1)
        _require_int(self, "seed", 0)
        if not _number(self.acceptance_rate) or not 0 <= self.acceptance_rate <= 1:
            raise ValueError(
                f"speculative.acceptance_rate: expected 0..1, got {self.acceptance_rate!r}"
            )
        for key in ("draft_s_per_token", "verify_s_per_token"):
            value = getattr(self, key)
            if not _number(value) or value < 0:
                raise ValueError(f"speculative.{key}: expected seconds >= 0, got {value!r}")

    def extra_s(self, decode_batch: int) -> float:
        """What drafting and checking add (s) to a step decoding ``decode_batch`` sequences."""
        if decode_batch == 0:
            return 0.0
        k = self.draft_tokens
        return k * self.draft_s_per_token + decode_batch * k * self.verify_s_per_token

    def accepted(self, rng: random.Random) -> int:
        """Drafted tokens one sequence accepts in one step: leading successes, 0..k."""
        n = 0
        while n < self.draft_tokens and rng.random() < self.acceptance_rate:
            n += 1
        return n

    def expected_tokens_per_step(self) -> float:
        """Mean tokens a sequence emits per step: ``sum(a^i, i = 0..k)``."""
        a, k = self.acceptance_rate, self.draft_tokens
        return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


@dataclass(frozen=True, slots=True)
class KvBudget:
    """An accelerator's KV-cache memory, in tokens, and the cache each sequence holds."""

    capacity_tokens: int
    """KV-cache memory (tokens of cache, at the model's size per token)."""
    tokens_per_seq: int
    """Cache one running sequence holds (its attention window), allocated on admission."""

    def __post_init__(self) -> None:
        _require_int(self, "capacity_tokens", 1)
        _require_int(self, "tokens_per_seq", 1)
        if self.tokens_per_seq > self.capacity_tokens:
            raise ValueError(
                f"kv_budget.tokens_per_seq: {self.tokens_per_seq} does not fit in "
                f"capacity_tokens {self.capacity_tokens}"
            )

    @property
    def max_seqs(self) -> int:
        """Most sequences whose caches fit at once."""
        return self.capacity_tokens // self.tokens_per_seq


@dataclass(frozen=True, slots=True)
class StaticBatching:
    """Batch-at-a-time serving, the contrast to continuous batching."""

    fill_s: float = 0.2
    """How long (s) an idle engine waits, from the first request, for a batch to fill."""

    def __post_init__(self) -> None:
        if not _number(self.fill_s) or self.fill_s < 0:
            raise ValueError(f"static_batching.fill_s: expected seconds >= 0, got {self.fill_s!r}")


@dataclass(frozen=True, slots=True)
class Disaggregated:
    """Separate prefill and decode pools behind one endpoint, joined by a KV transfer."""

    kv_transfer_s_per_token: float = 5e-6
    """Transfer time (s) per prompt token's KV: 128 KiB per token over 25 GB/s."""

    def __post_init__(self) -> None:
        value = self.kv_transfer_s_per_token
        if not _number(value) or value < 0:
            raise ValueError(
                f"disaggregated.kv_transfer_s_per_token: expected seconds >= 0, got {value!r}"
            )

    def transfer_s(self, prompt_tokens: int) -> float:
        """Time (s) to send a prompt's KV from the prefill pool to the decode pool."""
        return self.kv_transfer_s_per_token * prompt_tokens


@dataclass(frozen=True, slots=True)
class Techniques:
    """Which of the seed's techniques the engine runs (all off by default)."""

    speculative: Speculative | None = None
    """Speculative decoding, or None."""
    kv_budget: KvBudget | None = None
    """A bounded KV cache, or None (unbounded: only ``max_num_seqs`` limits the batch)."""
    static_batching: StaticBatching | None = None
    """Static batching instead of continuous batching, or None."""
    disaggregated: Disaggregated | None = None
    """Prefill and decode on separate pools, or None (one accelerator does both)."""

    def __post_init__(self) -> None:
        if self.static_batching is not None and self.disaggregated is not None:
            raise ValueError("static_batching and disaggregated: choose one scheduler")

    def to_mapping(self) -> dict[str, object]:
        """The profile-JSON form (the keys :func:`techniques_from_mapping` reads)."""
        out: dict[str, object] = {}
        for key in _KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = {name: getattr(value, name) for name in value.__dataclass_fields__}
        return out


_KEYS = ("speculative", "kv_budget", "static_batching", "disaggregated")
TECHNIQUE_KEYS = frozenset(_KEYS)
"""Profile keys that configure a technique (each an object, or null for off)."""

_CLASSES: dict[str, type[Speculative | KvBudget | StaticBatching | Disaggregated]] = {
    "speculative": Speculative,
    "kv_budget": KvBudget,
    "static_batching": StaticBatching,
    "disaggregated": Disaggregated,
}


def techniques_from_mapping(data: Mapping[str, object]) -> Techniques:
    """The techniques named in a profile object; ValueError names the bad key."""
    parts: dict[str, object] = {}
    for key in _KEYS:
        value = data.get(key)
        if value is None or value is False:
            continue
        if value is True:
            value = {}
        if not isinstance(value, Mapping):
            raise ValueError(f"{key}: expected an object, true or null, got {value!r}")
        cls = _CLASSES[key]
        known = set(cls.__dataclass_fields__)
        for name in value:
            if name not in known:
                raise ValueError(f"{key}.{name}: unknown key (known: {', '.join(sorted(known))})")
        try:
            parts[key] = cls(**value)
        except TypeError as exc:
            raise ValueError(f"{key}: {exc}") from exc
    return Techniques(**parts)  # type: ignore[arg-type]  # each built from its own class


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _require_int(obj: object, key: str, minimum: int) -> None:
    value = getattr(obj, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = {Speculative: "speculative", KvBudget: "kv_budget"}.get(type(obj), "technique")
        raise ValueError(f"{kind}.{key}: expected an integer >= {minimum}, got {value!r}")
