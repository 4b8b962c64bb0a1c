"""Scripted upstream streams of every supported format, written from each vendor's documentation.

Each ``Scripted`` is what a backend sends for one request: the route, the
request body, the response content type and the bytes as the upstream writes
them, ``(delay before, bytes)`` pairs (the shape of ``tests.conftest.Script``
parts, so a functional test can replay them through the real proxy). ``expect``
holds what the proxy must make of it, computed by hand: with arrival at 0 and
each part stamped at the sum of the delays so far, TTFT, gaps and TPOT are
exact. Event payloads follow the documented examples (field names, order,
``data:`` spacing, keep-alives); ids and numbers are made up.

Sources: Anthropic "Streaming Messages"; OpenAI "Streaming API responses" and
the Responses streaming events reference; Ollama docs/api.md ("Generate a
completion", "Generate a chat completion", "Errors", "Streaming"); TGI's
``StreamResponse`` schema and router; llama.cpp ``tools/server/README.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MS = 0.001


@dataclass(frozen=True)
class Expect:
    """What the proxy must read from a scripted stream (arrival at 0)."""

    output_events: int
    ttft_s: float | None
    gaps_s: tuple[float, ...]
    tpot_s: float | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()
    response_model: str = ""
    response_id: str = ""
    error: str = ""
    status: str = ""
    done: bool = True
    """The format's terminal event was seen."""
    backend_prefill_s: float | None = None
    queue_time_s: float | None = None
    decoder_errors: int = 0


@dataclass(frozen=True)
class Scripted:
    """One upstream answer: request, response framing, bytes with their delays, expectations."""

    name: str
    path: str
    request: dict[str, Any]
    content_type: str
    parts: list[tuple[float, bytes]]
    expect: Expect
    streamed: bool = True
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        """The whole response body."""
        return b"".join(p for _, p in self.parts)


def _j(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def named(event: str, obj: Any, eol: str = "\n") -> bytes:
    """One SSE event with an ``event:`` name (Anthropic, Responses)."""
    return f"event: {event}{eol}data: {_j(obj)}{eol}{eol}".encode()


def data(obj: Any, sep: str = " ") -> bytes:
    """One unnamed SSE event (``sep`` is what follows ``data:``)."""
    return f"data:{sep}{_j(obj)}\n\n".encode()


def line(obj: Any) -> bytes:
    """One NDJSON line."""
    return (_j(obj) + "\n").encode()


def timed(*parts: tuple[float, bytes]) -> list[tuple[float, bytes]]:
    """Parts given at absolute times (ms since arrival) as (delay before, bytes) pairs."""
    out, last = [], 0.0
    for at_ms, raw in parts:
        out.append(((at_ms - last) * MS, raw))
        last = at_ms
    return out


# --- Anthropic Messages ---------------------------------------------------------------


def _a_start(usage: dict[str, int], mid: str = "msg_01XFDUDYJgAACzvnptvVoYEL") -> bytes:
    msg = {"id": mid, "type": "message", "role": "assistant", "content": [],
           "model": "claude-opus-4-7", "stop_reason": None, "stop_sequence": None,
           "usage": usage}  # fmt: skip
    return named("message_start", {"type": "message_start", "message": msg})


def _a_block(index: int, block: dict[str, Any], eol: str = "\n") -> bytes:
    return named(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
        eol,
    )


def _a_delta(index: int, delta: dict[str, Any], eol: str = "\n") -> bytes:
    return named(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}, eol
    )


def _a_text(index: int, s: str) -> bytes:
    return _a_delta(index, {"type": "text_delta", "text": s})


def _a_json(index: int, s: str, eol: str = "\n") -> bytes:
    return _a_delta(index, {"type": "input_json_delta", "partial_json": s}, eol)


def _a_stop(index: int, eol: str = "\n") -> bytes:
    return named("content_block_stop", {"type": "content_block_stop", "index": index}, eol)


def _a_end(reason: str, output_tokens: int, eol: str = "\n") -> bytes:
    delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
             "usage": {"output_tokens": output_tokens}}  # fmt: skip
    return named("message_delta", delta, eol) + named("message_stop", {"type": "message_stop"}, eol)


_PING = named("ping", {"type": "ping"})

ANTHROPIC_TEXT = Scripted(
    "anthropic_text",
    "/v1/messages",
    {"model": "claude-opus-4-7", "max_tokens": 1024, "stream": True,
     "messages": [{"role": "user", "content": "Hello"}]},
    "text/event-stream; charset=utf-8",
    timed(
        (250, _a_start({"input_tokens": 25, "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 100, "output_tokens": 1})
         + _a_block(0, {"type": "text", "text": ""})),
        (260, _PING),
        (300, _a_text(0, "Hello")),
        (325, _a_text(0, "!")),
        (350, _a_text(0, " How can")),
        (375, _a_text(0, " I help?")),
        (380, _a_stop(0) + _a_end("end_turn", 12)),
    ),
    Expect(
        output_events=4, ttft_s=0.300, gaps_s=(0.025, 0.025, 0.025), tpot_s=0.075 / 11,
        prompt_tokens=125, completion_tokens=12, cached_tokens=100,
        finish_reasons=("end_turn",), response_model="claude-opus-4-7",
        response_id="msg_01XFDUDYJgAACzvnptvVoYEL",
    ),
)  # fmt: skip
"""Plain text answer: message_start with cache reads, a ping, four text deltas."""

ANTHROPIC_THINKING_TOOL = Scripted(
    "anthropic_thinking_tool",
    "/v1/messages",
    {"model": "claude-opus-4-7", "max_tokens": 2048, "stream": True,
     "thinking": {"type": "enabled", "budget_tokens": 1024},
     "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
     "messages": [{"role": "user", "content": "Weather in Paris?"}]},
    "text/event-stream",
    timed(
        (400, _a_start({"input_tokens": 50, "output_tokens": 1})
         + _a_block(0, {"type": "thinking", "thinking": ""})),
        (420, _a_delta(0, {"type": "thinking_delta", "thinking": "The user wants the weather."})),
        (440, _a_delta(0, {"type": "thinking_delta", "thinking": " I should call the tool."})),
        (450, _a_delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"})
         + _a_stop(0)),
        (460, _a_block(1, {"type": "text", "text": ""}) + _a_text(1, "")),
        (480, _a_text(1, "Let me check.")),
        (490, _a_stop(1)
         + _a_block(2, {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}})
         + _a_json(2, "")),
        (510, _a_json(2, '{"location":')),
        (530, _a_json(2, ' "Paris"}')),
        (540, _a_stop(2) + _a_end("tool_use", 40)),
    ),
    Expect(
        output_events=5, ttft_s=0.420, gaps_s=(0.020, 0.040, 0.030, 0.020), tpot_s=0.110 / 39,
        prompt_tokens=50, completion_tokens=40, cached_tokens=None,
        finish_reasons=("tool_use",), response_model="claude-opus-4-7",
        response_id="msg_01XFDUDYJgAACzvnptvVoYEL",
    ),
)  # fmt: skip
"""Thinking before text, a signature, empty text and JSON deltas, then a tool call."""

ANTHROPIC_TOOL_ONLY_CRLF = Scripted(
    "anthropic_tool_only_crlf",
    "/v1/messages",
    {"model": "claude-opus-4-7", "max_tokens": 256, "stream": True,
     "tools": [{"name": "get_time", "input_schema": {"type": "object"}}],
     "tool_choice": {"type": "any"},
     "messages": [{"role": "user", "content": "Time in Oslo?"}]},
    "text/event-stream",
    timed(
        (200, _a_start({"input_tokens": 30, "cache_read_input_tokens": 0, "output_tokens": 1},
                       mid="msg_02").replace(b"\n", b"\r\n")
         + _a_block(0, {"type": "tool_use", "id": "toolu_9", "name": "get_time", "input": {}},
                    "\r\n")),
        (210, _a_json(0, "", "\r\n")),
        (300, _a_json(0, '{"city":', "\r\n")),
        (320, _a_json(0, ' "Oslo"}', "\r\n")),
        (330, _a_stop(0, "\r\n") + _a_end("tool_use", 9, "\r\n")),
    ),
    Expect(
        output_events=2, ttft_s=0.300, gaps_s=(0.020,), tpot_s=0.020 / 8,
        prompt_tokens=30, completion_tokens=9, cached_tokens=0,
        finish_reasons=("tool_use",), response_model="claude-opus-4-7", response_id="msg_02",
    ),
)  # fmt: skip
"""A tool-call-only answer (no text at all), CRLF line endings."""

ANTHROPIC_ERROR = Scripted(
    "anthropic_error_midstream",
    "/v1/messages",
    {"model": "claude-opus-4-7", "max_tokens": 64, "stream": True,
     "messages": [{"role": "user", "content": "Tell a story"}]},
    "text/event-stream",
    timed(
        (200, _a_start({"input_tokens": 10, "output_tokens": 1}, mid="msg_03")),
        (220, _a_block(0, {"type": "text", "text": ""}) + _a_text(0, "Once")),
        (240, _a_text(0, " upon")),
        (300, named("error", {"type": "error",
                              "error": {"type": "overloaded_error", "message": "Overloaded"}})),
    ),
    Expect(
        output_events=2, ttft_s=0.220, gaps_s=(0.020,), tpot_s=0.020,
        prompt_tokens=10, completion_tokens=None, response_model="claude-opus-4-7",
        response_id="msg_03", error="overloaded_error", done=False,
    ),
)  # fmt: skip
"""An error event mid-stream; message_start's placeholder output count is not taken."""


# --- OpenAI Responses -----------------------------------------------------------------


def _r(kind: str, seq: int, **fields: Any) -> bytes:
    return named(kind, {"type": kind, "sequence_number": seq, **fields})


def _r_resp(status: str, usage: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "resp_67ccd2bed1ec8190", "object": "response", "created_at": 1741476542,
            "status": status, "model": "gpt-4.1-2025-04-14", "output": [], "usage": usage,
            "error": None, "incomplete_details": None, **extra}  # fmt: skip


def _r_usage(inp: int, cached: int, out: int) -> dict[str, Any]:
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": inp + out}  # fmt: skip


def _r_text(seq: int, s: str) -> bytes:
    return _r("response.output_text.delta", seq, item_id="msg_1", output_index=0,
              content_index=0, delta=s)  # fmt: skip


_R_OPEN = _r("response.created", 0, response=_r_resp("in_progress")) + _r(
    "response.in_progress", 1, response=_r_resp("in_progress")
)
_R_ITEM = _r(
    "response.output_item.added", 2, output_index=0,
    item={"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant",
          "content": []},
) + _r(
    "response.content_part.added", 3, item_id="msg_1", output_index=0, content_index=0,
    part={"type": "output_text", "text": "", "annotations": []},
)  # fmt: skip
_R_ID = "resp_67ccd2bed1ec8190"
_R_MODEL = "gpt-4.1-2025-04-14"

RESPONSES_TEXT = Scripted(
    "responses_text",
    "/v1/responses",
    {"model": "gpt-4.1", "input": "Say hi", "stream": True},
    "text/event-stream; charset=utf-8",
    timed(
        (150, _R_OPEN),
        (160, _R_ITEM),
        (200, _r_text(4, "Hi")),
        (230, _r_text(5, " there")),
        (260, _r_text(6, "")),
        (290, _r_text(7, "!")),
        (300, _r("response.output_text.done", 8, item_id="msg_1", output_index=0,
                 content_index=0, text="Hi there!")
         + _r("response.completed", 9,
              response=_r_resp("completed", _r_usage(36, 16, 3)))),
    ),
    Expect(
        output_events=3, ttft_s=0.200, gaps_s=(0.030, 0.060), tpot_s=0.045,
        prompt_tokens=36, completion_tokens=3, cached_tokens=16,
        response_model=_R_MODEL, response_id=_R_ID, status="completed",
    ),
)  # fmt: skip
"""Text deltas (one empty), then response.completed with usage and cached tokens."""

RESPONSES_REASONING_TOOL = Scripted(
    "responses_reasoning_tool",
    "/v1/responses",
    {"model": "o4-mini", "input": "Weather in Paris?", "stream": True,
     "reasoning": {"summary": "auto"}, "tools": [{"type": "function", "name": "get_weather"}]},
    "text/event-stream",
    timed(
        (100, _R_OPEN),
        (500, _r("response.reasoning_summary_text.delta", 2, item_id="rs_1", output_index=0,
                 summary_index=0, delta="Need weather")),
        (520, _r("response.reasoning_summary_text.delta", 3, item_id="rs_1", output_index=0,
                 summary_index=0, delta=" for Paris.")),
        (540, _r("response.output_item.added", 4, output_index=1,
                 item={"id": "fc_1", "type": "function_call", "status": "in_progress",
                       "arguments": "", "call_id": "call_1", "name": "get_weather"})),
        (560, _r("response.function_call_arguments.delta", 5, item_id="fc_1", output_index=1,
                 delta='{"location":')),
        (580, _r("response.function_call_arguments.delta", 6, item_id="fc_1", output_index=1,
                 delta='"Paris"}')),
        (590, _r("response.function_call_arguments.done", 7, item_id="fc_1", output_index=1,
                 arguments='{"location":"Paris"}')
         + _r("response.completed", 8, response=_r_resp("completed", _r_usage(80, 0, 25)))),
    ),
    Expect(
        output_events=4, ttft_s=0.500, gaps_s=(0.020, 0.040, 0.020), tpot_s=0.080 / 24,
        prompt_tokens=80, completion_tokens=25, cached_tokens=0,
        response_model=_R_MODEL, response_id=_R_ID, status="completed",
    ),
)  # fmt: skip
"""Reasoning summary before a function call; no text at all."""

RESPONSES_INCOMPLETE = Scripted(
    "responses_incomplete",
    "/v1/responses",
    {"model": "gpt-4.1", "input": "Write an essay", "stream": True, "max_output_tokens": 2},
    "text/event-stream",
    timed(
        (120, _R_OPEN + _R_ITEM),
        (180, _r_text(4, "The")),
        (210, _r_text(5, " essay")),
        (215, _r("response.incomplete", 6, response=_r_resp(
            "incomplete", _r_usage(20, 0, 2),
            incomplete_details={"reason": "max_output_tokens"}))),
    ),
    Expect(
        output_events=2, ttft_s=0.180, gaps_s=(0.030,), tpot_s=0.030,
        prompt_tokens=20, completion_tokens=2, cached_tokens=0,
        finish_reasons=("max_output_tokens",), response_model=_R_MODEL, response_id=_R_ID,
        status="incomplete",
    ),
)  # fmt: skip
"""Cut by max_output_tokens: a normal end whose finish reason says so."""

RESPONSES_FAILED = Scripted(
    "responses_failed",
    "/v1/responses",
    {"model": "gpt-4.1", "input": "Hi", "stream": True},
    "text/event-stream",
    timed(
        (120, _R_OPEN + _R_ITEM),
        (180, _r_text(4, "Hel")),
        (400, _r("response.failed", 5, response=_r_resp(
            "failed", None, error={"code": "server_error", "message": "The model failed."}))),
    ),
    Expect(
        output_events=1, ttft_s=0.180, gaps_s=(), tpot_s=None,
        response_model=_R_MODEL, response_id=_R_ID, error="server_error", status="failed",
    ),
)  # fmt: skip
"""response.failed after one delta: recorded as an upstream error."""

RESPONSES_ERROR_EVENT = Scripted(
    "responses_error_event",
    "/v1/responses",
    {"model": "gpt-4.1", "input": "Hi", "stream": True},
    "text/event-stream",
    timed(
        (120, _R_OPEN),
        (180, _r_text(2, "Hi")),
        (190, _r("error", 3, code="rate_limit_exceeded", message="Slow down.", param=None)),
    ),
    Expect(
        output_events=1, ttft_s=0.180, gaps_s=(), tpot_s=None,
        response_model=_R_MODEL, response_id=_R_ID, error="rate_limit_exceeded", done=False,
    ),
)  # fmt: skip
"""An ``error`` event instead of a terminal response event."""


# --- Ollama native (NDJSON) -----------------------------------------------------------


def _o_gen(s: str, **extra: Any) -> dict[str, Any]:
    return {"model": "llama3.2", "created_at": "2023-08-04T08:52:19.385406455-07:00",
            "response": s, "done": False, **extra}  # fmt: skip


_O_FINAL_GEN = line(_o_gen(
    "", done=True, done_reason="stop", context=[1, 2, 3], total_duration=400_000_000,
    load_duration=5_000_000, prompt_eval_count=26, prompt_eval_duration=200_000_000,
    eval_count=5, eval_duration=80_000_000,
))  # fmt: skip

OLLAMA_GENERATE = Scripted(
    "ollama_generate",
    "/api/generate",
    {"model": "llama3.2", "prompt": "Why is the sky blue?"},
    "application/x-ndjson",
    timed(
        (300, line(_o_gen("The"))),
        (320, line(_o_gen(" sky"))),
        (340, line(_o_gen(" is")) + line(_o_gen(" blue"))),
        (360, line(_o_gen("."))),
        (365, _O_FINAL_GEN[:40]),
        (370, _O_FINAL_GEN[40:]),
    ),
    Expect(
        output_events=5, ttft_s=0.300, gaps_s=(0.020, 0.020, 0.0, 0.020), tpot_s=0.015,
        prompt_tokens=26, completion_tokens=5, finish_reasons=("stop",),
        response_model="llama3.2", backend_prefill_s=0.200, queue_time_s=0.095,
    ),
)  # fmt: skip
"""The documented generate stream (no ``stream`` field: Ollama streams by default)."""


def _o_chat(msg: dict[str, Any], **extra: Any) -> bytes:
    return line({"model": "qwen3", "created_at": "2025-06-01T10:00:00.0Z",
                 "message": {"role": "assistant", **msg}, "done": False, **extra})  # fmt: skip


_O_MULTIBYTE = _o_chat({"content": "17 × 23 = 391"})
_O_CUT = _O_MULTIBYTE.index("×".encode()) + 1  # inside the two-byte character

OLLAMA_CHAT_THINKING_TOOLS = Scripted(
    "ollama_chat_thinking_tools",
    "/api/chat",
    {"model": "qwen3", "think": True, "stream": True,
     "messages": [{"role": "user", "content": "What is 17 × 23?"}]},
    "application/x-ndjson",
    timed(
        (250, _o_chat({"content": "", "thinking": "Let me"})),
        (270, _o_chat({"content": "", "thinking": " compute."})),
        (290, _o_chat({"content": ""})),
        (305, _O_MULTIBYTE[:_O_CUT]),
        (310, _O_MULTIBYTE[_O_CUT:]),
        (330, _o_chat({"content": "", "tool_calls": [
            {"function": {"name": "add", "arguments": {"a": 17, "b": 23}}}]})),
        (340, line({"model": "qwen3", "created_at": "2025-06-01T10:00:01.0Z",
                    "message": {"role": "assistant", "content": ""}, "done": True,
                    "done_reason": "stop", "total_duration": 200_000_000, "load_duration": 0,
                    "prompt_eval_count": 15, "prompt_eval_duration": 100_000_000,
                    "eval_count": 30, "eval_duration": 60_000_000})),
    ),
    Expect(
        output_events=4, ttft_s=0.250, gaps_s=(0.020, 0.040, 0.020), tpot_s=0.080 / 29,
        prompt_tokens=15, completion_tokens=30, finish_reasons=("stop",),
        response_model="qwen3", backend_prefill_s=0.100, queue_time_s=0.150,
    ),
)  # fmt: skip
"""Thinking before content, an empty line, a character split across reads, a tool call."""

OLLAMA_ERROR = Scripted(
    "ollama_error_midstream",
    "/api/generate",
    {"model": "llama3.2", "prompt": "Is it?"},
    "application/x-ndjson",
    timed(
        (100, line(_o_gen(" Yes"))),
        (110, line(_o_gen("."))),
        (150, line({"error": "an error was encountered while running the model"})),
    ),
    Expect(
        output_events=2, ttft_s=0.100, gaps_s=(0.010,), tpot_s=0.010,
        response_model="llama3.2", error="stream_error", done=False,
    ),
)  # fmt: skip
"""The documented mid-stream error line: free text, so the error type is generic."""

OLLAMA_NOT_STREAMED = Scripted(
    "ollama_chat_not_streamed",
    "/api/chat",
    {"model": "llama3.2", "stream": False, "messages": [{"role": "user", "content": "Hi"}]},
    "application/json; charset=utf-8",
    timed((900, json.dumps({
        "model": "llama3.2", "created_at": "2023-12-12T14:13:43.416799Z",
        "message": {"role": "assistant", "content": "Hello! How are you today?"},
        "done": True, "total_duration": 5191566416, "load_duration": 2154458,
        "prompt_eval_count": 26, "prompt_eval_duration": 383809000, "eval_count": 298,
        "eval_duration": 4799921000}).encode())),
    Expect(
        output_events=0, ttft_s=None, gaps_s=(), tpot_s=None, prompt_tokens=26,
        completion_tokens=298, response_model="llama3.2", backend_prefill_s=0.383809,
    ),
    streamed=False,
)  # fmt: skip
"""``"stream": false``: one JSON body, usage and backend timings but no token stamps."""


# --- TGI native (SSE) -----------------------------------------------------------------


def _t(index: int, tid: int, s: str, special: bool = False, **end: Any) -> bytes:
    return data({"index": index, "token": {"id": tid, "text": s, "logprob": -0.25,
                                           "special": special},
                 "generated_text": end.get("generated_text"), "details": end.get("details"),
                 "top_tokens": None}, sep="")  # fmt: skip


TGI_STREAM = Scripted(
    "tgi_generate_stream",
    "/generate_stream",
    {"inputs": "What is the answer?", "parameters": {"max_new_tokens": 20, "details": True}},
    "text/event-stream",
    timed(
        (180, _t(1, 415, "The")),
        (200, _t(2, 4372, " answer")),
        (210, b":\n\n"),
        (220, _t(3, 338, " is")),
        (240, _t(4, 3578, " 42")),
        (260, _t(5, 2, "</s>", special=True, generated_text="The answer is 42",
                 details={"finish_reason": "eos_token", "generated_tokens": 5,
                          "input_length": 7, "seed": None})),
    ),
    Expect(
        output_events=4, ttft_s=0.180, gaps_s=(0.020, 0.020, 0.020), tpot_s=0.015,
        prompt_tokens=7, completion_tokens=5, finish_reasons=("eos_token",),
    ),
)  # fmt: skip
"""Tokens, a keep-alive comment, a special end-of-sequence token with the details."""

TGI_NO_DETAILS = Scripted(
    "tgi_generate_stream_no_details",
    "/generate_stream",
    {"inputs": "Hi", "parameters": {"max_new_tokens": 3}},
    "text/event-stream",
    timed(
        (100, _t(1, 10, "Hi")),
        (130, _t(2, 11, " there")),
        (160, _t(3, 12, "!", generated_text="Hi there!")),
    ),
    Expect(output_events=3, ttft_s=0.100, gaps_s=(0.030, 0.030), tpot_s=0.030),
)  # fmt: skip
"""Without ``details``: no token counts, so TPOT counts output events."""

TGI_ERROR = Scripted(
    "tgi_error_midstream",
    "/generate_stream",
    {"inputs": "Hi", "parameters": {"max_new_tokens": 50}},
    "text/event-stream",
    timed(
        (100, _t(1, 10, "Hi")),
        (120, _t(2, 11, " the")),
        (500, data({"error": "Request failed during generation: Server error: CUDA OOM",
                    "error_type": "generation"}, sep="")),
    ),
    Expect(
        output_events=2, ttft_s=0.100, gaps_s=(0.020,), tpot_s=0.020, error="generation",
        done=False,
    ),
)  # fmt: skip
"""A generation error mid-stream (TGI's ErrorResponse as event data)."""


# --- llama.cpp native (SSE) -----------------------------------------------------------


def _l(s: str, n: int, **extra: Any) -> bytes:
    return data({"index": 0, "content": s, "tokens": [1000 + n], "stop": False, "id_slot": 0,
                 "tokens_predicted": n, "tokens_evaluated": 12, **extra})  # fmt: skip


_L_FINAL = data({
    "index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True,
    "model": "gpt-3.5-turbo", "tokens_predicted": 4, "tokens_evaluated": 12,
    "generation_settings": {"n_predict": 4, "temperature": 0.8}, "prompt": "<s>Say hello",
    "has_new_line": False, "truncated": False, "stop_type": "limit", "stopping_word": "",
    "tokens_cached": 15,
    "timings": {"cache_n": 4, "prompt_n": 8, "prompt_ms": 150.0, "prompt_per_token_ms": 18.75,
                "prompt_per_second": 53.3, "predicted_n": 4, "predicted_ms": 62.0,
                "predicted_per_token_ms": 15.5, "predicted_per_second": 64.5},
})  # fmt: skip

LLAMACPP_STREAM = Scripted(
    "llamacpp_completion",
    "/completion",
    {"prompt": "Say hello", "n_predict": 4, "stream": True, "return_progress": True},
    "text/event-stream",
    timed(
        (50, data({"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": 0,
                   "prompt_progress": {"total": 12, "cache": 4, "processed": 8,
                                       "time_ms": 150.0}})),
        (220, _l("Hello", 1)),
        (240, _l(" world", 2)),
        (260, _l(",", 3)),
        (280, _l(" friend", 4)),
        (285, _L_FINAL),
    ),
    Expect(
        output_events=4, ttft_s=0.220, gaps_s=(0.020, 0.020, 0.020), tpot_s=0.020,
        prompt_tokens=12, completion_tokens=4, cached_tokens=4, finish_reasons=("limit",),
        response_model="gpt-3.5-turbo", backend_prefill_s=0.150, queue_time_s=0.070,
    ),
)  # fmt: skip
"""Prompt progress, four tokens (running counts in each), the final event with timings;
no [DONE]. Counts come from the final event only."""

LLAMACPP_ERROR = Scripted(
    "llamacpp_error_midstream",
    "/completion",
    {"prompt": "Go", "stream": True},
    "text/event-stream",
    timed(
        (100, _l("Go", 1)),
        (125, _l("ing", 2)),
        (130, data({"error": {"code": 500, "message": "Compute error.",
                              "type": "server_error"}})),
    ),
    Expect(
        output_events=2, ttft_s=0.100, gaps_s=(0.025,), tpot_s=0.025, error="server_error",
        done=False,
    ),
)  # fmt: skip
"""A mid-stream error as servers since late 2025 send it: ``data: {"error": {...}}``."""

LLAMACPP_LEGACY_ERROR = Scripted(
    "llamacpp_legacy_error_field",
    "/completion",
    {"prompt": "Go", "stream": True},
    "text/event-stream",
    timed(
        (100, _l("Go", 1)),
        (140, b'error: {"code":400,"message":"the request exceeds the available context size",'
              b'"type":"invalid_request_error"}\n\n'),
    ),
    Expect(output_events=1, ttft_s=0.100, gaps_s=(), tpot_s=None, done=False),
)  # fmt: skip
"""Older servers' non-standard ``error:`` field: ignored by the SSE rules; the stream just
ends without its final event (``done`` stays false), so the error is not seen."""


# --- OpenAI-compatible, for comparison --------------------------------------------------


def _c(delta: dict[str, Any], reason: str | None = None) -> bytes:
    return data({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                 "model": "m", "choices": [{"index": 0, "delta": delta,
                                            "finish_reason": reason}]})  # fmt: skip


OPENAI_CHAT_NO_DONE = Scripted(
    "openai_chat_no_done",
    "/v1/chat/completions",
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
    "text/event-stream",
    timed(
        (100, _c({"role": "assistant", "content": ""})),
        (150, _c({"content": "Hi"})),
        (170, _c({"content": "!"})),
        (175, _c({}, "stop")),
    ),
    Expect(
        output_events=2, ttft_s=0.150, gaps_s=(0.020,), tpot_s=0.020, finish_reasons=("stop",),
        response_model="m", response_id="chatcmpl-1", done=False,
    ),
)  # fmt: skip
"""A ``[DONE]``-less end: everything still recorded; no error."""


ALL: tuple[Scripted, ...] = (
    ANTHROPIC_TEXT, ANTHROPIC_THINKING_TOOL, ANTHROPIC_TOOL_ONLY_CRLF, ANTHROPIC_ERROR,
    RESPONSES_TEXT, RESPONSES_REASONING_TOOL, RESPONSES_INCOMPLETE, RESPONSES_FAILED,
    RESPONSES_ERROR_EVENT,
    OLLAMA_GENERATE, OLLAMA_CHAT_THINKING_TOOLS, OLLAMA_ERROR, OLLAMA_NOT_STREAMED,
    TGI_STREAM, TGI_NO_DETAILS, TGI_ERROR,
    LLAMACPP_STREAM, LLAMACPP_ERROR, LLAMACPP_LEGACY_ERROR,
    OPENAI_CHAT_NO_DONE,
)  # fmt: skip
"""Every scripted stream."""
