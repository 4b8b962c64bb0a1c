"""Every supported stream format through its decoder, interpreter and a real StreamTimer.

Scripted streams (``formats_data``) are written from each vendor's documentation;
the clock is fake (each read stamped at the sum of the delays so far), so TTFT,
every gap and TPOT are exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.decoders import registry
from proxy.core.decoders.meaning import (
    BackendTimings,
    ChunkMeaning,
    queue_time_s,
)
from proxy.core.decoders.ndjson import NdjsonDecoder
from proxy.core.decoders.openai import ChunkInfo
from proxy.core.decoders.registry import Decoding, Format
from proxy.core.decoders.sse import SseDecoder
from proxy.core.records import Backend, Outcome, RequestLabels, RequestRecord
from proxy.core.timing import StreamTimer
from tests.proxy.core.decoders import formats_data as fd

BACKEND = Backend("test", "b")


class Recorder:
    """A sink that keeps what it is told."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self.records: list[RequestRecord] = []

    def request_started(self, labels):
        pass

    def first_token(self, labels, ttft_s, upstream_ttft_s, request_id, trace_id=""):
        pass

    def gap(self, labels, gap_s, request_id):
        self.gaps.append(gap_s)

    def request_finished(self, record):
        self.records.append(record)

    def decoder_error(self, backend, kind):
        raise AssertionError("the harness counts decoder errors itself")

    def unobserved(self, backend, reason):
        raise AssertionError


@dataclass
class Played:
    record: RequestRecord
    sink: Recorder
    infos: list[ChunkInfo] = field(default_factory=list)
    decoder_errors: int = 0

    @property
    def done(self) -> bool:
        return any(i.done for i in self.infos)

    @property
    def status(self) -> str:
        found = [i.status for i in self.infos if isinstance(i, ChunkMeaning) and i.status]
        return found[-1] if found else ""

    @property
    def timings(self) -> BackendTimings | None:
        found = [i.backend_timings for i in self.infos if isinstance(i, ChunkMeaning)]
        found = [t for t in found if t is not None]
        return found[-1] if found else None


def meanings(
    fmt: Format,
    decoding: Decoding,
    chunks: list[bytes],
    timer: StreamTimer | None = None,
    stamps: list[int] | None = None,
) -> tuple[list, int]:
    """(chunk index, meaning) for every event of ``chunks``, and the decoder errors.

    With a ``timer``, each meaning goes to it stamped ``stamps[chunk index]``, and
    ``known_ids`` follows what the timer has seen, as in the relay.
    """
    out: list[tuple[int, ChunkInfo | None]] = []

    def known() -> bool:
        return timer is not None and bool(timer.response_id or timer.response_model)

    def take(n: int, data: str, event: str) -> None:
        info = fmt.interpret(data, event, known_ids=known())
        out.append((n, info))
        if timer is not None and stamps is not None and info is not None:
            timer.chunk(info, stamps[n])

    if decoding is Decoding.SSE:
        sse = SseDecoder()
        for n, c in enumerate(chunks):
            for ev in sse.feed(c):
                take(n, ev.data, ev.event)
        return out, sse.errors
    nd = NdjsonDecoder()
    for n, c in enumerate(chunks):
        for ln in nd.feed(c):
            take(n, ln.text, "")
    for ln in nd.close():
        take(len(chunks) - 1, ln.text, "")
    return out, nd.errors


def play(s: fd.Scripted) -> Played:
    fmt = registry.route("POST", s.path)
    assert fmt is not None
    decoding = registry.choose(fmt, s.content_type)
    assert decoding is not None
    sink = Recorder()
    labels = RequestLabels(fmt.operation.value, "m", BACKEND)
    timer = StreamTimer("r1", labels, arrival_ns=0, start_unix_ns=0, sink=sink)
    timer.forwarded(0)
    stamps, now_ns = [], 0
    for delay, _ in s.parts:
        now_ns += round(delay * 1e9)
        stamps.append(now_ns)
    played = Played(record=None, sink=sink)  # type: ignore[arg-type]
    if decoding is Decoding.JSON:
        info = registry.interpret_json_body(fmt, s.body)
        assert info is not None
        played.infos.append(info)
        timer.chunk(replace(info, output=False), stamps[-1])
    else:
        timer.streamed = True
        chunks = [p for _, p in s.parts]
        events, played.decoder_errors = meanings(fmt, decoding, chunks, timer, stamps)
        for _, info in events:
            if info is None:
                played.decoder_errors += 1
            else:
                played.infos.append(info)
    outcome = Outcome.UPSTREAM_ERROR if timer.stream_error else Outcome.OK
    played.record = timer.finish(stamps[-1], outcome, 200, timer.stream_error)
    return played


@pytest.mark.parametrize("s", fd.ALL, ids=lambda s: s.name)
def test_scripted_stream_timed_and_read(s: fd.Scripted):
    p = play(s)
    rec, e = p.record, s.expect
    assert rec.output_events == e.output_events
    assert rec.ttft_s == pytest.approx(e.ttft_s)
    assert p.sink.gaps == pytest.approx(list(e.gaps_s), abs=1e-9)
    assert rec.gap_count == len(e.gaps_s)
    assert rec.max_gap_s == pytest.approx(max(e.gaps_s, default=0.0))
    assert rec.tpot_s == pytest.approx(e.tpot_s)
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (
        e.prompt_tokens,
        e.completion_tokens,
        e.cached_tokens,
    )
    assert rec.finish_reasons == e.finish_reasons
    assert (rec.response_model, rec.response_id) == (e.response_model, e.response_id)
    assert rec.error_type == e.error
    assert rec.outcome is (Outcome.UPSTREAM_ERROR if e.error else Outcome.OK)
    assert p.status == e.status
    assert p.done is e.done
    assert p.decoder_errors == e.decoder_errors
    assert rec.streamed is s.streamed
    prefill = p.timings.prefill_s if p.timings else None
    assert prefill == pytest.approx(e.backend_prefill_s)
    assert queue_time_s(rec.ttft_s, p.timings) == pytest.approx(e.queue_time_s)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(fd.ALL), st.lists(st.integers(0, 1 << 16), max_size=16))
def test_any_split_gives_same_meanings(s: fd.Scripted, cuts: list[int]):
    fmt = registry.route("POST", s.path)
    assert fmt is not None
    decoding = registry.choose(fmt, s.content_type)
    if decoding is Decoding.JSON:
        return
    body = s.body
    points = sorted({c % (len(body) + 1) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    whole, _ = meanings(fmt, decoding, [body])
    split, _ = meanings(fmt, decoding, chunks)
    assert [i for _, i in split] == [i for _, i in whole]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 1 << 40) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
_KEYS = ["type", "delta", "text", "thinking", "partial_json", "usage", "message", "response",
         "error", "done", "token", "details", "content", "stop", "timings", "model", "id",
         "input_tokens", "output_tokens", "status", "special", "generated_text", "stop_type"]  # fmt: skip
_shaped = st.dictionaries(st.sampled_from(_KEYS), _json, max_size=6)
_FORMATS = sorted(set(registry.ROUTES.values()), key=lambda f: f.name)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_FORMATS), _shaped | st.dictionaries(st.text(max_size=8), _json))
def test_interpreters_never_raise_on_any_json(fmt: Format, obj):
    raw = json.dumps(obj)
    for event in ("message", "", "content_block_delta", "response.completed", "error"):
        for known in (False, True):
            info = fmt.interpret(raw, event, known_ids=known)
            assert info is None or isinstance(info, ChunkInfo)
    assert isinstance(fmt.interpret_body(obj), ChunkInfo)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(fd.ALL), st.data())
def test_cut_and_splice_never_raises(s: fd.Scripted, data):
    fmt = registry.route("POST", s.path)
    assert fmt is not None
    body = s.body
    a = data.draw(st.integers(0, len(body)))
    b = data.draw(st.integers(a, len(body)))
    c = data.draw(st.integers(0, len(body)))
    mutated = body[:a] + body[c:] + body[a:b]
    for decoding in (Decoding.SSE, Decoding.NDJSON):
        meanings(fmt, decoding, [mutated[:a], mutated[a:]])
    registry.interpret_json_body(fmt, mutated)


# --- the registry -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "name", "operation"),
    [
        ("/v1/chat/completions", "openai_chat", "chat"),
        ("/v1/completions", "openai_completions", "text_completion"),
        ("/v1/messages", "anthropic_messages", "chat"),
        ("/v1/responses", "openai_responses", "chat"),
        ("/api/chat", "ollama_chat", "chat"),
        ("/api/generate", "ollama_generate", "text_completion"),
        ("/generate_stream", "tgi_generate_stream", "text_completion"),
        ("/generate", "tgi_generate", "text_completion"),
        ("/completion", "llamacpp_completion", "text_completion"),
        ("/completions", "llamacpp_completion", "text_completion"),
        ("/infill", "llamacpp_completion", "text_completion"),
    ],
)
def test_routes(path, name, operation):
    fmt = registry.route("POST", path)
    assert fmt is not None
    assert (fmt.name, fmt.operation.value) == (name, operation)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/messages"), ("POST", "/v1/messages/count_tokens"), ("POST", "/"),
     ("POST", "/v1/embeddings"), ("POST", "/api/embed"), ("post", "/v1/messages")],
)  # fmt: skip
def test_other_routes_are_not_observed(method, path):
    assert registry.route(method, path) is None


@pytest.mark.parametrize(
    ("path", "content_type", "decoding"),
    [
        ("/v1/messages", "text/event-stream; charset=utf-8", Decoding.SSE),
        ("/v1/messages", "Text/Event-Stream", Decoding.SSE),
        ("/v1/messages", "application/json", Decoding.JSON),
        ("/v1/messages", "application/x-ndjson", None),
        ("/api/chat", "application/x-ndjson", Decoding.NDJSON),
        ("/api/chat", "application/json; charset=utf-8", Decoding.JSON),
        ("/api/chat", "text/event-stream", None),
        ("/generate_stream", "text/event-stream", Decoding.SSE),
        ("/v1/responses", "application/problem+json", Decoding.JSON),
        ("/completion", "text/plain", None),
        ("/completion", "", None),
        ("/completion", "application/octet-stream", None),
    ],
)
def test_choose_by_content_type(path, content_type, decoding):
    fmt = registry.route("POST", path)
    assert fmt is not None
    assert registry.choose(fmt, content_type) is decoding


def _fmt(path: str) -> Format:
    fmt = registry.route("POST", path)
    assert fmt is not None
    return fmt


def test_request_model_and_stream_flag():
    ollama_chat = _fmt("/api/chat")
    tgi_stream = _fmt("/generate_stream")
    tgi_plain = _fmt("/generate")
    messages = _fmt("/v1/messages")
    assert ollama_chat.streams({}) is True  # Ollama streams by default
    assert ollama_chat.streams({"stream": False}) is False
    assert ollama_chat.streams({"stream": "no"}) is True  # not a boolean: the default
    assert tgi_stream.streams({"stream": False}) is True
    assert tgi_plain.streams({"stream": True}) is False
    assert messages.streams({}) is False
    assert messages.streams({"stream": True}) is True
    assert tgi_stream.request_model({"model": "x", "inputs": "hi"}) is None
    assert messages.request_model({"model": "claude"}) == "claude"
    assert [f.name for f in _FORMATS if f.injects_usage] == ["openai_chat", "openai_completions"]


def test_openai_adapter_survives_deep_nesting():
    fmt = registry.route("POST", "/v1/chat/completions")
    assert fmt is not None
    assert fmt.interpret("[" * 100_000, "message") is None


def test_json_body_that_is_not_an_object():
    fmt = registry.route("POST", "/v1/messages")
    assert fmt is not None
    assert registry.interpret_json_body(fmt, b"[1, 2]") is None
    assert registry.interpret_json_body(fmt, b"\xff\xfe") is None


def test_format_modules_import_no_framework():
    mods = ["proxy.core.decoders.registry", "proxy.core.decoders.ndjson"]
    code = (
        "import importlib, json, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    bad = [
        m
        for m in json.loads(out.stdout)
        if m.split(".")[0] in ("asyncio", "aiohttp", "prometheus_client", "opentelemetry")
    ]
    assert bad == []
