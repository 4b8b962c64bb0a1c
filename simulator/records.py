"""Ground truth of the simulated engine: what happened, step by step and token by token.

Four record types (the ``type`` key of their JSON form): ``step``, ``token``,
``prefill`` and ``finish``. Times are ``time.monotonic_ns()`` of the engine's
process, which on Linux is system-wide (CLOCK_MONOTONIC), so another process on
the same machine can compare them with its own stamps. Every record of a
request carries its response id (``chatcmpl-...`` / ``cmpl-...``) and the
client's ``X-Request-Id`` header (None when absent).

:class:`GroundTruth` keeps the newest records in memory (bounded) and can also
append them as JSON lines to a file.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step: its time span and its work."""

    step: int
    """Step index, from 0 since the engine started."""
    start_ns: int
    """Monotonic time the step began (planned)."""
    end_ns: int
    """Monotonic time the step ended; its tokens are emitted at this instant."""
    duration_s: float
    """Duration the cost model gave the step (the engine's target)."""
    decode_batch: int
    """Sequences that decoded one token in this step."""
    prefill_tokens: int
    """Prompt tokens computed in this step (cached tokens excluded)."""
    prefill_response_ids: tuple[str, ...]
    """Response ids of the requests that had a prefill piece in this step."""
    prefill_x_request_ids: tuple[str | None, ...]
    """Their ``X-Request-Id`` headers, in the same order."""
    pool: Literal["mixed", "prefill", "decode"] = "mixed"
    """Which accelerator ran it: ``mixed`` (one does both), or a disaggregated pool."""
    waiting: int = 0
    """Requests queued (not admitted) while it ran: held back by the batch or KV limits."""
    running: int = 0
    """Sequences in the batch (prefilling or decoding) while it ran."""
    kv_tokens_used: int = 0
    """KV cache held by the running sequences (tokens), when a KV budget is set; else 0."""
    drafted_tokens: int = 0
    """Tokens drafted for checking (speculative decoding: draft length x decode batch)."""
    accepted_tokens: int = 0
    """Drafted tokens accepted; the step emitted ``decode_batch + accepted_tokens`` decode tokens
    (fewer when a sequence reached its length first)."""
    type: Literal["step"] = "step"
    """Record type."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One output token of one request."""

    response_id: str
    """Response id of the request (``chatcmpl-<hex>`` or ``cmpl-<hex>``)."""
    x_request_id: str | None
    """The client's ``X-Request-Id`` header, if any."""
    index: int
    """0 for the first token (end of prefill), then 1, 2, ..."""
    step: int
    """Index of the step that produced it (several tokens per step with speculative decoding)."""
    emit_ns: int
    """Monotonic time the engine handed the token to the server (= its step's ``end_ns``)."""
    choice: int = 0
    """Which choice of the request it belongs to (``n > 1``: 0 to ``n - 1``; each choice
    emits its token ``index`` in the same step)."""
    type: Literal["token"] = "token"
    """Record type."""


@dataclass(frozen=True, slots=True)
class PrefillRecord:
    """The prefill of one request, written when it completes."""

    response_id: str
    """Response id of the request."""
    x_request_id: str | None
    """The client's ``X-Request-Id`` header, if any."""
    prompt_tokens: int
    """Prompt length (tokens)."""
    cached_tokens: int
    """Prompt tokens found in the prefix cache (not computed)."""
    arrival_ns: int
    """Monotonic time the engine received the request."""
    start_ns: int
    """Start of the first step that carried a piece of its prompt."""
    end_ns: int
    """End of the step that finished it (its first token's emit time)."""
    steps: int
    """Number of steps that carried a piece of its prompt."""
    transfer_s: float = 0.0
    """KV transfer to the decode pool (s), inside the last step (disaggregated); else 0."""
    type: Literal["prefill"] = "prefill"
    """Record type."""


@dataclass(frozen=True, slots=True)
class FinishRecord:
    """The end of one request: done, or aborted (client gone)."""

    response_id: str
    """Response id of the request."""
    x_request_id: str | None
    """The client's ``X-Request-Id`` header, if any."""
    finish_reason: Literal["length", "stop", "abort"]
    """``length`` (max_tokens reached), ``stop`` (default length reached) or ``abort``."""
    output_tokens: int
    """Tokens emitted, all choices (reasoning included)."""
    arrival_ns: int
    """Monotonic time the engine received the request."""
    end_ns: int
    """Emit time of its last token, or the abort time."""
    reasoning_tokens: int = 0
    """Of ``output_tokens``, those spent reasoning (all choices): what the usage chunk
    reports as ``completion_tokens_details.reasoning_tokens``."""
    first_answer_ns: int | None = None
    """Emit time of its first answer token (the first after its reasoning; its first token
    when it did not reason); None when none was emitted (reasoning ran out its length)."""
    choices: int = 1
    """Choices decoded side by side (the request's ``n``)."""
    type: Literal["finish"] = "finish"
    """Record type."""


Record = StepRecord | TokenRecord | PrefillRecord | FinishRecord
"""Any ground-truth record."""


def record_to_dict(record: Record) -> dict[str, object]:
    """JSON-ready form of a record, ``type`` first, tuples as lists."""
    body = asdict(record)
    kind = body.pop("type")
    return {"type": kind, **{k: list(v) if isinstance(v, tuple) else v for k, v in body.items()}}


def record_to_json(record: Record) -> str:
    """One compact JSON line (no newline) for a record."""
    return json.dumps(record_to_dict(record), separators=(",", ":"))


_RECORD_TYPES: dict[str, type[Record]] = {
    "step": StepRecord,
    "token": TokenRecord,
    "prefill": PrefillRecord,
    "finish": FinishRecord,
}


def record_from_dict(data: Mapping[str, Any]) -> Record:
    """The record whose :func:`record_to_dict` form ``data`` is; ValueError if it is none."""
    kind = data.get("type")
    cls = _RECORD_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"record: unknown type {kind!r}")
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "type"
    }
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"{kind} record: {exc}") from exc


def records_from_jsonl(text: str) -> list[Record]:
    """Parse what ``GET /sim/ground_truth`` (or a ``--ground-truth`` file) holds."""
    return [record_from_dict(json.loads(line)) for line in text.splitlines() if line.strip()]


class GroundTruth:
    """Bounded in-memory list of records, optionally mirrored to a JSONL file."""

    def __init__(self, limit: int = 200_000, path: Path | None = None) -> None:
        """Keep the newest ``limit`` records; append every record to ``path`` when given."""
        if limit < 1:
            raise ValueError(f"ground_truth_limit: expected >= 1, got {limit}")
        self._records: deque[Record] = deque(maxlen=limit)
        self._path = path
        self._file: IO[str] | None = None

    def open(self) -> None:
        """Open the JSONL file (append, line-buffered writes per step); no-op without one."""
        if self._path is not None and self._file is None:
            self._file = self._path.open("a", encoding="utf-8")

    def close(self) -> None:
        """Flush and close the JSONL file."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def extend(self, records: Iterable[Record]) -> None:
        """Add records (in order); written to the file at once, flushed per call."""
        batch = list(records)
        self._records.extend(batch)
        if self._file is not None and batch:
            self._file.write("".join(record_to_json(r) + "\n" for r in batch))
            self._file.flush()

    def __iter__(self) -> Iterator[Record]:
        """Records in memory, oldest first."""
        return iter(tuple(self._records))

    def __len__(self) -> int:
        """Number of records in memory."""
        return len(self._records)

    def clear(self) -> None:
        """Drop the in-memory records (the file keeps its lines)."""
        self._records.clear()

    def to_jsonl(self, kind: str | None = None) -> str:
        """In-memory records as JSON lines, optionally only those of ``type == kind``."""
        return "".join(record_to_json(r) + "\n" for r in self if kind is None or r.type == kind)
