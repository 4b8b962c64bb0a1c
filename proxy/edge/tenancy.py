"""Whose request it is, and what it was promised: the tenant and the request's own SLO.

A model server is shared; the question after "is TTFT bad?" is "for whom?".
With ``--tenant-header`` the tenant is the first of those request headers
present, bounded by ``proxy.core.labels.TenantLabeler`` (an allowlist or the
first ``--max-tenants`` values, then ``other``; ``unknown`` when none is
present), and every request metric carries it. A credential header is refused
as a tenant source at start-up (``proxy.config``).

A gateway that routes on latency promises (the Gateway API Inference
Extension's ``x-slo-ttft-ms`` and ``x-slo-tpot-ms``) states them per request;
a request that carries them is judged against them instead of the proxy's
``--slo-ttft`` and ``--slo-tpot``. A malformed value is ignored (the default
applies) with a rate-limited warning, never a refusal. Both kinds of header
reach the backend unchanged.
"""

from __future__ import annotations

import logging
import math

from proxy.config import ProxyConfig
from proxy.core.labels import TenantLabeler
from proxy.core.ratelog import RateLimitedLog
from proxy.edge.headers import Headers

log = logging.getLogger("tokenstamp.proxy")
_malformed = RateLimitedLog(log)
"""A client can send a malformed target with every request."""

MAX_TARGET_MS = 86_400_000.0
"""A target above a day is not a latency promise: ignored as malformed."""


def tenant_of(headers: Headers, config: ProxyConfig, labeler: TenantLabeler | None) -> str:
    """The tenant label of a request (empty when tenants are not labelled)."""
    if labeler is None:
        return ""
    for name in config.tenant_headers:
        value = headers.get(name)
        if value:
            return labeler.label(value.strip())
    return labeler.label(None)


def _target_s(headers: Headers, name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        ms = float(raw.strip())
    except ValueError:
        ms = math.nan
    if not math.isfinite(ms) or not 0 < ms <= MAX_TARGET_MS:
        _malformed.warning("ignored a malformed %s header (a target in milliseconds, "
                           "> 0): the default target applies", name)  # fmt: skip
        return None
    return ms / 1000.0


def request_slo(headers: Headers, config: ProxyConfig) -> tuple[float | None, float | None]:
    """The request's own TTFT and TPOT targets in seconds, each ``None`` when absent or
    malformed."""
    return _target_s(headers, config.slo_ttft_header), _target_s(headers, config.slo_tpot_header)
