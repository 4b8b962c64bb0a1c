"""A fast OpenAI-compatible streaming backend that writes its send time into every token chunk.

``POST /v1/chat/completions`` with ``stream: true`` answers like vLLM: a role
chunk at once, then ``max_tokens`` content chunks at a fixed rate per stream
(sent on absolute deadlines from the request's start, so the rate does not
drift), then the finish chunk, a usage chunk when ``stream_options.include_usage``
is true, and ``data: [DONE]``. Each content chunk carries one more top-level
field, ``"bench_send_ns":"<20 digits>"``: ``time.monotonic_ns()`` taken just
before the chunk is written. CLOCK_MONOTONIC is system-wide on Linux, so a
client on the same machine computes transit as its receive time minus this.

The output is deterministic: the words and the response id come from the
prompt text only (not from other body keys a proxy may add), and ``created``
is fixed for the life of the process. Masking the stamp digits therefore makes
the bytes of one prompt's answer identical through any faithful proxy.

``--tokens-per-write K`` (steady): a stream's chunks leave K at a time, each its own HTTP
chunk, in one write stamped with its time, on the deadline of the last of them (the rate
stays the same): each read of a proxy then carries K chunks, as from a proxy that fell
behind its upstream.

Lockstep (``--step-rate S``): one timer for all streams, as an engine's step loop; each
step writes the next chunk of every open stream back to back, all stamped with the step's
time (transit includes the backend's own writing of the step, as the direct run does; equal
stamps name one step). ``"bench_rate_per_s": R`` in a body slows that one stream (the
memory figure's streams): timing only, never bytes.

Also serves ``GET /health`` and ``GET /v1/models``; a non-streaming request
waits for the whole answer's time, then returns one JSON body.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiohttp import web

STAMP_FIELD = b'"bench_send_ns":"'
"""What precedes the send-time digits in a content chunk."""
STAMP_DIGITS = 20
"""The send time is zero-padded to this many digits, so chunk length does not depend on it."""

# Token texts of varied length (1 to 12 bytes), as a tokenizer's pieces look.
_WORDS = (
    " the", " of", ",", " serving", " latency", " token", ".", " prefill", " decode", " a",
    " batch", " is", " to", " and", " attention", " cache", " in", " streams", " GPU", "\n",
    " first", " time", " per", " output", " chunked", " step", " that", " model", " it", " we",
    " throughput", " request",
)  # fmt: skip
_WORDS_JSON = tuple(json.dumps(w).encode() for w in _WORDS)
MAX_TOKENS_LIMIT = 100_000
"""Largest ``max_tokens`` accepted."""


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """How the backend answers."""

    rate_per_s: float = 50.0
    """Content chunks per second per stream."""
    default_max_tokens: int = 200
    """Answer length when the request sets no ``max_tokens``."""
    model: str = "bench-model"
    """Model name reported when the request names none."""
    created_unix_s: int = 0
    """``created`` field of every chunk (fixed, for deterministic bytes)."""
    step_rate_per_s: float = 0.0
    """Lockstep steps per second (one chunk to every open stream per step); 0: off."""
    tokens_per_write: int = 1
    """Content chunks a stream writes at once, on the deadline of the last (not lockstep)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What one request asks for, as far as the backend cares."""

    stream: bool
    """SSE answer when true."""
    include_usage: bool
    """Send the usage chunk."""
    max_tokens: int
    """Content chunks to send."""
    model: str
    """Model name to report."""
    prompt_text: str
    """Concatenated message texts: the answer's only source of variation."""
    rate_per_s: float = 0.0
    """This stream's own token rate (``bench_rate_per_s``); 0: the backend's."""


class BadRequest(ValueError):
    """A request body the backend refuses with 400."""


def parse_request(body: bytes, config: BackendConfig) -> Answer:
    """Read the keys the backend uses from a chat completions body."""
    try:
        obj = json.loads(body)
    except ValueError:
        raise BadRequest("body is not JSON") from None
    if not isinstance(obj, dict):
        raise BadRequest("body is not a JSON object")
    n = obj.get("max_tokens", obj.get("max_completion_tokens"))
    if n is None:
        n = config.default_max_tokens
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_TOKENS_LIMIT:
        raise BadRequest(f"max_tokens must be an integer in [1, {MAX_TOKENS_LIMIT}]")
    opts = obj.get("stream_options")
    model = obj.get("model")
    texts: list[str] = []
    messages = obj.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                texts.append(content)
    rate = obj.get("bench_rate_per_s", 0.0)
    if not isinstance(rate, int | float) or isinstance(rate, bool) or rate < 0:
        raise BadRequest("bench_rate_per_s must be a number >= 0")
    return Answer(
        rate_per_s=float(rate),
        stream=obj.get("stream") is True,
        include_usage=isinstance(opts, dict) and opts.get("include_usage") is True,
        max_tokens=n,
        model=model if isinstance(model, str) and model else config.model,
        prompt_text="\n".join(texts),
    )


class ChunkFormat:
    """The bytes of one answer's events, with the fixed parts encoded once."""

    __slots__ = ("_content_head", "_content_mid", "_frame", "_seed", "prompt_tokens")

    def __init__(self, answer: Answer, created_unix_s: int) -> None:
        digest = hashlib.md5(answer.prompt_text.encode(), usedforsecurity=False).hexdigest()
        self._seed = int(digest[:8], 16)
        self.prompt_tokens = max(1, len(answer.prompt_text) // 4)
        model = json.dumps(answer.model)
        self._frame = (
            f'{{"id":"chatcmpl-{digest}","object":"chat.completion.chunk",'
            f'"created":{created_unix_s},"model":{model},'
        ).encode()
        self._content_head = b"data: " + self._frame + b'"choices":[{"index":0,"delta":{"content":'
        self._content_mid = b'},"logprobs":null,"finish_reason":null}],' + STAMP_FIELD

    def word(self, i: int) -> int:
        """Index of the i-th token's word (deterministic per prompt)."""
        return (self._seed + i * 7 + (i * i) % 5) % len(_WORDS)

    def text(self, n: int) -> str:
        """The whole answer text of ``n`` tokens."""
        return "".join(_WORDS[self.word(i)] for i in range(n))

    def role(self) -> bytes:
        """The first event: role only, no output."""
        return self._event(
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]}'
        )

    def content(self, i: int, send_ns: int) -> bytes:
        """The i-th content event, stamped with ``send_ns``."""
        return b"".join(
            (
                self._content_head,
                _WORDS_JSON[self.word(i)],
                self._content_mid,
                b"%020d" % send_ns,
                b'"}\n\n',
            )
        )

    def finish(self, reason: str) -> bytes:
        """The finish event: empty delta, finish and stop reason."""
        return self._event(
            b'"choices":[{"index":0,"delta":{"content":""},"logprobs":null,'
            b'"finish_reason":"' + reason.encode() + b'","stop_reason":null}]}'
        )

    def usage(self, completion_tokens: int) -> bytes:
        """The usage-only event (``choices: []``)."""
        p, c = self.prompt_tokens, completion_tokens
        return self._event(
            f'"choices":[],"usage":{{"prompt_tokens":{p},"total_tokens":{p + c},'
            f'"completion_tokens":{c},"prompt_tokens_details":null}}}}'.encode()
        )

    def _event(self, rest: bytes) -> bytes:
        return b"data: " + self._frame + rest + b"\n\n"


DONE = b"data: [DONE]\n\n"
"""The stream terminator."""

CONFIG: web.AppKey[BackendConfig] = web.AppKey("bench_backend_config", BackendConfig)


@dataclass(slots=True)
class _Joined:
    """One stream in the lockstep: what it still has to send."""

    resp: web.StreamResponse
    """Where its chunks go."""
    fmt: ChunkFormat
    """Its answer's bytes."""
    total: int
    """Content chunks to send."""
    done: asyncio.Future[None]
    """Resolved after its last content chunk (or when its client went away)."""
    sent: int = 0
    """Content chunks sent so far."""


class Stepper:
    """The lockstep: one timer; each step writes one chunk to every open stream, back to back."""

    __slots__ = ("_joining", "_open", "_period_ns")

    def __init__(self, step_rate_per_s: float) -> None:
        if step_rate_per_s <= 0:
            raise ValueError("step rate must be > 0")
        self._period_ns = round(1e9 / step_rate_per_s)
        self._open: list[_Joined] = []
        self._joining: list[_Joined] = []

    def join(self, resp: web.StreamResponse, fmt: ChunkFormat, total: int) -> _Joined:
        """Enter a stream; it gets its first chunk at the next step."""
        entry = _Joined(resp, fmt, total, asyncio.get_running_loop().create_future())
        self._joining.append(entry)
        return entry

    async def run(self) -> None:
        """Step until cancelled; a late step starts at once, without catching up missed ones."""
        clock = time.monotonic_ns
        next_ns = clock()
        while True:
            next_ns += self._period_ns
            delay_ns = next_ns - clock()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / 1e9)
            else:
                next_ns = clock()
            self._open += self._joining
            self._joining = []
            step_ns = clock()
            keep: list[_Joined] = []
            for s in self._open:
                if s.done.done():
                    continue  # its handler left (client gone)
                try:
                    await s.resp.write(s.fmt.content(s.sent, step_ns))
                except ConnectionError:
                    s.done.set_result(None)
                    continue
                s.sent += 1
                if s.sent >= s.total:
                    s.done.set_result(None)
                else:
                    keep.append(s)
            self._open = keep


STEPPER: web.AppKey[Stepper] = web.AppKey("bench_backend_stepper", Stepper)


def _write_chunks(request: web.Request, events: list[bytes]) -> None:
    """Send ``events`` as one HTTP chunk each, in one write (so one read takes them all).

    aiohttp's writer would make one chunk of one write: the framing is done here, on the
    response's transport (chunked encoding is on: its writer frames nothing of this).
    """
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("client gone")
    transport.write(b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events))


async def _stream(
    request: web.Request, answer: Answer, config: BackendConfig
) -> web.StreamResponse:
    fmt = ChunkFormat(answer, config.created_unix_s)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    period_ns = round(1e9 / (answer.rate_per_s or config.rate_per_s))
    clock = time.monotonic_ns
    stepper = request.app.get(STEPPER)
    # A stream slowed by its body (the memory figure's) writes one chunk at a time.
    per_write = 1 if answer.rate_per_s or stepper is not None else config.tokens_per_write
    if per_write > 1:
        resp.enable_chunked_encoding()  # ``_write_chunks`` frames the chunks itself
    try:
        await resp.prepare(request)
        start_ns = clock()
        await resp.write(fmt.role())
        if stepper is not None and not answer.rate_per_s:
            entry = stepper.join(resp, fmt, answer.max_tokens)
            try:
                await entry.done
            finally:
                if not entry.done.done():
                    entry.done.cancel()  # the stepper skips it from now on
        else:
            for first in range(0, answer.max_tokens, per_write):
                last = min(first + per_write, answer.max_tokens)
                delay_ns = start_ns + last * period_ns - clock()
                if delay_ns > 0:
                    await asyncio.sleep(delay_ns / 1e9)
                send_ns = clock()
                if per_write == 1:
                    await resp.write(fmt.content(first, send_ns))
                else:
                    _write_chunks(request, [fmt.content(i, send_ns) for i in range(first, last)])
        tail = fmt.finish("length")
        if answer.include_usage:
            tail += fmt.usage(answer.max_tokens)
        await resp.write(tail + DONE)
        await resp.write_eof()
    except ConnectionError:
        pass  # the client went away: nothing to answer
    return resp


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Answer one chat completion, streamed or whole."""
    config = request.app[CONFIG]
    try:
        answer = parse_request(await request.read(), config)
    except BadRequest as exc:
        body = {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}
        return web.json_response(body, status=400)
    if answer.stream:
        return await _stream(request, answer, config)
    await asyncio.sleep(answer.max_tokens / config.rate_per_s)
    fmt = ChunkFormat(answer, config.created_unix_s)
    p, c = fmt.prompt_tokens, answer.max_tokens
    return web.json_response(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": config.created_unix_s,
            "model": answer.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": fmt.text(c)},
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
        }
    )


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _models(request: web.Request) -> web.Response:
    model = request.app[CONFIG].model
    return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})


def create_app(config: BackendConfig) -> web.Application:
    """The backend application."""
    app = web.Application()
    app[CONFIG] = config
    if config.step_rate_per_s > 0:
        stepper = Stepper(config.step_rate_per_s)
        app[STEPPER] = stepper

        async def stepping(app: web.Application) -> AsyncIterator[None]:
            task = asyncio.get_running_loop().create_task(stepper.run())
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.cleanup_ctx.append(stepping)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.backend --port PORT [--rate 50]``: serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m bench.backend", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="TCP port")
    parser.add_argument("--rate", type=float, default=50.0, help="tokens/s per stream")
    parser.add_argument("--max-tokens", type=int, default=200, help="default answer length")
    parser.add_argument("--model", default="bench-model", help="model name reported")
    parser.add_argument(
        "--step-rate", type=float, default=0.0, help="lockstep steps/s for all streams (0: off)"
    )
    parser.add_argument(
        "--tokens-per-write", type=int, default=1, help="content chunks a stream writes at once"
    )
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.step_rate < 0 or args.tokens_per_write < 1:
        parser.error("--rate must be > 0, --step-rate >= 0, --tokens-per-write >= 1")
    config = BackendConfig(
        rate_per_s=args.rate,
        default_max_tokens=args.max_tokens,
        model=args.model,
        created_unix_s=int(time.time()),
        step_rate_per_s=args.step_rate,
        tokens_per_write=args.tokens_per_write,
    )
    web.run_app(
        create_app(config),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=1.0,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
