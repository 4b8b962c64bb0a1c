"""Prompt and completion as GenAI span attributes (``--capture-content`` only).

``gen_ai.input.messages`` and ``gen_ai.output.messages`` are JSON arrays of
messages, each with a ``role`` and ``parts`` (``{"type": "text", "content":
...}``; output messages also carry ``finish_reason``), as the OpenTelemetry
GenAI semantic conventions describe them. The text of one attribute is capped
at ``cap_chars`` characters (the rest is cut and marked), so a long prompt
cannot blow up a span. Only message text is read: never a header, never a key.

Pure: dicts and bytes in, a JSON string (or ``None``) out; never raises on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from orjson import loads

from proxy.core.decoders.sse import SseDecoder

CAP_CHARS = 16384
"""Default cap on the text characters of one attribute."""
TRUNCATED = "…[truncated]"
"""Appended to a text cut at the cap."""


class _Budget:
    """Characters of text still allowed in one attribute."""

    __slots__ = ("left",)

    def __init__(self, cap_chars: int) -> None:
        self.left = cap_chars

    def take(self, text: str) -> str:
        """``text``, cut to what is left of the budget."""
        if len(text) <= self.left:
            self.left -= len(text)
            return text
        cut = text[: max(self.left, 0)] + TRUNCATED
        self.left = 0
        return cut


def _parts(content: object, budget: _Budget) -> list[dict[str, Any]]:
    """Message parts of a chat ``content`` (a string or a list of typed parts)."""
    if isinstance(content, str):
        return [{"type": "text", "content": budget.take(content)}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            text = part.get("text")
            if kind == "text" and isinstance(text, str):
                parts.append({"type": "text", "content": budget.take(text)})
            elif isinstance(kind, str):
                parts.append({"type": kind})  # images, audio, files: the kind only
    return parts


def _list(v: object) -> list[Any]:
    return v if isinstance(v, list) else []


def _dump(messages: list[dict[str, Any]]) -> str | None:
    return json.dumps(messages, ensure_ascii=False) if messages else None


def input_messages(body: Mapping[str, object], cap_chars: int = CAP_CHARS) -> str | None:
    """``gen_ai.input.messages`` of a chat or completions request body; ``None`` if none."""
    budget = _Budget(cap_chars)
    out: list[dict[str, Any]] = []
    messages = body.get("messages")
    prompt = body.get("prompt")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            entry: dict[str, Any] = {"role": role if isinstance(role, str) else "user"}
            entry["parts"] = _parts(message.get("content"), budget)
            for call in _list(message.get("tool_calls")):
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    entry["parts"].append(
                        {"type": "tool_call", "name": fn.get("name"), "id": call.get("id")}
                    )
            out.append(entry)
    elif isinstance(prompt, str):
        out.append({"role": "user", "parts": _parts(prompt, budget)})
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        out.extend({"role": "user", "parts": _parts(p, budget)} for p in prompt)
    return _dump(out)


class _Choice:
    """Output of one choice, accumulated from deltas."""

    __slots__ = ("finish_reason", "reasoning", "text", "tools")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None

    def add(self, choice: Mapping[str, Any]) -> None:
        """Take one choice object of a chunk (``delta``) or of a whole body (``message``)."""
        msg = choice.get("delta") or choice.get("message") or {}
        if not isinstance(msg, dict):
            msg = {}
        for source, sink in ((msg.get("content"), self.text), (choice.get("text"), self.text)):
            if isinstance(source, str) and source:
                sink.append(source)
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
        for i, call in enumerate(_list(msg.get("tool_calls"))):
            if not isinstance(call, dict):
                continue
            index = call.get("index", i)
            tool = self.tools.setdefault(index if isinstance(index, int) else i, {"args": []})
            fn = call.get("function")
            if isinstance(fn, dict):
                if isinstance(fn.get("name"), str):
                    tool["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    tool["args"].append(fn["arguments"])
            if isinstance(call.get("id"), str):
                tool["id"] = call["id"]
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason

    def message(self, budget: _Budget) -> dict[str, Any]:
        """The choice as one output message."""
        parts: list[dict[str, Any]] = []
        if self.reasoning:
            parts.append({"type": "reasoning", "content": budget.take("".join(self.reasoning))})
        if self.text:
            parts.append({"type": "text", "content": budget.take("".join(self.text))})
        for _, tool in sorted(self.tools.items()):
            parts.append(
                {
                    "type": "tool_call",
                    "id": tool.get("id"),
                    "name": tool.get("name"),
                    "arguments": budget.take("".join(tool["args"])),
                }
            )
        return {"role": "assistant", "parts": parts, "finish_reason": self.finish_reason or ""}


def _take(obj: object, choices: dict[int, _Choice]) -> None:
    if not isinstance(obj, dict):
        return
    for i, choice in enumerate(_list(obj.get("choices"))):
        if isinstance(choice, dict):
            index = choice.get("index", i)
            choices.setdefault(index if isinstance(index, int) else i, _Choice()).add(choice)


def output_messages(raw: bytes, *, streamed: bool, cap_chars: int = CAP_CHARS) -> str | None:
    """``gen_ai.output.messages`` from a response body (SSE when ``streamed``, else JSON)."""
    choices: dict[int, _Choice] = {}
    try:
        if streamed:
            for event in SseDecoder(max(len(raw), 1)).feed(raw + b"\n\n"):
                if event.data and event.data != "[DONE]":
                    try:
                        _take(loads(event.data), choices)
                    except ValueError:
                        continue
        else:
            _take(loads(raw), choices)
    except Exception:  # a copy for a span must never fail the span, whatever the bytes
        return None
    budget = _Budget(cap_chars)
    return _dump([choices[i].message(budget) for i in sorted(choices)])
