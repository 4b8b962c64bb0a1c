"""The tests' own client: raw bytes, a monotonic stamp per read, output events found.

It measures what a user would see, on the same clock the proxy stamps with
(``time.monotonic_ns``, system-wide), so the proxy's numbers and the client's
can be compared event by event. Each read is stamped as it returns, before
anything else is done with it; every event completed by that read shares the
stamp (the proxy does the same).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from tests.realbackend.modelgen import WordSource


@dataclass
class Capture:
    """What one client saw of one request."""

    request_id: str
    """The ``X-Request-Id`` it sent."""
    sent_ns: int = 0
    """When the request's last body byte was handed to the socket (what the proxy's
    arrival ``t0`` corresponds to: its head and body read)."""
    start_ns: int = 0
    """Just before the client started the request (connection setup included)."""
    status: int = 0
    """Response status."""
    headers: dict[str, str] = field(default_factory=dict)
    """Response headers."""
    body: bytearray = field(default_factory=bytearray)
    """Every body byte, in order."""
    reads: list[tuple[int, int]] = field(default_factory=list)
    """``(stamp_ns, bytes)`` per read."""
    output_ns: list[int] = field(default_factory=list)
    """Stamp of each output event (non-empty content or text): when its last bytes
    arrived at the client's socket (kernel stamp, ``rawclient``), else when read."""
    seen_ns: list[int] = field(default_factory=list)
    """When the client's code got each output event (its read returned); ``rawclient``
    only. At or after ``output_ns``: the difference is the client's own wake-up."""
    output_text: list[str] = field(default_factory=list)
    """The text of each output event."""
    events: list[bytes] = field(default_factory=list)
    """Every SSE event's data field, in order."""
    error: str = ""
    """Why the body ended early (empty when it ended cleanly)."""
    end_ns: int = 0
    """When the body ended."""

    @property
    def ttft_s(self) -> float:
        """Client-side time to first token."""
        return (self.output_ns[0] - self.sent_ns) / 1e9

    @property
    def gaps_s(self) -> list[float]:
        """Client-side gaps between consecutive output events."""
        o = self.output_ns
        return [(b - a) / 1e9 for a, b in itertools.pairwise(o)]

    @classmethod
    def from_dump(cls, data: dict[str, Any]) -> Capture:
        """Back from ``loadclient``'s JSON (event bytes are not carried over)."""
        cap = cls(data["request_id"])
        cap.sent_ns, cap.start_ns = data["sent_ns"], data["start_ns"]
        cap.status, cap.headers = data["status"], data["headers"]
        cap.body = bytearray(data["body"].encode())
        cap.reads = [(a, b) for a, b in data["reads"]]
        cap.output_ns, cap.output_text = data["output_ns"], data["output_text"]
        cap.seen_ns = data.get("seen_ns", [])
        cap.error, cap.end_ns = data["error"], data["end_ns"]
        return cap

    def json_events(self) -> list[dict[str, Any]]:
        """The JSON chunks (``[DONE]`` and non-JSON events left out)."""
        out = []
        for data in self.events:
            try:
                obj = json.loads(data)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out


def output_text(chunk: dict[str, Any]) -> str:
    """The generated text a chat or completions chunk carries ('' when none)."""
    parts = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        parts.append(delta.get("content") or delta.get("reasoning_content") or "")
        parts.append(choice.get("text") or "")
    return "".join(parts)


class _EventSplitter:
    """Complete SSE events out of a byte stream (``\\n\\n`` / ``\\r\\n\\r\\n`` framed)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data.replace(b"\r\n", b"\n")
        *done, self._buf = self._buf.split(b"\n\n")
        out = []
        for block in done:
            lines = [
                ln[5:].removeprefix(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")
            ]
            if lines:
                out.append(b"\n".join(lines))
        return out


async def _on_chunk_sent(
    session: aiohttp.ClientSession,
    ctx: SimpleNamespace,
    params: aiohttp.TraceRequestChunkSentParams,
) -> None:
    cap = ctx.trace_request_ctx["capture"] if ctx.trace_request_ctx else None
    if cap is not None:
        cap.sent_ns = time.monotonic_ns()


def session(**kwargs: Any) -> aiohttp.ClientSession:
    """A client session that stamps when each request's body has gone out (``sent_ns``)."""
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_on_chunk_sent)
    return aiohttp.ClientSession(trace_configs=[trace], **kwargs)


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    request_id: str,
    *,
    path: str = "/v1/chat/completions",
    live: list[Capture] | None = None,
) -> Capture:
    """POST ``body`` and read the whole response, stamping every read.

    Use a ``session()`` so ``sent_ns`` is taken when the body went out; with any
    other session it is the start of the request.

    ``live``, when given, gets the capture at once, so progress can be watched.
    """
    cap = Capture(request_id)
    if live is not None:
        live.append(cap)
    splitter = _EventSplitter()
    raw = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
    cap.start_ns = time.monotonic_ns()
    ctx = {"capture": cap}
    async with session.post(url + path, data=raw, headers=headers, trace_request_ctx=ctx) as resp:
        if not cap.sent_ns:
            cap.sent_ns = cap.start_ns
        cap.status = resp.status
        cap.headers = dict(resp.headers)
        try:
            while True:
                chunk = await resp.content.readany()
                now_ns = time.monotonic_ns()
                if not chunk:
                    break
                cap.reads.append((now_ns, len(chunk)))
                cap.body += chunk
                for data in splitter.feed(chunk):
                    cap.events.append(data)
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        continue
                    text = output_text(obj) if isinstance(obj, dict) else ""
                    if text:
                        cap.output_ns.append(now_ns)
                        cap.output_text.append(text)
        except aiohttp.ClientPayloadError as exc:
            cap.error = type(exc).__name__
        cap.end_ns = time.monotonic_ns()
    return cap


_PROMPT_NONCE = itertools.count()


class Prompts:
    """Random prompts of a given size in the test model's tokens, new on every run.

    Both servers cache prompt prefixes, and a server can outlive one attempt of
    a test (session fixtures; pytest retries a failed test): a prompt seen
    before would be a cache hit, its prefill almost free, and a stall test
    would find no stall. So ``seed`` only names the stream; every instance
    also draws on a fresh nonce.
    """

    def __init__(self, tokenizer_json: Path, seed: str) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_json))
        self._words = WordSource(f"{seed}-{time.time_ns()}-{next(_PROMPT_NONCE)}")

    def text(self, tokens: int) -> str:
        """A fresh random text of about ``tokens`` tokens (BPE may merge one or two)."""
        words = self._words.text(tokens // 2 + 8)
        ids = self._tok.encode(words).ids
        while len(ids) < tokens:
            words += " " + self._words.text(tokens // 2 + 8)
            ids = self._tok.encode(words).ids
        return str(self._tok.decode(ids[:tokens]))

    def count(self, text: str) -> int:
        """Tokens of ``text``."""
        return len(self._tok.encode(text).ids)


def chat(content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A greedy streamed chat request body."""
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 7,
        "stream": True,
        **extra,
    }
