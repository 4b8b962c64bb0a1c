"""A stream's usual token event, learned once, recognised by its bytes without parsing.

An OpenAI-compatible stream repeats one event shape per token: the same keys
and values, byte for byte, around the one string that changes (the delta's
``content``, or a completion's ``text``), plus digits that tick (``created``
on llama.cpp, a stamp field). ``TokenShape.learn`` takes one such event, read
whole in one read, and checks with a full parse that it is a plain output
event; ``TokenShape.matches`` then recognises the stream's later events of the
same shape from their bytes, so the usual token costs a byte translation and
two comparisons instead of a UTF-8 decode, a JSON parse and a walk.

Why the bytes decide exactly what the parse would (``proxy.core.decoders.openai``):

- Outside the output string an event may differ from the learned one only in
  digits, position by position. Swapping a digit for a digit never changes
  JSON structure: a number stays a number, a string stays the same string
  length with no quote or backslash added. So keys, nesting, ``null``s and
  the one choice stay as learned (no ``usage``, no ``error``, a ``null``
  finish reason). The one way a digit can break JSON is a leading zero of a
  multi-digit number: those positions must not be ``0``.
- The learned event holds no backslash (no escape whose meaning digits could
  change) and exactly one ``"content":`` (``"text":``) followed by a string:
  in valid JSON a quote before the name can only open that key.
- The output string in between must be non-empty and hold no quote, no
  backslash and no control byte: it is then one complete JSON string, as is,
  and non-empty content is an output event whatever else the event says.

- The kind of output is fixed by the learned key: a shape learned from a
  ``"content":`` (``"text":``) event only matches answer events, one learned
  from ``"reasoning_content":`` (``"reasoning":``) only reasoning events (a
  stream with both learns one shape of each). A shape learned with the other
  key ``null``, absent or empty keeps it so: the bytes around the string are
  fixed. A tool-call delta never makes a shape.
- A shape is learned from choice 0 only, and the digit of its ``"index":``
  must stay ``0``: with several choices (``n > 1``), an event of choice 1
  must not pass for one of choice 0 (``"index":10`` has one byte more: the
  head no longer matches).

Anything else (an escape in the content, a finish reason, usage, a changed
id) does not match, and the caller decodes the event the general way. Pure:
bytes in, a bool out; never raises on input.
"""

from __future__ import annotations

import re

from orjson import loads

_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")
"""Every digit to ``0``: what may differ between two events of one shape."""
_NOT_PLAIN = re.compile(rb'[\x00-\x1f"\\]')
"""What the output string may not hold (it would end or escape the JSON string)."""
_NOT_DIGIT = re.compile(rb"[^0]")
"""Once digits are masked (``_DIGITS``): the end of a run of digits."""
_CONTENT = b'"content":'
_TEXT = b'"text":'
_REASONING_CONTENT = b'"reasoning_content":'
_REASONING = b'"reasoning":'
_INDEX = b'"index":'
"""A choice's index key: its value, ``0`` (or `` 0``) in every learned shape, must stay ``0``."""
_REASONING_KEYS = (_REASONING_CONTENT, _REASONING)


class TokenShape:
    """The fixed bytes around one stream's output string, digits masked."""

    __slots__ = ("_head", "_head_len", "_nonzero", "_tail", "_tail_len", "_zeros", "reasoning")

    def __init__(
        self,
        head: bytes,
        tail: bytes,
        nonzero: tuple[int, ...],
        zeros: tuple[int, ...] = (),
        *,
        reasoning: bool = False,
    ) -> None:
        self._head = head.translate(_DIGITS)
        self._tail = tail.translate(_DIGITS)
        self._head_len = len(head)
        self._tail_len = len(tail)
        self._nonzero = nonzero
        self._zeros = zeros
        self.reasoning = reasoning
        """The shape's events are reasoning events (else answer events)."""

    @classmethod
    def learn(cls, event: bytes) -> TokenShape | None:
        """The shape of ``event`` (one whole SSE event: ``data:`` line and blank line) when
        it is a plain answer or reasoning event of an OpenAI chat or completions stream,
        else ``None``."""
        if not event.startswith(b"data:") or not event.endswith(b"\n\n"):
            return None
        start = 6 if event[5:6] == b" " else 5
        body = event[start:-2]
        if b"\n" in body or b"\r" in body or b"\\" in body:
            return None
        try:
            obj = loads(body)
        except ValueError:
            return None
        key = _plain_output_key(obj)
        if key is None or event.count(key) != 1:
            return None
        reasoning = key in _REASONING_KEYS
        at = event.index(key) + len(key)
        while event[at] == 0x20:  # ``"content": "``, as Python's json writes it
            at += 1
        if event[at] != 0x22:
            return None
        open_at = at + 1
        close_at = event.find(b'"', open_at)
        if close_at <= open_at:
            return None
        head, tail = event[:open_at], event[close_at:]
        nonzero = _leading_digits(head, 0, False) + _leading_digits(tail, -len(tail), True)
        zeros = _index_zeros(head, 0) + _index_zeros(tail, -len(tail))
        return cls(head, tail, nonzero, zeros, reasoning=reasoning)

    def matches(self, event: bytes) -> bool:
        """Whether ``event`` (one whole read) is an output event of this shape."""
        n = len(event)
        head_len = self._head_len
        tail_len = self._tail_len
        end = n - tail_len
        if end <= head_len:
            return False
        masked = event.translate(_DIGITS)
        if not masked.startswith(self._head) or not masked.endswith(self._tail):
            return False
        if _NOT_PLAIN.search(event, head_len, end) is not None:
            return False
        for at in self._nonzero:
            if event[at if at >= 0 else n + at] == 0x30:
                return False
        for at in self._zeros:  # noqa: SIM110 (a loop: no generator per token)
            if event[at if at >= 0 else n + at] != 0x30:
                return False
        return True


def _plain_output_key(obj: object) -> bytes | None:
    """``"content":`` or ``"text":`` when ``obj`` is one plain answer chunk,
    ``"reasoning_content":`` or ``"reasoning":`` when it is one plain reasoning
    chunk, else ``None``.

    Plain: a dict with no ``usage`` and no ``error`` (absent or null), one
    choice, choice 0, its ``finish_reason`` absent or null, no tool calls, and output in
    the delta's ``content`` (chat) or in ``text`` (completions); or else in
    exactly one of the delta's reasoning fields, its content null, absent or
    empty.
    """
    if type(obj) is not dict or obj.get("usage") is not None or obj.get("error") is not None:
        return None
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    c = choices[0]
    if type(c) is not dict or c.get("finish_reason") is not None or c.get("index", 0) != 0:
        return None
    delta = c.get("delta")
    if type(delta) is dict:
        if delta.get("tool_calls"):
            return None
        content = delta.get("content")
        if type(content) is str and content:
            return _CONTENT
        if content:
            return None
        found = [
            key
            for key, name in ((_REASONING_CONTENT, "reasoning_content"), (_REASONING, "reasoning"))
            if type(delta.get(name)) is str and delta.get(name)
        ]
        return found[0] if len(found) == 1 else None
    if "delta" in c or "message" in c:
        return None
    text = c.get("text")
    return _TEXT if type(text) is str and text else None


def _leading_digits(part: bytes, base: int, in_string: bool) -> tuple[int, ...]:
    """Offsets (``base`` + index) of the first digit of each multi-digit run outside strings.

    ``part`` holds no backslash, so each quote opens or closes a string
    (``in_string``: whether ``part`` starts inside one). A run that starts
    right after ``.`` or an exponent is also listed: conservative.
    """
    start = 0
    if in_string:
        start = part.find(b'"') + 1  # past the quote that closes the string it starts in
        if start == 0:
            return ()
    # Outside a string exactly when an even number of quotes lies between ``start`` and the
    # run (no backslash: every quote opens or closes one). Few runs: a count each is cheap.
    masked = part.translate(_DIGITS)
    out = []
    at = masked.find(b"00", start)  # left to right, past each run: always a run's first digit
    while at >= 0:
        if not part.count(b'"', start, at) & 1:
            out.append(base + at)
        past = _NOT_DIGIT.search(masked, at + 2)
        if past is None:
            break
        at = masked.find(b"00", past.end())
    return tuple(out)


def _index_zeros(part: bytes, base: int) -> tuple[int, ...]:
    """Offsets (``base`` + index) of the ``0`` of each ``"index":0`` (or ``"index": 0``)."""
    out = []
    at = part.find(_INDEX)
    while at >= 0:
        value = at + len(_INDEX)
        if part[value : value + 1] == b" ":
            value += 1
        if part[value : value + 1] == b"0":
            out.append(base + value)
        at = part.find(_INDEX, value)
    return tuple(out)
