"""Approximate tokenizer and prefix cache of the simulator (pure, deterministic).

Tokenizer: a prompt's text is cut into pieces of :data:`CHARS_PER_TOKEN` (4)
characters; each piece is one token (the usual rule of thumb for English BPE).
A chat request is first rendered as ``<|role|>content`` per message, so two
requests sharing a system prompt share a token prefix. A completions prompt
given as token ids uses the ids themselves. ``sim_prompt_tokens: N`` sets the
length: the text's tokens are cut to N or padded with filler tokens derived
from the text, so the same text and N always give the same tokens (and hit the
prefix cache when it is on).

Prefix cache: tokens are grouped in blocks of :data:`BLOCK_TOKENS` (16); block
``i`` is identified by a hash of block ``i - 1``'s hash and its own tokens, so a
block hash names the whole prefix up to it. Only full blocks are cached, and
like vLLM at least the last prompt token is always computed.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

CHARS_PER_TOKEN = 4
"""Characters of prompt text per simulated token."""
BLOCK_TOKENS = 16
"""Tokens per prefix-cache block."""


def render_chat(messages: Iterable[object]) -> str:
    """The text the tokenizer sees for a chat request's ``messages`` (roles and text parts)."""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            parts.append(f"<|?|>{message!s}")
            continue
        role = message.get("role", "user")
        content = message.get("content")
        if isinstance(content, list):
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            content = "".join(t for t in texts if isinstance(t, str))
        parts.append(f"<|{role}|>{'' if content is None else content}")
    return "".join(parts)


def text_tokens(text: str) -> list[str]:
    """The simulated tokens of ``text``: consecutive pieces of 4 characters."""
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]


def count_text_tokens(text: str) -> int:
    """``len(text_tokens(text))`` without building the list."""
    return -(-len(text) // CHARS_PER_TOKEN)


def fit_tokens(tokens: Sequence[str], n_tokens: int) -> list[str]:
    """``tokens`` cut or padded (deterministic filler) to exactly ``n_tokens``."""
    if n_tokens <= len(tokens):
        return list(tokens[:n_tokens])
    return [*tokens, *(f"\x00pad{i}" for i in range(len(tokens), n_tokens))]


def block_hashes(tokens: Sequence[str]) -> tuple[bytes, ...]:
    """Chained hash of every full block of :data:`BLOCK_TOKENS` tokens (stable across runs)."""
    hashes: list[bytes] = []
    previous = b""
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        block = "\x1f".join(tokens[start : start + BLOCK_TOKENS]).encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        hashes.append(previous)
    return tuple(hashes)


class PrefixCache:
    """LRU set of cached block hashes, bounded to ``capacity_blocks``."""

    def __init__(self, capacity_blocks: int = 1 << 16) -> None:
        """Empty cache holding at most ``capacity_blocks`` blocks."""
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks: expected >= 1, got {capacity_blocks}")
        self._capacity = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        """Number of cached blocks."""
        return len(self._blocks)

    def match(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        """Tokens of a prompt already cached: its leading cached blocks, below ``prompt_tokens``.

        At least one prompt token is always left to compute (the step that
        computes it produces the first output token).
        """
        hit = 0
        for block in hashes:
            if block not in self._blocks:
                break
            self._blocks.move_to_end(block)
            hit += 1
        max_cached_blocks = (prompt_tokens - 1) // BLOCK_TOKENS
        return min(hit, max_cached_blocks) * BLOCK_TOKENS

    def insert(self, hashes: Iterable[bytes]) -> None:
        """Cache the blocks of a prompt whose prefill completed; evict least recently used."""
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        """Forget every cached block."""
        self._blocks.clear()
