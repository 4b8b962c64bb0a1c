"""Forwarding what the proxy does not observe, on aiohttp's client; the answers given when
no upstream response came.

Every request that is not an observed completion call (other routes and
methods, a body that is not JSON) goes upstream on aiohttp's pooled client and
its answer is copied back read by read (``proxy.edge.relay.relay_plain``).
aiohttp's client handles that hop's protocol: interim responses, framing,
keep-alive (the conformance suite, ``tests/conformance``, holds it to the same
rules as tokenstamp's own client).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict

from proxy.core.records import Outcome
from proxy.edge.headers import client_response_headers, upstream_request_headers
from proxy.edge.inbound import Inbound
from proxy.edge.relay import RelayResult, relay_plain
from proxy.edge.state import ProxyState
from proxy.edge.watchdog import ReaderProgress

log = logging.getLogger("tokenstamp.proxy")

# The client library would add these when the client did not send them: forward
# only what the client sent (Host and Content-Length are the hop's own).
_NO_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


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


async def forward_unobserved(
    client: Inbound, state: ProxyState, body: bytes, progress: Progress
) -> RelayResult:
    """Send an unobserved request upstream on aiohttp's client, relay the response; map
    failures to statuses or outcomes."""
    assert state.session is not None, "the upstream session opens with the app"
    cfg = state.config
    url = cfg.upstream + client.target
    headers = upstream_request_headers(
        client.headers,
        client_ip=client.remote,
        scheme=client.scheme,
        identity=False,
        trust=cfg.trust_forwarded,
    )
    started = False
    try:
        up = await send_unobserved(state, client.method, url, headers, body)
        del body
        client.release_body()
        clean = False
        try:
            await client.start(
                up.status, up.reason or "", client_response_headers(up.headers, keep_length=True)
            )
            started = True
            progress.status = up.status
            # Cut after --max-stream-duration, or by the watchdog once the body falls silent.
            limit = cfg.max_stream_duration_s or None
            async with (
                asyncio.timeout(limit) as deadline,
                state.watchdogs.watch(ReaderProgress(up.content), deadline),
            ):
                result = await relay_plain(up, client)
            if result.complete:
                try:
                    await client.end()
                except ConnectionError:
                    return RelayResult(Outcome.CLIENT_DISCONNECT, up.status,
                                       "client_disconnect", complete=False)  # fmt: skip
                clean = True
            return result
        finally:
            if clean:
                up.release()
            else:
                up.close()
    except TimeoutError:
        if not started:
            return no_answer_in_time(client, cfg.read_timeout_s)
        client.abort()
        return RelayResult(Outcome.TIMEOUT, progress.status, "timeout")
    except aiohttp.ClientError as exc:
        kind = type(exc).__name__
        if not started:
            return no_answer(client, cfg.backend_label, kind)
        client.abort()
        return RelayResult(Outcome.UPSTREAM_ERROR, progress.status, kind)


def no_answer_in_time(client: Inbound, read_timeout_s: float) -> RelayResult:
    msg = f"upstream did not answer within {read_timeout_s:g} s (--read-timeout)"
    client.refuse(504, "upstream_timeout", msg)
    return RelayResult(Outcome.TIMEOUT, 504, "timeout")


def no_answer(client: Inbound, backend_label: str, kind: str) -> RelayResult:
    msg = f"upstream {backend_label} {_NO_ANSWER.get(kind, 'failed')}: {kind}"
    client.refuse(502, "upstream_unreachable", msg)
    return RelayResult(Outcome.UPSTREAM_ERROR, 502, kind)


async def send_unobserved(
    state: ProxyState, method: str, url: str, headers: CIMultiDict[str], body: bytes
) -> aiohttp.ClientResponse:
    """Send an unobserved request on aiohttp's client."""
    assert state.session is not None
    try:
        return await state.session.request(
            method, url, headers=headers, data=body or None,
            allow_redirects=False, auto_decompress=False, skip_auto_headers=_NO_AUTO_HEADERS,
        )  # fmt: skip
    except aiohttp.ServerDisconnectedError:
        # A pooled keep-alive connection the backend had already closed (llama.cpp
        # closes after every stream while announcing keep-alive): the request never
        # got an answer, so it goes once more, on a fresh connection.
        log.debug("upstream closed a pooled connection before answering; retrying once")
        return await state.session.request(
            method, url, headers=headers, data=body or None,
            allow_redirects=False, auto_decompress=False, skip_auto_headers=_NO_AUTO_HEADERS,
        )  # fmt: skip
