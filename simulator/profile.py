"""Simulator profiles: a cost model plus what the served model looks like.

Built-in profiles live in code (:data:`BUILTIN_PROFILES`); any other profile is
a flat JSON object in a file (see ``simulator/profiles/seed.json``)::

    {"name": "seed", "decode_base_s": 0.0219, "decode_per_seq_s": 7.7e-05,
     "prefill_s_per_token": 3.575e-05, "chunk_size": null, "max_num_seqs": 256,
     "output_tokens": 64, "model": "tokenstamp-sim", "max_model_len": 131072}

Only the three cost keys are required. Bad input raises ValueError naming the key.
A reasoning model thinks before it answers: ``"reasoning_tokens": 64`` makes every
chat request without its own ``sim_reasoning_tokens`` stream 64 reasoning deltas
first, in the delta field ``"reasoning_field"`` names (``reasoning``, vLLM's since
0.11.1, the default; or ``reasoning_content``: older vLLM, SGLang, llama.cpp).
The seed's techniques are optional objects (absent or null: off), each with its
cost (see :mod:`simulator.techniques`)::

    "speculative": {"draft_tokens": 4, "acceptance_rate": 0.7,
                    "draft_s_per_token": 0.0005, "verify_s_per_token": 1e-05, "seed": 0},
    "kv_budget": {"capacity_tokens": 131072, "tokens_per_seq": 2048},
    "static_batching": {"fill_s": 0.2},
    "disaggregated": {"kv_transfer_s_per_token": 5e-06}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import EllipsisType

from simulator.cost import CostModel, seed_cost_model
from simulator.techniques import TECHNIQUE_KEYS, Techniques, techniques_from_mapping

DEFAULT_MODEL = "tokenstamp-sim"
"""Model name the simulator serves unless the profile names another."""

_COST_KEYS = ("decode_base_s", "decode_per_seq_s", "prefill_s_per_token")
_KNOWN_KEYS = frozenset(
    {
        *_COST_KEYS,
        *TECHNIQUE_KEYS,
        "chunk_size",
        "max_num_seqs",
        "name",
        "output_tokens",
        "model",
        "max_model_len",
        "reasoning_tokens",
        "reasoning_field",
    }
)
REASONING_FIELDS = ("reasoning", "reasoning_content")
"""Delta and message fields a reasoning model's thinking can come in: vLLM's current
``reasoning`` (since 0.11.1; ``reasoning_content`` was removed in 0.16), and the older
``reasoning_content`` that SGLang, llama.cpp and DeepSeek's API send."""


@dataclass(frozen=True, slots=True)
class Profile:
    """A named simulator configuration: step costs and served-model defaults."""

    name: str
    """Profile name (built-in name or the JSON file's ``name``/stem)."""
    cost: CostModel
    """Step cost model, chunk size and batch limit."""
    output_tokens: int = 64
    """Output length of a request that sends no ``max_tokens`` (finish reason ``stop``)."""
    model: str = DEFAULT_MODEL
    """Model id listed by ``/v1/models`` and used when a request names none."""
    max_model_len: int = 131072
    """Largest prompt + output (tokens) a request may ask for; beyond it: HTTP 400."""
    techniques: Techniques = field(default_factory=Techniques)
    """The seed's optimisations the engine runs, with their costs (all off by default)."""
    reasoning_tokens: int = 0
    """Reasoning tokens of a chat request that does not say (``sim_reasoning_tokens``):
    0 is a model that answers at once; more makes the whole run a reasoning model."""
    reasoning_field: str = "reasoning"
    """The delta and message field reasoning comes in (one of :data:`REASONING_FIELDS`)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        if not self.model:
            raise ValueError(f"model: expected a non-empty string, got {self.model!r}")
        for key, least in (("output_tokens", 1), ("max_model_len", 1), ("reasoning_tokens", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{key}: expected an integer >= {least}, got {value!r}")
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(
                f"reasoning_field: expected one of {', '.join(REASONING_FIELDS)}, "
                f"got {self.reasoning_field!r}"
            )

    def with_overrides(
        self,
        *,
        chunk_size: int | EllipsisType | None = ...,
        max_num_seqs: int | None = None,
        output_tokens: int | None = None,
        techniques: Techniques | None = None,
        reasoning_tokens: int | None = None,
        reasoning_field: str | None = None,
    ) -> Profile:
        """This profile with some knobs replaced (``chunk_size=None`` means unchunked).

        ``chunk_size`` left at ``...`` keeps the profile's value.
        """
        cost = self.cost
        if not isinstance(chunk_size, EllipsisType):
            cost = replace(cost, chunk_size=chunk_size)
        if max_num_seqs is not None:
            cost = replace(cost, max_num_seqs=max_num_seqs)
        return replace(
            self,
            cost=cost,
            output_tokens=self.output_tokens if output_tokens is None else output_tokens,
            techniques=self.techniques if techniques is None else techniques,
            reasoning_tokens=(
                self.reasoning_tokens if reasoning_tokens is None else reasoning_tokens
            ),
            reasoning_field=self.reasoning_field if reasoning_field is None else reasoning_field,
        )


def _builtin() -> dict[str, Profile]:
    return {
        "seed": Profile("seed", seed_cost_model(None)),
        "seed-chunked": Profile("seed-chunked", seed_cost_model(512)),
        # Every cost a tenth of the seed's, for quick local runs and tests.
        "fast": Profile("fast", _scaled(seed_cost_model(None), 0.1), output_tokens=16),
    }


def _scaled(cost: CostModel, factor: float) -> CostModel:
    return replace(
        cost,
        decode_base_s=cost.decode_base_s * factor,
        decode_per_seq_s=cost.decode_per_seq_s * factor,
        prefill_s_per_token=cost.prefill_s_per_token * factor,
    )


BUILTIN_PROFILES: Mapping[str, Profile] = _builtin()
"""Profiles selectable by name: ``seed`` (unchunked), ``seed-chunked`` (512), ``fast``."""


def profile_from_mapping(data: Mapping[str, object], *, default_name: str = "custom") -> Profile:
    """Build and validate a profile from a JSON object; ValueError names the bad key."""
    if not isinstance(data, Mapping):
        raise ValueError(f"profile: expected a JSON object, got {type(data).__name__}")
    for key in data:
        if key not in _KNOWN_KEYS:
            known = ", ".join(sorted(_KNOWN_KEYS))
            raise ValueError(f"{key}: unknown profile key (known: {known})")
    for key in _COST_KEYS:
        if key not in data:
            raise ValueError(f"{key}: required profile key is missing")
        value = data[key]
        if not _is_number(value):
            raise ValueError(f"{key}: expected a number of seconds, got {value!r}")
    chunk_size = data.get("chunk_size")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)):
        raise ValueError(f"chunk_size: expected an integer or null, got {chunk_size!r}")
    for key in ("max_num_seqs", "output_tokens", "max_model_len", "reasoning_tokens"):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{key}: expected an integer, got {value!r}")
    for key in ("name", "model", "reasoning_field"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
    defaults = Profile("defaults", CostModel(0.0, 0.0, 0.0))
    cost = CostModel(
        decode_base_s=float(data["decode_base_s"]),  # type: ignore[arg-type]  # checked above
        decode_per_seq_s=float(data["decode_per_seq_s"]),  # type: ignore[arg-type]
        prefill_s_per_token=float(data["prefill_s_per_token"]),  # type: ignore[arg-type]
        chunk_size=chunk_size,
        max_num_seqs=_int_or(data, "max_num_seqs", defaults.cost.max_num_seqs),
    )
    name = data.get("name")
    model = data.get("model")
    field_name = data.get("reasoning_field")
    return Profile(
        name=name if isinstance(name, str) else default_name,
        cost=cost,
        output_tokens=_int_or(data, "output_tokens", defaults.output_tokens),
        model=model if isinstance(model, str) else defaults.model,
        max_model_len=_int_or(data, "max_model_len", defaults.max_model_len),
        techniques=techniques_from_mapping(data),
        reasoning_tokens=_int_or(data, "reasoning_tokens", defaults.reasoning_tokens),
        reasoning_field=field_name if isinstance(field_name, str) else defaults.reasoning_field,
    )


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def _int_or(data: Mapping[str, object], key: str, default: int) -> int:
    value = data.get(key)
    return value if isinstance(value, int) else default


def profile_to_mapping(profile: Profile) -> dict[str, object]:
    """The JSON object :func:`profile_from_mapping` reads back as ``profile``."""
    cost = profile.cost
    return {
        "name": profile.name,
        "decode_base_s": cost.decode_base_s,
        "decode_per_seq_s": cost.decode_per_seq_s,
        "prefill_s_per_token": cost.prefill_s_per_token,
        "chunk_size": cost.chunk_size,
        "max_num_seqs": cost.max_num_seqs,
        "output_tokens": profile.output_tokens,
        "model": profile.model,
        "max_model_len": profile.max_model_len,
        "reasoning_tokens": profile.reasoning_tokens,
        "reasoning_field": profile.reasoning_field,
        **profile.techniques.to_mapping(),
    }


def load_profile(name_or_path: str | Path) -> Profile:
    """A built-in profile by name, else a JSON profile file; ValueError names what is wrong."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"profile: {str(name_or_path)!r} is neither a built-in profile "
            f"({', '.join(BUILTIN_PROFILES)}) nor a file"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"profile: cannot read {path}: {exc}") from exc
    return profile_from_mapping(data, default_name=path.stem)
