"""The prompt-size hint, for every request shape the proxy observes."""

from __future__ import annotations

import pytest

from proxy.core.prompt_size import estimate_prompt_tokens


def test_counts_text_and_token_ids():
    chat = {
        "messages": [
            {"role": "system", "content": "abcd" * 10},
            {"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "image"}]},
        ]
    }
    assert estimate_prompt_tokens(chat) == 11
    assert estimate_prompt_tokens({"prompt": "x" * 9}) == 3
    assert estimate_prompt_tokens({"prompt": [1, 2, 3]}) == 3
    assert estimate_prompt_tokens({"prompt": [[1, 2]]}) is None
    assert estimate_prompt_tokens({}) is None


TEXT = "word " * 200  # 1,000 characters: 250 tokens at 4 a token


@pytest.mark.parametrize(
    ("api", "body"),
    [
        ("openai chat", {"model": "m", "messages": [{"role": "user", "content": TEXT}]}),
        ("openai completions", {"model": "m", "prompt": TEXT}),
        (
            "anthropic messages, system apart",
            {
                "model": "m",
                "system": TEXT[:400],
                "messages": [{"role": "user", "content": [{"type": "text", "text": TEXT[400:]}]}],
                "max_tokens": 8,
            },
        ),
        (
            "anthropic system as blocks",
            {
                "system": [{"type": "text", "text": TEXT[:400]}],
                "messages": [{"role": "user", "content": TEXT[400:]}],
            },
        ),
        ("responses, input string", {"model": "m", "input": TEXT}),
        (
            "responses, input items and instructions",
            {
                "instructions": TEXT[:100],
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": TEXT[100:]}],
                    }
                ],
            },
        ),
        ("tgi generate", {"inputs": TEXT, "parameters": {"max_new_tokens": 8}}),
        ("ollama generate", {"model": "m", "prompt": TEXT, "options": {"num_ctx": 4096}}),
        ("ollama chat", {"model": "m", "messages": [{"role": "user", "content": TEXT}]}),
        ("llama.cpp completion", {"prompt": TEXT, "n_predict": 8}),
    ],
)
def test_every_observed_api_gets_a_hint(api, body):
    assert estimate_prompt_tokens(body) == 250, api


def test_what_is_not_text_counts_nothing():
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": TEXT}}],
    }
    assert estimate_prompt_tokens(body) is None
    assert estimate_prompt_tokens({"input": 7, "inputs": None, "prompt": True}) is None


def test_deep_nesting_is_cut_off_not_followed():
    deep: object = "x" * 400
    for _ in range(50):
        deep = {"content": [deep]}
    assert estimate_prompt_tokens({"messages": [deep]}) is None
