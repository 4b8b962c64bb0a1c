"""The "Thinking vs answering" panels compute what their titles say.

Runs the committed panels' queries over synthetic series with ``promtool``:
backend ``vllm-a`` serves a reasoning model (first tokens fast, answers after
seconds of thinking, a quarter of its output tokens reasoning, tool calls),
``vllm-b`` does not reason (its answer histogram equals its TTFT histogram, no
reasoning or tool-call series at all).
"""

from __future__ import annotations

from tests.dashboards.panel_queries import LATENCY, panel_expr, run_promtool

REQUEST = 'job="tokenstamp", instance="p0:9464", gen_ai_operation_name="chat", ' \
    'gen_ai_provider_name="vllm", gen_ai_request_model="m"'  # fmt: skip


def _hist(name: str, backend: str, buckets: dict[str, float]) -> list[tuple[str, float]]:
    """Bucket series (cumulative, per minute) and the count, which is the +Inf bucket."""
    labels = f'{REQUEST}, server_address="{backend}"'
    out = [(f'{name}_bucket{{{labels}, le="{le}"}}', n) for le, n in buckets.items()]
    return [*out, (f"{name}_count{{{labels}}}", buckets["+Inf"])]


def _usage(backend: str, kind: str, tokens: float) -> tuple[str, float]:
    return (
        f'gen_ai_client_token_usage_sum{{{REQUEST}, server_address="{backend}", '
        f'gen_ai_token_type="{kind}"}}',
        tokens,
    )


FAST = {"0.25": 0, "0.5": 100, "5.0": 100, "+Inf": 100}
SERIES = [
    # vllm-a: every first token within 0.25-0.5 s; 80% of answers within 2.5-5 s, the
    # rest within 5-7.5 s; thinking 2.5-5 s; one request in six calls a tool.
    *_hist("gen_ai_server_time_to_first_token_seconds", "vllm-a", {"0.25": 0, "0.5": 60,
                                                                    "+Inf": 60}),
    *_hist("tokenstamp_time_to_first_answer_token_seconds", "vllm-a", {"2.5": 0, "5.0": 48,
                                                                        "7.5": 60, "+Inf": 60}),
    *_hist("tokenstamp_reasoning_duration_seconds", "vllm-a", {"2.5": 0, "5.0": 60, "+Inf": 60}),
    *_hist("tokenstamp_time_to_first_tool_call_seconds", "vllm-a", {"0.5": 0, "0.75": 10,
                                                                     "+Inf": 10}),
    (f'tokenstamp_reasoning_tokens_sum{{{REQUEST}, server_address="vllm-a"}}', 300),
    _usage("vllm-a", "output", 1200),
    _usage("vllm-a", "input", 50000),
    # vllm-b: no reasoning; the first answer event is the first output event.
    *_hist("gen_ai_server_time_to_first_token_seconds", "vllm-b", FAST),
    *_hist("tokenstamp_time_to_first_answer_token_seconds", "vllm-b", FAST),
    _usage("vllm-b", "output", 500),
]  # fmt: skip

A = '{server_address="vllm-a"}'
B = '{server_address="vllm-b"}'
#: (panel, query index) -> expected {labels: value}.
CASES: list[tuple[str, int, dict[str, float]]] = [
    # TTFT p50 and the answer's p50 side by side: apart with reasoning, equal without.
    ("TTFT and time to first answer p50 / p90", 0, {A: 0.375, B: 0.375}),
    ("TTFT and time to first answer p50 / p90", 1, {A: 4.063, B: 0.375}),
    ("TTFT and time to first answer p50 / p90", 2, {A: 0.475, B: 0.475}),
    ("TTFT and time to first answer p50 / p90", 3, {A: 6.25, B: 0.475}),
    ("Reasoning duration p50 / p90", 0, {A: 3.75}),
    ("Reasoning duration p50 / p90", 1, {A: 4.75}),
    # Output tokens only (the input tokens are not counted); 0, not absent, without reasoning.
    ("Reasoning share of output tokens", 0, {A: 0.25, B: 0}),
    ("Time to first tool call p90", 0, {A: 0.725}),
    ("Time to first answer SLO misses", 0, {A: 0.2, B: 0}),
]  # fmt: skip


def test_thinking_panels_on_synthetic_series(promtool, tmp_path):
    tests = [
        {
            "expr": f"round(\n{panel_expr(LATENCY, title, index)}\n, 0.001)",
            "eval_time": "60m",
            "exp_samples": [{"labels": k, "value": v} for k, v in expected.items()],
        }
        for title, index, expected in CASES
    ]
    result = run_promtool(promtool, tmp_path, SERIES, tests)
    assert result.returncode == 0, result.stdout + result.stderr
