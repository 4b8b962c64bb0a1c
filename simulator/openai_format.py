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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from simulator.profile import Profile
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
    n = body.get("n")
    if n not in (None, 1):
        raise RequestError("the simulator serves n = 1 only", "n")
    max_tokens = _positive_int(body, "max_tokens") or _positive_int(body, "max_completion_tokens")
    override = _positive_int(body, "sim_prompt_tokens")
    prompt_tokens = override or max(
        1, count_text_tokens(source) if isinstance(source, str) else len(source)
    )
    output_tokens = max_tokens or profile.output_tokens
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
    )


def token_text(index: int) -> str:
    """The deterministic text of output token ``index``."""
    return f" tok{index}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, object]:
    """vLLM's usage object (field order as vLLM's ``UsageInfo``)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


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

    def role_chunk(self) -> bytes:
        """The chat stream's first event (empty content, role assistant)."""
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return sse(self._envelope([choice], final=False))

    def token_chunk(self, index: int, finish_reason: str | None, tokens: int = 1) -> bytes:
        """The event carrying ``tokens`` tokens from ``index`` on (several when one step
        emitted them, as vLLM streams speculative decoding); the last carries the finish reason."""
        text = "".join(token_text(i) for i in range(index, index + tokens))
        choice: dict[str, object]
        if self.operation is Operation.CHAT:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            if finish_reason is not None:
                choice["stop_reason"] = None
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        return sse(self._envelope([choice], final=False))

    def usage_chunk(self, usage_obj: dict[str, object]) -> bytes:
        """The usage-only event (``choices: []``), sent when the client asked for it."""
        return sse({**self._envelope([], final=False), "usage": usage_obj})

    def body(self, n_tokens: int, finish_reason: str, usage_obj: dict[str, object]) -> str:
        """The non-streaming JSON response."""
        text = "".join(token_text(i) for i in range(n_tokens))
        choice: dict[str, object]
        if self.operation is Operation.CHAT:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        return dumps({**self._envelope([choice], final=True), "usage": usage_obj})
