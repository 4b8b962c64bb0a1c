"""Forwarding one request on the proxy's own upstream client, and relaying its answer.

Every request goes upstream here, observed or not: on a pooled connection of
``proxy.edge.pool`` whose exchange is the state machine of
``proxy.edge.upstream`` (an interim response never taken for the answer,
nothing after a response's end ever relayed, a connection reused only from its
one clean state). The answer's body is relayed read by read inside the
connection's callbacks (``proxy.edge.relay``): written to the client first,
then, for an observed request, decoded and timed.

Errors are mapped in a fixed order, most specific first. Before the response
starts: upstream timeout 504, any other upstream failure 502, both with a
short JSON body. After it started the status is gone: the client connection is
cut (no clean end of stream) and the outcome recorded.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from multidict import CIMultiDict

from proxy.core.decoders.registry import Decoding, Format, choose
from proxy.core.records import Outcome
from proxy.core.timing import StreamTimer
from proxy.edge.headers import client_response_headers, upstream_request_headers
from proxy.edge.inbound import Inbound
from proxy.edge.pool import request_head
from proxy.edge.relay import (
    BodyRelay,
    JsonRelay,
    NdjsonRelay,
    RelayResult,
    SseRelay,
    by_status,
    stream_failed,
)
from proxy.edge.state import ProxyState
from proxy.edge.upstream import UpstreamConnection
from proxy.edge.upstream_errors import DisconnectedBeforeHead, ResetBeforeHead, UpstreamError

log = logging.getLogger("tokenstamp.proxy")


@dataclass(slots=True)
class Progress:
    """How far one request got, for the record written when it is cancelled."""

    status: int = 0
    """Status sent to the client, once the response has started."""


# Why an upstream gave no response, in the 502's message (``error.type`` stays the class).
_NO_ANSWER = {
    "ClientConnectorError": "unreachable",
    "ClientConnectorDNSError": "unreachable (name not resolved)",
    "ServerDisconnectedError": "closed the connection without answering",
    "ClientOSError": "reset the connection without answering",
    "ClientResponseError": "answered with something that is not HTTP",
}


def no_answer_in_time(client: Inbound, read_timeout_s: float) -> RelayResult:
    """The 504 of an upstream that gave no response head within ``--read-timeout``."""
    msg = f"upstream did not answer within {read_timeout_s:g} s (--read-timeout)"
    client.refuse(504, "upstream_timeout", msg)
    return RelayResult(Outcome.TIMEOUT, 504, "timeout")


def no_answer(client: Inbound, backend_label: str, kind: str) -> RelayResult:
    """The 502 of an upstream that gave no response (``kind``: the ``error.type``)."""
    msg = f"upstream {backend_label} {_NO_ANSWER.get(kind, 'failed')}: {kind}"
    client.refuse(502, "upstream_unreachable", msg)
    return RelayResult(Outcome.UPSTREAM_ERROR, 502, kind)


async def forward(
    client: Inbound,
    state: ProxyState,
    body: bytes,
    progress: Progress,
    fmt: Format | None = None,
    timer: StreamTimer | None = None,
    injected: bool = False,
    original_body: bytes = b"",
) -> RelayResult:
    """Send a request upstream and relay the answer; observe it when ``timer`` is given
    (with ``fmt``, its format; ``injected``: ``body`` asks for usage, ``original_body``
    did not). Failures become statuses or outcomes."""
    cfg = state.config
    headers = upstream_request_headers(
        client.headers,
        client_ip=client.remote,
        scheme=client.scheme,
        identity=timer is not None,  # a token stream must be readable to be timed
        trust=cfg.trust_forwarded,
    )
    client.forget_headers()  # copied into ``headers``: not kept while the body streams
    started = False
    conn: UpstreamConnection | None = None
    clean = False  # the upstream's answer was read to its end: the connection may be reused
    drain = False  # the client left after the stream's terminal event: read the rest, reuse
    try:
        conn = await _send(state, client, headers, body, timer)
        if injected and conn.status in (400, 422):
            # The backend may not know stream_options: ask again exactly as the client did.
            await _discard_body(conn)
            refused = conn.status
            _release(state, conn)
            conn = await _send(state, client, headers, original_body, timer)
            if conn.status < 400:
                state.inject_usage = False
                log.warning(
                    "upstream refused stream_options.include_usage (status %d); "
                    "usage injection is now off for this backend",
                    refused,
                )
            injected = False
        del body, original_body, headers  # not sent again: not kept while the body streams
        client.release_body()
        up_headers = conn.headers
        content_type = up_headers.get("Content-Type", "")
        is_sse = content_type.startswith("text/event-stream")
        encoded = up_headers.get("Content-Encoding", "identity").lower() != "identity"
        decoding = None if timer is None or fmt is None else choose(fmt, content_type)
        if timer is None:
            pass
        elif encoded:
            state.sink.unobserved(state.backend, "encoded_response")
        elif decoding is None:
            state.sink.unobserved(state.backend, "content_type")
        out_headers = client_response_headers(up_headers, keep_length=not (is_sse and injected))
        del up_headers
        conn.forget_headers()  # copied into ``out_headers``: not kept while the body streams
        if timer is not None and (is_sse or decoding is Decoding.NDJSON):
            out_headers["X-Accel-Buffering"] = "no"
        status = conn.status
        # The front's head goes out with the body's first bytes when they were read with
        # it (one write, not two), else at once: either way inside ``relay.run``'s first
        # step, before anything is awaited.
        head = client.start_held(status, conn.reason, out_headers)
        if head is None:
            await client.start(status, conn.reason, out_headers)
            head = b""
        del out_headers
        started = True
        progress.status = status
        transport = client.transport
        if transport is None or transport.is_closing():
            return _client_left(status)
        chunked = client.chunked
        tail = client.end_held() or b""  # the chunked terminator goes with the last bytes
        capture = None
        if state.tracing is not None and timer is not None:
            capture = state.tracing.capture_buffer(timer)
        relay: BodyRelay
        if timer is None or fmt is None or encoded or decoding is None:
            relay = BodyRelay(conn, transport, chunked=chunked, capture=capture, head=head,
                              tail=tail)  # fmt: skip
        elif decoding is Decoding.SSE:
            timer.streamed = True
            relay = SseRelay(conn, transport, timer, state, fmt, chunked=chunked,
                             strip_usage=injected, capture=capture, head=head,
                             tail=tail)  # fmt: skip
        elif decoding is Decoding.NDJSON:
            timer.streamed = True
            relay = NdjsonRelay(conn, transport, timer, state, fmt, chunked=chunked,
                                capture=capture, head=head, tail=tail)  # fmt: skip
        else:
            relay = JsonRelay(conn, transport, timer, state, fmt, chunked=chunked,
                              capture=capture, head=head, tail=tail)  # fmt: skip
        del transport, head, tail
        # A body is cut (outcome timeout) after --max-stream-duration, or by the
        # watchdog once it falls silent (which expires the relay: no scope of its own).
        limit = cfg.max_stream_duration_s
        dog = state.watchdogs.watch(relay)
        try:
            if limit:
                async with asyncio.timeout(limit):
                    complete = await relay.run(client)
            else:
                complete = await relay.run(client)
        finally:
            state.watchdogs.unwatch(dog)
        if not complete:
            if _answered(timer):
                drain = True
                return by_status(status)
            return _client_left(status)
        if (
            timer is not None
            and timer.stream_error
            and (decoding is not Decoding.JSON or status < 400)
        ):
            result = stream_failed(status, timer, state)
        else:
            result = by_status(status)
        clean = True  # whatever the client does now, the upstream's answer was read whole
        try:
            await client.end()
        except ConnectionError:
            return result if _answered(timer) else _client_left(status)
        return result
    except asyncio.CancelledError:
        # The client went away (the front cancels its request): after the stream's
        # terminal event it had everything; the rest of the upstream's body is read.
        drain = started and _answered(timer)
        raise
    except TimeoutError:
        if not started:
            return no_answer_in_time(client, cfg.read_timeout_s)
        client.abort()
        return RelayResult(Outcome.TIMEOUT, progress.status, "timeout")
    except UpstreamError as exc:
        if not started:
            return no_answer(client, cfg.backend_label, exc.kind)
        client.abort()
        return RelayResult(Outcome.UPSTREAM_ERROR, progress.status, exc.kind)
    finally:
        # A response not read to its end must not go back to the pool: close it,
        # which also tells the backend to stop generating.
        if conn is not None:
            if clean:
                _release(state, conn)
            elif drain:
                conn.detach()
                _ = state.tasks.spawn(_drain(state, conn), name="tokenstamp-drain")
            else:
                conn.detach()
                conn.close()


def _answered(timer: StreamTimer | None) -> bool:
    """The stream's terminal event (``[DONE]``, ``message_stop``, ``response.completed``,
    ``done: true``) was relayed: a client that closes now has had the whole answer."""
    return timer is not None and timer.terminal_seen


DRAIN_S = 1.0
"""Longest the proxy reads an upstream body on after its client left at the terminal event."""
DRAIN_BYTES = 64 << 10
"""Most bytes it reads on: past this the connection is closed instead."""


async def _drain(state: ProxyState, conn: UpstreamConnection) -> None:
    """Read the rest of a body whose client left after its terminal event (its chunked
    terminator, a usage event), bounded in time and bytes; then the connection goes back
    to the pool when its answer ended cleanly, and is closed otherwise."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    discard = _Discard(done, DRAIN_BYTES)
    try:
        conn.consume(discard)
        conn.resume_reading()
        async with asyncio.timeout(DRAIN_S):
            await done
    except (TimeoutError, asyncio.CancelledError):
        conn.detach()
        conn.close()
        return
    if discard.over:
        conn.detach()
        conn.close()
        return
    _release(state, conn)


def _client_left(status: int) -> RelayResult:
    return RelayResult(Outcome.CLIENT_DISCONNECT, status, "client_disconnect", complete=False)


def _release(state: ProxyState, conn: UpstreamConnection) -> None:
    conn.detach()
    if state.pool is not None:
        state.pool.release(conn)
    else:
        conn.close()


async def _send(
    state: ProxyState,
    client: Inbound,
    headers: CIMultiDict[str],
    body: bytes,
    timer: StreamTimer | None,
) -> UpstreamConnection:
    """Send a request and wait for the response head (at most --read-timeout)."""
    pool = state.pool
    assert pool is not None, "the pool opens with the app"
    if state.tracing is not None and timer is not None:
        state.tracing.inject(timer, headers)  # the proxy's span becomes the upstream's parent
    target = pool.path_prefix + client.target
    head = request_head(client.method, target, pool.host_header, headers, len(body))
    conn = pool.idle()
    if conn is None:
        conn = await pool.connect()
    for attempt in (0, 1):
        pooled = conn.idle_since > 0
        # Stamped as the request is handed to the connection: on a pooled
        # keep-alive connection the bytes leave within microseconds.
        if timer is not None:
            timer.forwarded(state.clock())
        try:
            await conn.send(
                head,
                body,
                client.interim,
                head_only=client.method == "HEAD",
                timeout_s=state.config.read_timeout_s,
            )
        except (DisconnectedBeforeHead, ResetBeforeHead) as exc:
            conn.close()
            # A pooled keep-alive connection the backend had already closed (llama.cpp
            # closes after every stream while announcing keep-alive): the request never
            # got an answer, so it goes once more, on a fresh connection.
            if attempt or not (pooled or isinstance(exc, DisconnectedBeforeHead)):
                raise
            log.debug("upstream closed a connection before answering; retrying once")
            conn = await pool.connect()
            continue
        except BaseException:
            conn.close()
            raise
        return conn
    raise AssertionError("unreachable")


async def _discard_body(conn: UpstreamConnection) -> None:
    """Read the body to its end and drop it (an answer that is not relayed)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn.consume(_Discard(done))
    await done


class _Discard:
    """A ``BodyConsumer`` that drops the body and says when it ended (or, given ``limit``,
    when more than ``limit`` bytes came: ``over``)."""

    __slots__ = ("_done", "_left", "over")

    def __init__(self, done: asyncio.Future[None], limit: int = -1) -> None:
        self._done = done
        self._left = limit
        self.over = False

    def body(self, data: bytes, read_ns: int) -> None:
        """Dropped (counted against the limit)."""
        if self._left >= 0:
            self._left -= len(data)
            if self._left < 0:
                self.over = True
                self.end(None)

    def read_done(self) -> None:
        """Nothing held."""

    def end(self, error: UpstreamError | None) -> None:
        """Done, either way: the connection is not reused after an error."""
        if not self._done.done():
            self._done.set_result(None)
