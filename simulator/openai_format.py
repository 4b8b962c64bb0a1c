"""OpenAI-compatible request parsing and response bytes, formatted as vLLM formats them.

Pure: no aiohttp. Streams are server-sent events, one compact JSON object per
``data: ...\\n\\n`` event, ending with ``data: [DONE]\\n\\n``. Chat: a role chunk
(``delta: {"role": "assistant", "content": ""}``), then one content chunk per
token, the last with ``finish_reason`` and ``stop_reason``, then, only when
``stream_options.include_usage`` is true, a usage chunk with ``choices: []``.
Completions: no role chunk; ``choices[0].text`` per token.

Simulator extensions in the request body: ``sim_prompt_tokens`` (int, prompt
length, overriding the text's approximate length). ``max_tokens`` (or
``max_completion_tokens``) sets the output length (finish reason ``length``);
without it the profile's default length is used (finish reason ``stop``).

A reasoning model (chat only; :mod:`simulator.deltas` says what the tokens
say): ``sim_reasoning_tokens`` (int >= 0, default the profile's
``reasoning_tokens``) reasoning deltas come before the answer; ``max_tokens``
counts them, as OpenAI's and vLLM's do, so a short limit can end the stream
before any answer; without it the answer has the profile's default length
after them. ``sim_reasoning_field`` overrides the profile's delta field
(``reasoning`` or ``reasoning_content``). ``sim_tool_call`` (bool): the answer
is a call of the request's first ``tools`` function (``sim_tool`` without
one), finish reason ``tool_calls``. The usage reports the reasoning as
``completion_tokens_details.reasoning_tokens`` (only when the request reasoned).

``n`` > 1 (at most the profile's ``max_num_seqs``): that many choices decoded side
by side; each step sends one chunk per choice (its ``index``), the usage counts
all of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from simulator.deltas import DEFAULT_TOOL, OutputShape
from simulator.profile import REASONING_FIELDS, Profile
from simulator.tokens import block_hashes, count_text_tokens, fit_tokens, render_chat, text_tokens

DONE = b"data: [DONE]\n\n"
"""The stream terminator event."""


class Operation(StrEnum):
    """The two OpenAI endpoints served (values as ``gen_ai.operation.name``)."""

    CHAT = "chat"
    TEXT_COMPLETION = "text_completion"


class RequestError(ValueError):
    """A request the simulator rejects with HTTP 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        """``message`` for the client; ``param`` names the offending body key."""
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the simulator takes from a request body."""

    operation: Operation
    """Chat or text completion."""
    model: str
    """Model named by the request, else the profile's."""
    stream: bool
    """SSE response when true."""
    include_usage: bool
    """``stream_options.include_usage``: send the usage chunk."""
    prompt_tokens: int
    """Prompt length (tokens)."""
    output_tokens: int
    """Tokens to generate."""
    finish_reason: Literal["length", "stop"]
    """``length`` when ``max_tokens`` set the output length, else ``stop``."""
    block_hashes: tuple[bytes, ...]
    """Prefix-cache block hashes (empty unless asked for)."""
    reasoning_tokens: int = 0
    """Reasoning tokens before the answer, per choice (``output_tokens`` includes them)."""
    reasoning_field: str = "reasoning"
    """The delta and message field reasoning comes in."""
    tool: str | None = None
    """The answer is a call of this tool (``sim_tool_call``); None: text."""
    choices: int = 1
    """``n``: choices decoded side by side, each ``output_tokens`` long."""

    @property
    def shape(self) -> OutputShape:
        """What each choice's tokens say."""
        return OutputShape(
            self.output_tokens, self.reasoning_tokens, self.reasoning_field, self.tool
        )


def dumps(obj: object) -> str:
    """Compact JSON as vLLM (pydantic) writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def sse(obj: object) -> bytes:
    """One server-sent event carrying ``obj``."""
    return b"data: " + dumps(obj).encode() + b"\n\n"


def error_body(message: str, status: int, param: str | None = None) -> dict[str, object]:
    """OpenAI-style error object."""
    return {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": status}
    }


def _positive_int(body: dict[str, object], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{key} must be an integer >= 1, got {value!r}", key)
    return value


def _count(body: dict[str, object], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{key} must be an integer >= 0, got {value!r}", key)
    return value


def _tool_name(body: dict[str, object]) -> str:
    """The first function the request offers (``tools``), else :data:`DEFAULT_TOOL`."""
    tools = body.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        function = tools[0].get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return str(function["name"]) or DEFAULT_TOOL
    return DEFAULT_TOOL


def _reasoning(
    body: dict[str, object], operation: Operation, profile: Profile
) -> tuple[int, str, str | None]:
    """Reasoning tokens, their field and the tool called, from the extensions and profile."""
    chat = operation is Operation.CHAT
    tokens = _count(body, "sim_reasoning_tokens")
    if tokens and not chat:
        raise RequestError(
            "sim_reasoning_tokens: reasoning streams on chat only", "sim_reasoning_tokens"
        )
    if tokens is None:
        tokens = profile.reasoning_tokens if chat else 0
    field_name = body.get("sim_reasoning_field", profile.reasoning_field)
    if field_name not in REASONING_FIELDS:
        raise RequestError(
            f"sim_reasoning_field must be one of {', '.join(REASONING_FIELDS)}, got {field_name!r}",
            "sim_reasoning_field",
        )
    tool_call = body.get("sim_tool_call", False)
    if not isinstance(tool_call, bool):
        raise RequestError("sim_tool_call must be a boolean", "sim_tool_call")
    if tool_call and not chat:
        raise RequestError("sim_tool_call: tool calls stream on chat only", "sim_tool_call")
    return tokens, str(field_name), _tool_name(body) if tool_call else None


def _completion_tokens(prompt: object) -> list[str] | str:
    """A completions ``prompt`` as token ids (as strings) or text; one prompt only."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return _completion_tokens(prompt[0])
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return [str(t) for t in prompt]
    raise RequestError("prompt must be a string or a list of token ids (one prompt)", "prompt")


def parse_request(
    body: object, operation: Operation, profile: Profile, *, want_hashes: bool
) -> ParsedRequest:
    """Validate a request body; RequestError names the bad key."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if operation is Operation.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", "messages")
        source: list[str] | str = render_chat(messages)
    else:
        source = _completion_tokens(body.get("prompt"))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    include_usage = bool(options.get("include_usage")) if options else False
    choices = _positive_int(body, "n") or 1
    if choices > profile.cost.max_num_seqs:
        raise RequestError(
            f"n must be at most max_num_seqs ({profile.cost.max_num_seqs}), got {choices}", "n"
        )
    max_tokens = _positive_int(body, "max_tokens") or _positive_int(body, "max_completion_tokens")
    override = _positive_int(body, "sim_prompt_tokens")
    prompt_tokens = override or max(
        1, count_text_tokens(source) if isinstance(source, str) else len(source)
    )
    reasoning_tokens, reasoning_field, tool = _reasoning(body, operation, profile)
    output_tokens = max_tokens or reasoning_tokens + profile.output_tokens
    if prompt_tokens + output_tokens > profile.max_model_len:
        raise RequestError(
            f"This model's maximum context length is {profile.max_model_len} tokens; "
            f"the request asks for {prompt_tokens} prompt + {output_tokens} output tokens",
            "max_tokens",
        )
    hashes: tuple[bytes, ...] = ()
    if want_hashes:
        tokens = text_tokens(source) if isinstance(source, str) else source
        hashes = block_hashes(fit_tokens(tokens, prompt_tokens))
    return ParsedRequest(
        operation=operation,
        model=model or profile.model,
        stream=stream,
        include_usage=include_usage,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        finish_reason="length" if max_tokens else "stop",
        block_hashes=hashes,
        reasoning_tokens=reasoning_tokens,
        reasoning_field=reasoning_field,
        tool=tool,
        choices=choices,
    )


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    reasoning_tokens: int | None = None,
) -> dict[str, object]:
    """vLLM's usage object (field order as vLLM's ``UsageInfo``); ``reasoning_tokens``, when
    given, as OpenAI reports them (``completion_tokens_details``, after the prompt's)."""
    counts: dict[str, object] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if reasoning_tokens is not None:
        counts["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return counts


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """Builds the chunks and bodies of one response."""

    operation: Operation
    """Chat or text completion."""
    response_id: str
    """``chatcmpl-<hex>`` or ``cmpl-<hex>``."""
    created: int
    """Unix seconds at arrival."""
    model: str
    """Model id echoed in every chunk."""
    shape: OutputShape = field(default_factory=lambda: OutputShape(1))
    """What each choice's tokens say (default: text answers, no reasoning)."""

    def tool_call_id(self, choice: int) -> str:
        """The id of choice ``choice``'s tool call (``chatcmpl-tool-...`` as vLLM names them)."""
        return f"chatcmpl-tool-{self.response_id.partition('-')[2]}-{choice}"

    def _envelope(self, choices: list[object], *, final: bool) -> dict[str, object]:
        chat = self.operation is Operation.CHAT
        obj = "chat.completion" if final else "chat.completion.chunk"
        return {
            "id": self.response_id,
            "object": obj if chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def role_chunk(self, choice_index: int = 0) -> bytes:
        """The chat stream's first event of a choice (empty content, role assistant)."""
        choice = {
            "index": choice_index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return sse(self._envelope([choice], final=False))

    def token_chunk(
        self, index: int, finish_reason: str | None, tokens: int = 1, choice_index: int = 0
    ) -> bytes:
        """The event of choice ``choice_index`` carrying ``tokens`` tokens from ``index`` on
        (several when one step emitted them, as vLLM streams speculative decoding); the last
        carries the finish reason."""
        choice: dict[str, object]
        if self.operation is Operation.CHAT:
            delta = self.shape.chat_delta(index, tokens, self.tool_call_id(choice_index))
            choice = {
                "index": choice_index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            if finish_reason is not None:
                choice["stop_reason"] = None
        else:
            choice = {
                "index": choice_index,
                "text": self.shape.text(index, tokens),
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        return sse(self._envelope([choice], final=False))

    def usage_chunk(self, usage_obj: dict[str, object]) -> bytes:
        """The usage-only event (``choices: []``), sent when the client asked for it."""
        return sse({**self._envelope([], final=False), "usage": usage_obj})

    def body(
        self, n_tokens: int, finish_reason: str, usage_obj: dict[str, object], choices: int = 1
    ) -> str:
        """The non-streaming JSON response: ``choices`` choices of ``n_tokens`` tokens each."""
        out: list[object] = []
        for i in range(choices):
            choice: dict[str, object] = {"index": i}
            if self.operation is Operation.CHAT:
                choice["message"] = self.shape.message(n_tokens, self.tool_call_id(i))
            else:
                choice["text"] = self.shape.text(0, n_tokens)
            choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
            out.append(choice)
        return dumps({**self._envelope(out, final=True), "usage": usage_obj})
