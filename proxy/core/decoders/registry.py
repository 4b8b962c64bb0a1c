"""Which stream format a request speaks: chosen by route, confirmed by response content type.

``route(method, path)`` finds the ``Format`` of an observed endpoint: its
operation name, its framing (server-sent events or newline-delimited JSON),
its interpreters, and how its request body says the model and whether it
streams. ``choose(fmt, content_type)`` then says how to read the response
that actually came back: as the format's stream, as one JSON body, or not at
all (``None``: relay it untouched and count it as unobserved). A route that
answers with the other framing, or with anything but JSON, is never decoded.

| route | format | framing | operation |
|---|---|---|---|
| ``POST /v1/chat/completions`` | OpenAI chat completions | SSE | chat |
| ``POST /v1/completions`` | OpenAI completions | SSE | text_completion |
| ``POST /v1/messages`` | Anthropic Messages | SSE | chat |
| ``POST /v1/responses`` | OpenAI Responses | SSE | chat |
| ``POST /api/chat`` | Ollama native chat | NDJSON | chat |
| ``POST /api/generate`` | Ollama native generate | NDJSON | text_completion |
| ``POST /generate_stream`` | TGI native (always streams) | SSE | text_completion |
| ``POST /generate`` | TGI native (never streams) | JSON only | text_completion |
| ``POST /completion``, ``/completions``, ``/infill`` | llama.cpp native | SSE | text_completion |

Pure: no I/O, no framework imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from proxy.core.decoders import anthropic, llamacpp, ollama, responses, tgi
from proxy.core.decoders.meaning import load_object
from proxy.core.decoders.openai import ChunkInfo, interpret, interpret_object
from proxy.core.decoders.shape import TokenShape
from proxy.core.records import Operation


class Interpreter(Protocol):
    """Meaning of one stream event; ``None`` when it is not decodable. Never raises.

    Takes the event's data (an SSE event's data, or one NDJSON line) and its SSE
    event name (``""`` for NDJSON). ``known_ids``: the caller already has the
    response's id or model, so a plain output event may come back as the shared
    ``proxy.core.decoders.openai.OUTPUT`` constant (the relay's per-token fast path).
    """

    def __call__(self, data: str, event: str, /, *, known_ids: bool = False) -> ChunkInfo | None:
        """Interpret one event."""


BodyInterpreter = Callable[[dict[str, Any]], ChunkInfo]
"""A whole non-streaming JSON body (already parsed) to its meaning. Never raises."""


class Framing(StrEnum):
    """How a format separates the events of its stream."""

    SSE = "sse"
    """Server-sent events (``text/event-stream``)."""
    NDJSON = "ndjson"
    """Newline-delimited JSON (``application/x-ndjson``)."""


class Decoding(StrEnum):
    """How to read one response, given its format and content type."""

    SSE = "sse"
    """Time it as a server-sent event stream."""
    NDJSON = "ndjson"
    """Time it as a newline-delimited JSON stream."""
    JSON = "json"
    """Not a stream: read usage from the body at its end."""


_NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl"})


@dataclass(frozen=True, slots=True)
class Format:
    """One observed endpoint's wire format."""

    name: str
    """Short name for logs and docs (``anthropic_messages``)."""
    operation: Operation
    """``gen_ai.operation.name`` of its requests."""
    framing: Framing
    """How its streamed answer is framed."""
    interpret: Interpreter
    """Meaning of one stream event."""
    interpret_body: BodyInterpreter
    """Meaning of a non-streaming JSON body."""
    stream_default: bool = False
    """Whether a request whose body has no boolean ``stream`` streams (Ollama: yes)."""
    stream_fixed: bool | None = None
    """The route always (True) or never (False) streams, whatever the body says."""
    has_model: bool = True
    """The request body names the model in ``model`` (TGI's native routes do not)."""
    injects_usage: bool = False
    """``stream_options.include_usage`` may be injected (OpenAI chat and completions)."""
    token_shape: Callable[[bytes], TokenShape | None] | None = None
    """Learns a stream's usual output event, to recognise the next ones by their bytes
    (``proxy.core.decoders.shape``); ``None``: every event is decoded."""

    def request_model(self, body: Mapping[str, Any]) -> object:
        """The model the request asks for (anything the client sent; ``None`` when absent)."""
        return body.get("model") if self.has_model else None

    def streams(self, body: Mapping[str, Any]) -> bool:
        """Whether the request asks for a streamed answer."""
        if self.stream_fixed is not None:
            return self.stream_fixed
        flag = body.get("stream")
        return flag if isinstance(flag, bool) else self.stream_default


def _openai_body(obj: dict[str, Any]) -> ChunkInfo:
    return interpret_object(obj)


OPENAI_CHAT = Format(
    name="openai_chat",
    operation=Operation.CHAT,
    framing=Framing.SSE,
    interpret=interpret,
    interpret_body=_openai_body,
    injects_usage=True,
    token_shape=TokenShape.learn,
)
"""OpenAI-compatible chat completions (vLLM, SGLang, TGI, llama.cpp, Ollama ``/v1``)."""
OPENAI_COMPLETIONS = Format(
    name="openai_completions",
    operation=Operation.TEXT_COMPLETION,
    framing=Framing.SSE,
    interpret=interpret,
    interpret_body=_openai_body,
    injects_usage=True,
    token_shape=TokenShape.learn,
)
"""OpenAI-compatible (legacy) completions."""
ANTHROPIC_MESSAGES = Format(
    name="anthropic_messages",
    operation=Operation.CHAT,
    framing=Framing.SSE,
    interpret=anthropic.interpret,
    interpret_body=anthropic.interpret_body,
)
"""Anthropic Messages API."""
OPENAI_RESPONSES = Format(
    name="openai_responses",
    operation=Operation.CHAT,
    framing=Framing.SSE,
    interpret=responses.interpret,
    interpret_body=responses.interpret_body,
)
"""OpenAI Responses API."""
OLLAMA_CHAT = Format(
    name="ollama_chat",
    operation=Operation.CHAT,
    framing=Framing.NDJSON,
    interpret=ollama.interpret,
    interpret_body=ollama.interpret_body,
    stream_default=True,
)
"""Ollama's native chat endpoint (streams unless ``"stream": false``)."""
OLLAMA_GENERATE = Format(
    name="ollama_generate",
    operation=Operation.TEXT_COMPLETION,
    framing=Framing.NDJSON,
    interpret=ollama.interpret,
    interpret_body=ollama.interpret_body,
    stream_default=True,
)
"""Ollama's native generate endpoint (streams unless ``"stream": false``)."""
TGI_GENERATE_STREAM = Format(
    name="tgi_generate_stream",
    operation=Operation.TEXT_COMPLETION,
    framing=Framing.SSE,
    interpret=tgi.interpret,
    interpret_body=tgi.interpret_body,
    stream_fixed=True,
    has_model=False,
)
"""TGI's native streaming endpoint: no model field, always streams."""
TGI_GENERATE = Format(
    name="tgi_generate",
    operation=Operation.TEXT_COMPLETION,
    framing=Framing.SSE,
    interpret=tgi.interpret,
    interpret_body=tgi.interpret_body,
    stream_fixed=False,
    has_model=False,
)
"""TGI's native non-streaming endpoint (one JSON body)."""
LLAMACPP_COMPLETION = Format(
    name="llamacpp_completion",
    operation=Operation.TEXT_COMPLETION,
    framing=Framing.SSE,
    interpret=llamacpp.interpret,
    interpret_body=llamacpp.interpret_body,
)
"""llama.cpp server's native completion (and infill) endpoint."""

ROUTES: Mapping[tuple[str, str], Format] = {
    ("POST", "/v1/chat/completions"): OPENAI_CHAT,
    ("POST", "/v1/completions"): OPENAI_COMPLETIONS,
    ("POST", "/v1/messages"): ANTHROPIC_MESSAGES,
    ("POST", "/v1/responses"): OPENAI_RESPONSES,
    ("POST", "/api/chat"): OLLAMA_CHAT,
    ("POST", "/api/generate"): OLLAMA_GENERATE,
    ("POST", "/generate_stream"): TGI_GENERATE_STREAM,
    ("POST", "/generate"): TGI_GENERATE,
    ("POST", "/completion"): LLAMACPP_COMPLETION,
    ("POST", "/completions"): LLAMACPP_COMPLETION,
    ("POST", "/infill"): LLAMACPP_COMPLETION,
}
"""Observed endpoints by (method, exact path). Everything else is forwarded unobserved."""


def route(method: str, path: str) -> Format | None:
    """The format of an observed endpoint, or ``None`` for a route that is only forwarded."""
    return ROUTES.get((method, path))


def media_type(content_type: str) -> str:
    """The media type of a ``Content-Type`` value, lower-cased, without parameters."""
    return content_type.partition(";")[0].strip().lower()


def choose(fmt: Format, content_type: str) -> Decoding | None:
    """How to read a response of ``fmt`` with this ``Content-Type``; ``None``: do not decode."""
    kind = media_type(content_type)
    if kind == "text/event-stream":
        return Decoding.SSE if fmt.framing is Framing.SSE else None
    if kind in _NDJSON_TYPES:
        return Decoding.NDJSON if fmt.framing is Framing.NDJSON else None
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        return Decoding.JSON
    return None


def interpret_json_body(fmt: Format, body: bytes) -> ChunkInfo | None:
    """Meaning of a whole non-streaming body of ``fmt``; ``None`` when it is not a JSON object."""
    obj = load_object(body)
    return None if obj is None else fmt.interpret_body(obj)
