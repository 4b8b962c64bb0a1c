"""``GET /advice`` on the admin listener, and the fit that runs once a second.

``Advisor`` owns one ``AdvisorObservations`` per backend. Once a second (a
background task, off the token path) it fits each backend and hands the
fitted parameters to ``publish`` (the Prometheus gauges). The fits and the
report run in a worker thread: they cost tens of milliseconds of CPU with a
full evidence buffer, which on the event loop would delay every stream's
next token by as much (and show in the very gaps the proxy measures). Only
the snapshots, copies well under a millisecond, are taken on the loop.

The first ``/advice`` asks the upstream which engine it is (``GET /v1/models``:
its ``Server`` header and the models' ``owned_by``, e.g. ``vllm``, ``llamacpp``,
``sglang``): one
request per proxy, sent only when someone asks for advice (a sidecar that is
not asked sends nothing of its own), never on a client's path. ``/advice`` fits
afresh and answers the JSON of ``proxy.advisor.report``: ``{"backends": [...]}``,
status 200 also when a backend has not enough data (its ``status`` says so).

Query parameters (all optional): ``prompt_tokens``, ``streams``,
``chunk_sizes`` (comma-separated, ``none`` for unchunked), ``itl_target``
(seconds), ``kv_transfer`` (seconds). A bad value answers 400 naming it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import hdrs, web

from proxy.advisor.fit import Fit, fit
from proxy.advisor.observations import AdvisorObservations, ObservationSnapshot
from proxy.advisor.report import AdviceOptions, advise
from proxy.core.backend_fit import BackendFitRecord

log = logging.getLogger("tokenstamp.advisor")

FIT_EVERY_S = 1.0
"""Seconds between two fits of the background task."""
PROBE_TIMEOUT_S = 5.0
"""Most the one engine probe of the upstream may take."""
PROBE_RETRY_S = 30.0
"""Least seconds between two probes while the upstream cannot be reached (an HTTP answer, any
status, is final: an upstream without ``/v1/models`` is not asked again)."""
PROBE_BODY_MAX = 1 << 20
"""Most bytes of the probe's answer read."""


async def probe_engine(upstream: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str | None]:
    """What the upstream says it is: its ``Server`` header and ``owned_by`` / ``id`` of the
    first model of ``GET /v1/models``; ``status``, the HTTP status (``None``: not reached);
    ``error`` when it could not be asked or did not answer 200."""
    out: dict[str, str | None] = {
        "server": None, "owned_by": None, "model": None, "status": None, "error": None,
    }  # fmt: skip
    url = upstream.rstrip("/") + "/v1/models"
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url) as resp,
        ):
            out["server"] = resp.headers.get(hdrs.SERVER)
            out["status"] = str(resp.status)
            body = await resp.content.read(PROBE_BODY_MAX)
            if resp.status != 200:
                out["error"] = f"GET /v1/models: HTTP {resp.status}"
                return out
        data = orjson.loads(body)
        models = data.get("data") if isinstance(data, dict) else None
        first = models[0] if isinstance(models, list) and models else None
        if isinstance(first, dict):
            for key, field in (("owned_by", "owned_by"), ("model", "id")):
                value = first.get(field)
                out[key] = value if isinstance(value, str) else None
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, OSError) as exc:
        out["error"] = f"GET /v1/models: {type(exc).__name__}"
    return out


class Advisor:
    """The advisor of every backend the proxy serves."""

    def __init__(
        self,
        observations: Sequence[AdvisorObservations],
        *,
        tpot_target_s: float,
        clock: Callable[[], int] = time.monotonic_ns,
        publish: Callable[[BackendFitRecord], None] | None = None,
        upstream: str | None = None,
    ) -> None:
        """``publish`` gets each backend's fit once a second (the gauges); ``upstream`` (its
        base URL) is asked once which engine it is, at the first ``/advice``."""
        self.observations = tuple(observations)
        """One per backend."""
        self.tpot_target_s = tpot_target_s
        """``--slo-tpot``: the capacity's target and the default ITL target."""
        self._clock = clock
        self._publish = publish
        self._upstream = upstream
        self.engine: dict[str, str | None] | None = None
        """What the upstream said it is (``probe_engine``); ``None`` until asked."""
        self._next_probe_s = 0.0

    async def refresh(self) -> list[tuple[Fit, ObservationSnapshot]]:
        """Fit every backend now (snapshots on the loop, where the observations change with
        every token; the fits in a worker thread, as the module says); publish on the loop."""
        now_ns = self._clock()
        snapshots = [obs.snapshot(now_ns) for obs in self.observations]
        fits = await asyncio.to_thread(_fit_all, snapshots)
        for fitted in fits:
            if self._publish is not None:
                try:
                    self._publish(fitted.fit_record)
                except Exception:  # telemetry never breaks traffic
                    log.exception("advisor: publishing the fit failed")
        return list(zip(fits, snapshots, strict=True))

    async def advice(self, options: AdviceOptions | None = None) -> dict[str, Any]:
        """The JSON document of ``/advice`` (the report, like the fit, off the loop)."""
        opts = options if options is not None else AdviceOptions(self.tpot_target_s)
        fitted = await self.refresh()
        engine = self.engine
        backends = await asyncio.to_thread(lambda: [advise(f, s, opts, engine) for f, s in fitted])
        return {"backends": backends}

    async def ask_engine(self) -> None:
        """Ask the upstream which engine it is, unless it answered already (any HTTP status
        is final) or could not be reached less than ``PROBE_RETRY_S`` ago."""
        if self._upstream is None or (self.engine is not None and self.engine["status"]):
            return
        now_s = self._clock() / 1e9
        if now_s < self._next_probe_s:
            return
        self._next_probe_s = now_s + PROBE_RETRY_S
        self.engine = await probe_engine(self._upstream)

    async def run(self, every_s: float = FIT_EVERY_S) -> None:
        """Fit and publish every ``every_s`` seconds, forever."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.refresh()
            except Exception:
                log.exception("advisor: fit failed")


def _fit_all(snapshots: Sequence[ObservationSnapshot]) -> list[Fit]:
    """Each snapshot's fit (pure: run in a worker thread)."""
    return [fit(snapshot) for snapshot in snapshots]


def options_from_query(query: Mapping[str, str], tpot_target_s: float) -> AdviceOptions:
    """``AdviceOptions`` from ``/advice``'s query; ValueError names a bad parameter."""
    known = {"prompt_tokens", "streams", "chunk_sizes", "itl_target", "kv_transfer"}
    for key in query:
        if key not in known:
            raise ValueError(f"{key}: unknown parameter (known: {', '.join(sorted(known))})")
    chunks = query.get("chunk_sizes")
    return AdviceOptions(
        tpot_target_s=tpot_target_s,
        prompt_tokens=_int(query, "prompt_tokens", 1),
        streams=_int(query, "streams", 0),
        chunk_sizes=parse_chunk_sizes(chunks) if chunks else AdviceOptions(0.0).chunk_sizes,
        itl_target_s=_seconds(query, "itl_target"),
        kv_transfer_s=_seconds(query, "kv_transfer") or 0.0,
    )


def parse_chunk_sizes(text: str) -> tuple[int | None, ...]:
    """``512,2048,none`` -> ``(512, 2048, None)``; ValueError on anything else."""
    out: list[int | None] = []
    for raw in text.split(","):
        part = raw.strip().lower()
        if part == "none":
            out.append(None)
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"chunk_sizes: expected integers >= 1 or 'none', got {part!r}")
        out.append(int(part))
    if not out:
        raise ValueError("chunk_sizes: empty")
    return tuple(out)


def _int(query: Mapping[str, str], key: str, minimum: int) -> int | None:
    value = query.get(key)
    if value is None:
        return None
    if not value.isdigit() or int(value) < minimum:
        raise ValueError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _seconds(query: Mapping[str, str], key: str) -> float | None:
    value = query.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{key}: expected seconds >= 0, got {value!r}")
    return number


ADVISOR: web.AppKey[Advisor] = web.AppKey("tokenstamp_advisor", Advisor)


async def _advice(request: web.Request) -> web.Response:
    advisor = request.app.get(ADVISOR)
    if advisor is None:
        return web.Response(
            status=404, text="The advisor is off: start the proxy with --advisor (the default).\n"
        )
    try:
        options = options_from_query(request.query, advisor.tpot_target_s)
    except ValueError as exc:
        return web.Response(status=400, text=f"{exc}\n")
    await advisor.ask_engine()
    body = orjson.dumps(await advisor.advice(options), option=orjson.OPT_INDENT_2)
    return web.Response(
        body=body, content_type="application/json", headers={"Cache-Control": "no-store"}
    )


def advice_routes(advisor: Advisor | None) -> Callable[[web.Application], None]:
    """Add ``GET /advice`` to an admin app (404 with a hint when ``advisor`` is ``None``)."""

    def add(app: web.Application) -> None:
        if advisor is not None:
            app[ADVISOR] = advisor
        app.router.add_get("/advice", _advice)

    return add
