"""A request's prompt size, estimated from its body before the backend answers.

The stall view names the long prompt behind a stall at once, while the
backend's own count (``usage.prompt_tokens``) arrives only at the end of the
culprit's stream, or never. So every observed request gets a hint: about four
characters a token over the text the body carries, in any of the supported
request shapes. Token ids count one each. The text itself is never kept.
"""

from __future__ import annotations

from collections.abc import Mapping

_CHARS_PER_TOKEN = 4

# Where each supported API puts its prompt text (keys of the request body):
#   OpenAI chat, Anthropic messages, Ollama chat: ``messages`` (+ Anthropic's ``system``)
#   OpenAI completions, Ollama generate, llama.cpp ``/completion``: ``prompt``
#   OpenAI Responses: ``input`` (+ ``instructions``)
#   TGI ``/generate``: ``inputs``
_TEXT_KEYS = ("messages", "system", "prompt", "input", "instructions", "inputs")


def estimate_prompt_tokens(body: Mapping[str, object]) -> int | None:
    """Prompt size of a request body in tokens, about; ``None`` when it carries no prompt.

    A prompt given as token ids (completions, llama.cpp) counts exactly.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return len(prompt)
    chars = 0
    found = False
    for key in _TEXT_KEYS:
        value = body.get(key)
        if value is None:
            continue
        n = _text_chars(value, 0)
        if n is not None:
            chars += n
            found = True
    if not found:
        return None
    return -(-chars // _CHARS_PER_TOKEN)


def _text_chars(value: object, depth: int) -> int | None:
    """Characters of text in a prompt field: a string, or messages / parts holding text.

    Looks into ``content``, ``text`` and ``input_text`` parts, a few levels deep
    (a message holds parts; a Responses item holds a message). Anything else
    (images, tool schemas, numbers) counts nothing. ``None``: no text shape at all.
    """
    if isinstance(value, str):
        return len(value)
    if depth > 3:
        return None
    if isinstance(value, list):
        total, found = 0, False
        for item in value:
            n = _text_chars(item, depth + 1)
            if n is not None:
                total += n
                found = True
        return total if found else None
    if isinstance(value, dict):
        total, found = 0, False
        for key in ("content", "text"):
            inner = value.get(key)
            if inner is not None:
                n = _text_chars(inner, depth + 1)
                if n is not None:
                    total += n
                    found = True
        return total if found else None
    return None
