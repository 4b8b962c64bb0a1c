"""What a request's output tokens say: reasoning first, then the answer (text or a tool call).

Pure: no aiohttp. A reasoning model's first tokens are its reasoning: in a chat
stream each goes out as ``delta: {"reasoning": " think<i>"}`` (the field named
by the profile: ``reasoning``, vLLM's since 0.11.1, or ``reasoning_content``).
The answer follows, as content (`` tok0``, `` tok1``, ... counted from the
first answer token, so an answer reads the same with or without reasoning), or
as one tool call streamed as vLLM's tool parsers stream it: the first answer
token brings the call's id, type and name, each further token a piece of its
JSON arguments (``{"q":"tok1 tok2 ..."}``).

Field order follows vLLM's pydantic models, which serialise in declaration
order with unset fields left out: a delta is ``content``, then the reasoning
field, then ``tool_calls``; a tool-call delta ``id``, ``type``, ``index``,
``function``. Several tokens in one event (speculative decoding) share one
delta, as vLLM's reasoning parser sends the step where reasoning ends and the
answer begins: both fields in one delta.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOOL = "sim_tool"
"""Name of the tool called when the request lists none."""


def token_text(index: int) -> str:
    """The deterministic text of answer token ``index`` (0 for the first answer token)."""
    return f" tok{index}"


def reasoning_text(index: int) -> str:
    """The deterministic text of reasoning token ``index``."""
    return f" think{index}"


def _argument_piece(answer_index: int, answer_tokens: int) -> str:
    """Answer token ``answer_index`` >= 1 of a tool call: a piece of its JSON arguments."""
    piece = '{"q":"tok1' if answer_index == 1 else f" tok{answer_index}"
    return piece + ('"}' if answer_index == answer_tokens - 1 else "")


@dataclass(frozen=True, slots=True)
class OutputShape:
    """How one choice's output tokens divide into reasoning and answer, and what they say."""

    output_tokens: int
    """Tokens of the choice, reasoning included (>= 1)."""
    reasoning_tokens: int = 0
    """Of those, how many come first as reasoning (more than ``output_tokens``: all of them)."""
    reasoning_field: str = "reasoning"
    """The delta and message field reasoning comes in."""
    tool: str | None = None
    """The answer is a call of this tool; None: the answer is text."""

    @property
    def reasoning(self) -> int:
        """Reasoning tokens the choice emits (its length can cut the reasoning short)."""
        return min(self.reasoning_tokens, self.output_tokens)

    @property
    def answer_tokens(self) -> int:
        """Answer tokens the choice emits (0 when reasoning used up its length)."""
        return self.output_tokens - self.reasoning

    def finish_reason(self, engine_reason: str) -> str:
        """What the last chunk says: ``tool_calls`` once a tool call was made, else the
        engine's (``length`` or ``stop``)."""
        return "tool_calls" if self.tool is not None and self.answer_tokens else engine_reason

    def _split(self, index: int, tokens: int) -> tuple[range, range]:
        """Reasoning token indexes and answer token indexes (answer-numbered) of an event."""
        end = index + tokens
        r = self.reasoning
        return range(index, min(end, r)), range(max(index, r) - r, max(end, r) - r)

    def chat_delta(self, index: int, tokens: int, tool_call_id: str) -> dict[str, object]:
        """The ``delta`` of the chat event carrying ``tokens`` tokens from ``index`` on."""
        thought, answer = self._split(index, tokens)
        delta: dict[str, object] = {}
        if answer and self.tool is None:
            delta["content"] = "".join(token_text(i) for i in answer)
        if thought:
            delta[self.reasoning_field] = "".join(reasoning_text(i) for i in thought)
        if answer and self.tool is not None:
            delta["tool_calls"] = [self._tool_delta(answer, tool_call_id)]
        return delta

    def _arguments(self, answer: range) -> str:
        """The tool call's argument pieces of these answer tokens (the first has none)."""
        n = self.answer_tokens
        if n == 1:
            return "{}"
        return "".join(_argument_piece(i, n) for i in answer if i >= 1)

    def _tool_delta(self, answer: range, tool_call_id: str) -> dict[str, object]:
        arguments = self._arguments(answer)
        if answer.start > 0:
            return {"index": 0, "function": {"arguments": arguments}}
        function: dict[str, object] = {"name": self.tool}
        if arguments:
            function["arguments"] = arguments
        return {"id": tool_call_id, "type": "function", "index": 0, "function": function}

    def text(self, index: int, tokens: int) -> str:
        """A completions event's ``text``: every token is answer text there."""
        return "".join(token_text(i) for i in range(index, index + tokens))

    def message(self, emitted: int, tool_call_id: str) -> dict[str, object]:
        """The non-streaming chat ``message`` of a choice that emitted ``emitted`` tokens."""
        thought, answer = self._split(0, emitted)
        message: dict[str, object] = {"role": "assistant"}
        if self.tool is None:
            message["content"] = "".join(token_text(i) for i in answer)
        else:
            message["content"] = None
            if answer:
                function = {"name": self.tool, "arguments": self._arguments(answer)}
                message["tool_calls"] = [
                    {"id": tool_call_id, "type": "function", "function": function}
                ]
        if self.reasoning_tokens:
            message[self.reasoning_field] = "".join(reasoning_text(i) for i in thought)
        return message
