"""Proxy configuration: one validated, frozen object built from flags and environment.

Every ``serve`` flag can also be given as ``TOKENSTAMP_<FLAG>`` (upper case,
dashes to underscores); a flag on the command line wins. Validation happens
here, at start-up, and a bad value raises ``ConfigError`` naming the key.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from exporters.names import HistogramAggregation
from proxy.core.labels import CREDENTIAL_HEADERS

ENV_PREFIX = "TOKENSTAMP_"


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and why."""


@dataclass(frozen=True, slots=True)
class HostPort:
    """A listen address."""

    host: str
    """Interface to bind."""
    port: int
    """TCP port (0 = any free port)."""

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Everything ``tokenstamp serve`` runs with."""

    upstream: str
    """Base URL of the inference backend, e.g. ``http://127.0.0.1:8000``."""
    listen: HostPort = HostPort("127.0.0.1", 8080)
    """Where clients connect."""
    admin: HostPort = HostPort("127.0.0.1", 9464)
    """Where ``/metrics``, ``/healthz`` and ``/readyz`` are served."""
    backend_name: str = ""
    """``server.address`` label; defaults to the upstream's host:port."""
    provider: str = "openai"
    """``gen_ai.provider.name`` label (vllm, sglang, tgi, llama.cpp, ollama, openai...)."""
    max_body_bytes: int = 32 << 20
    """Largest request body accepted; larger gets 413."""
    body_budget_bytes: int = 0
    """Request-body bytes held at once across all connections; a body that does not fit gets
    503 with ``Retry-After``. 0: a quarter of the memory the process may use (the cgroup's
    limit, else RAM), at least ``max_body_bytes``."""
    max_event_bytes: int = 1 << 20
    """Largest stream event decoded; larger events are skipped (bytes still flow)."""
    connect_timeout_s: float = 10.0
    """Upstream connect timeout (then 502... or 504 when it timed out)."""
    read_timeout_s: float = 600.0
    """Longest silence allowed from the upstream, including a long prefill."""
    model_label_limit: int = 20
    """Distinct model label values before the rest become ``other``."""
    model_allowlist: tuple[str, ...] = ()
    """If set, only these model names become labels."""
    inject_usage: bool = True
    """Ask streaming upstreams for usage and hide the usage chunk from clients."""
    slo_ttft_s: float = 2.0
    """TTFT target for the SLO counter (goodput)."""
    slo_tpot_s: float = 0.1
    """TPOT target for the SLO counter (goodput)."""
    slo_answer_ttft_s: float = 0.0
    """Time-to-first-answer-token target for the SLO counter (what a reasoning model's user
    waits for); 0: off, the SLO judges TTFT and TPOT only."""
    slo_ttft_header: str = "x-slo-ttft-ms"
    """Request header with the request's own TTFT target in milliseconds (the Gateway API
    Inference Extension's); a request that carries it is judged against it."""
    slo_tpot_header: str = "x-slo-tpot-ms"
    """Request header with the request's own TPOT target in milliseconds."""
    tenant_headers: tuple[str, ...] = ()
    """Request headers naming the tenant, first present wins; empty: no tenant label."""
    tenant_allowlist: tuple[str, ...] = ()
    """If set, only these tenants become labels; others become ``other``."""
    max_tenants: int = 20
    """Distinct tenant label values before the rest become ``other`` (without an allowlist)."""
    max_stream_duration_s: float = 0.0
    """Longest a response body may take from its first byte; 0: no limit."""
    header_timeout_s: float = 60.0
    """A client connection must deliver a complete request head within this many seconds
    of connecting or of its previous response (slowloris guard; also the idle keep-alive)."""
    body_timeout_s: float = 60.0
    """A request body must arrive within this many seconds (else 408)."""
    drain_delay_s: float = 0.0
    """On SIGTERM: seconds readiness reports 503 while still serving, before the listener
    closes, so a load balancer stops sending first."""
    drain_timeout_s: float = 30.0
    """On SIGTERM: how long open streams may finish before the process exits."""
    observe: bool = True
    """Time the observed routes' streams. False: every request is forwarded and relayed
    untouched, nothing of it timed or recorded but the ``observation_off`` count of
    ``tokenstamp_requests_unobserved_total`` (a kill switch that keeps the proxy in the path; the
    benchmark's ``tokenstamp-edge`` target measures the HTTP edge alone with it)."""
    stall_detection: bool = True
    """Watch all streams of the backend for stalls and name the prefills that caused them."""
    heap_trim: bool = True
    """On glibc, hand the C heap's free pages back to the OS once a second (``proxy.edge.heap``)."""
    stall_ratio: float = 3.0
    """A gap is a stall above ``stall_ratio`` x the stream's baseline (median recent gap)."""
    stall_floor_s: float = 0.05
    """A stall is also longer than this (no stutter is visible below it)."""
    stall_tolerance_s: float = 0.025
    """Slack when matching a culprit's first token to a stall's end (capped at half a step)."""
    otlp_endpoint: str = ""
    """OTLP/HTTP base URL for traces and metrics (``/v1/traces``, ``/v1/metrics`` appended);
    empty: ``OTEL_EXPORTER_OTLP_ENDPOINT`` if set, else no OTLP export."""
    otlp_histograms: HistogramAggregation = HistogramAggregation.EXPONENTIAL
    """How OTLP histograms are bucketed: base-2 ``exponential`` (OTLP ``ExponentialHistogram``,
    Prometheus native histograms on the way in) or each instrument's ``explicit`` buckets."""
    capture_content: bool = False
    """Record prompt and completion text on spans (``gen_ai.input/output.messages``)."""
    native_histograms: bool = True
    """Answer a scraper that prefers Prometheus's protobuf format with it, every histogram
    with its native (exponential) buckets too; False: text or OpenMetrics for every scraper."""
    timeline: bool = False
    """Serve ``/timeline`` on the admin listener (shows request metadata, never prompt text)."""
    timeline_window_s: float = 30.0
    """Seconds of streams, stalls and prefill windows the timeline keeps and shows."""
    log_level: str = "info"
    """Python logging level name."""
    loop: str = "auto"
    """Event loop: ``uvloop`` (libuv, less CPU per token), ``asyncio`` (the standard
    library's), or ``auto``: uvloop where it is installed."""
    advisor: bool = True
    """Fit each backend's cost model; serve ``/advice`` and its gauges (the chunk-size advisor)."""
    trust_forwarded: bool = True
    """The client is a trusted proxy (a gateway, an ingress): its ``X-Forwarded-*``,
    ``Forwarded`` and ``X-Real-IP`` pass on, the peer's address appended to
    ``X-Forwarded-For``. False: clients connect directly, so what they claim there is
    dropped and replaced by what the proxy sees."""

    @property
    def backend_label(self) -> str:
        """The ``server.address`` value in use."""
        if self.backend_name:
            return self.backend_name
        parts = urlsplit(self.upstream)
        return parts.netloc or self.upstream


def parse_host_port(key: str, value: str) -> HostPort:
    """``HOST:PORT`` (or ``[v6]:PORT``, or ``:PORT``) into a ``HostPort``."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return HostPort(host, int(port))


def _url(key: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {value!r}")
    try:
        _ = parts.port
    except ValueError as exc:
        raise ConfigError(f"{key}: bad port in {value!r}") from exc
    return value.rstrip("/")


def _positive(kind: Callable[[str], Any]) -> Callable[[str, str], Any]:
    def conv(key: str, value: str) -> Any:
        try:
            v = kind(value)
        except ValueError:
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if v <= 0:
            raise ConfigError(f"{key}: must be > 0, got {value!r}")
        return v

    return conv


def _nonneg_int(key: str, value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise ConfigError(f"{key}: expected a whole number, got {value!r}") from None
    if v < 0:
        raise ConfigError(f"{key}: must be >= 0, got {value!r}")
    return v


def _nonneg_float(key: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{key}: must be a finite number >= 0, got {value!r}")
    return v


def _ratio(key: str, value: str) -> float:
    v = _nonneg_float(key, value)
    if v <= 1:
        raise ConfigError(f"{key}: must be > 1, got {value!r}")
    return v


def _bool(key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _level(key: str, value: str) -> str:
    v = value.strip().lower()
    if v not in ("debug", "info", "warning", "error", "critical"):
        raise ConfigError(f"{key}: expected debug, info, warning, error or critical")
    return v


def _loop(key: str, value: str) -> str:
    v = value.strip().lower()
    if v not in ("auto", "asyncio", "uvloop"):
        raise ConfigError(f"{key}: expected auto, asyncio or uvloop, got {value!r}")
    if v == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ConfigError(f"{key}: uvloop is not installed (pip install uvloop), or use asyncio")
    return v


def _histograms(key: str, value: str) -> HistogramAggregation:
    v = value.strip().lower()
    try:
        return HistogramAggregation(v)
    except ValueError:
        choices = " or ".join(a.value for a in HistogramAggregation)
        raise ConfigError(f"{key}: expected {choices}, got {value!r}") from None


def _name(key: str, value: str) -> str:
    if not value.isprintable() or len(value) > 128:
        raise ConfigError(f"{key}: must be printable and at most 128 characters")
    return value


def _list(key: str, value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.split(",") if x.strip())


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""A header name (RFC 9110 section 5.1: a token)."""


def _header(key: str, value: str) -> str:
    name = value.strip().lower()
    if not _TOKEN.fullmatch(name):
        raise ConfigError(f"{key}: not a header name: {value!r}")
    return name


def _tenant_headers(key: str, value: str) -> tuple[str, ...]:
    names = tuple(_header(key, v) for v in _list(key, value))
    for name in names:
        if name in CREDENTIAL_HEADERS:
            raise ConfigError(
                f"{key}: {name!r} carries credentials, and a credential is never a label: "
                "name a header that says whose request it is (e.g. x-tenant)"
            )
    return names


@dataclass(frozen=True, slots=True)
class _Opt:
    flag: str
    field: str
    conv: Callable[[str, str], Any]
    help: str


SERVE_OPTIONS: tuple[_Opt, ...] = (
    _Opt("upstream", "upstream", _url, "inference backend base URL (required)"),
    _Opt("listen", "listen", parse_host_port, "proxy listen HOST:PORT (default 127.0.0.1:8080)"),
    _Opt("admin", "admin", parse_host_port, "admin HOST:PORT for /metrics, /healthz, /readyz "
         "(default 127.0.0.1:9464)"),
    _Opt("backend-name", "backend_name", _name, "server.address label (default: upstream "
         "host:port)"),
    _Opt("provider", "provider", _name, "gen_ai.provider.name label: vllm, sglang, tgi, llama.cpp, "
         "ollama, openai... (default openai)"),
    _Opt("max-body-bytes", "max_body_bytes", _positive(int), "largest request body; larger gets "
         "413 (default 33554432)"),
    _Opt("body-budget", "body_budget_bytes", _nonneg_int, "request-body bytes held at once "
         "across all connections; a body that does not fit gets 503 with Retry-After; 0: a "
         "quarter of the memory the process may use (cgroup limit, else RAM) (default 0)"),
    _Opt("max-event-bytes", "max_event_bytes", _positive(int), "largest stream event decoded; "
         "larger ones are skipped and counted, bytes still flow (default 1048576)"),
    _Opt("connect-timeout", "connect_timeout_s", _positive(float), "upstream connect timeout, "
         "seconds (default 10)"),
    _Opt("read-timeout", "read_timeout_s", _positive(float), "longest upstream silence, seconds, "
         "a long prefill included (default 600)"),
    _Opt("model-label-limit", "model_label_limit", _nonneg_int, "distinct model label values "
         "before the rest become 'other' (default 20)"),
    _Opt("model-allowlist", "model_allowlist", _list, "comma-separated model names allowed as "
         "labels; others become 'other'"),
    _Opt("inject-usage", "inject_usage", _bool, "ask streaming upstreams for usage and hide the "
         "usage chunk again: true/false (default true)"),
    _Opt("slo-ttft", "slo_ttft_s", _positive(float), "TTFT target, seconds (default 2)"),
    _Opt("slo-tpot", "slo_tpot_s", _positive(float), "TPOT target, seconds (default 0.1)"),
    _Opt("slo-answer-ttft", "slo_answer_ttft_s", _nonneg_float, "time-to-first-answer-token "
         "target, seconds: a request also meets the SLO only when its first answer (not "
         "reasoning) event came within it (default 0: off)"),
    _Opt("slo-ttft-header", "slo_ttft_header", _header, "request header carrying the request's "
         "own TTFT target in ms, judged instead of --slo-ttft (default x-slo-ttft-ms)"),
    _Opt("slo-tpot-header", "slo_tpot_header", _header, "request header carrying the request's "
         "own TPOT target in ms, judged instead of --slo-tpot (default x-slo-tpot-ms)"),
    _Opt("tenant-header", "tenant_headers", _tenant_headers, "request header naming the tenant, "
         "labelled tokenstamp_tenant on every request metric; repeatable or comma-separated, "
         "first present wins; never a credential header (default: none, no tenant label)"),
    _Opt("tenant-allow", "tenant_allowlist", _list, "comma-separated tenants allowed as labels; "
         "others become 'other'"),
    _Opt("max-tenants", "max_tenants", _nonneg_int, "distinct tenant label values before the "
         "rest become 'other' (default 20)"),
    _Opt("max-stream-duration", "max_stream_duration_s", _nonneg_float, "seconds a response may "
         "stream before it is cut (outcome timeout); 0: no limit (default 0)"),
    _Opt("header-timeout", "header_timeout_s", _positive(float), "seconds a client connection "
         "may take to send a complete request head, also the idle keep-alive (default 60)"),
    _Opt("body-timeout", "body_timeout_s", _positive(float), "seconds a request body may take "
         "to arrive; then 408 (default 60)"),
    _Opt("drain-delay", "drain_delay_s", _nonneg_float, "on SIGTERM, seconds /readyz reports "
         "503 while still serving, before the listener closes (default 0)"),
    _Opt("drain-timeout", "drain_timeout_s", _positive(float), "on SIGTERM, seconds open streams "
         "may take to finish (default 30)"),
    _Opt("observe", "observe", _bool, "time the observed routes' streams; false forwards "
         "every request untouched and records none (a kill switch): true/false (default "
         "true)"),
    _Opt("stall-detection", "stall_detection", _bool, "detect stalls and attribute them to "
         "prefills: true/false (default true)"),
    _Opt("stall-ratio", "stall_ratio", _ratio, "a gap longer than this many times the "
         "stream's median recent gap is a stall (default 3)"),
    _Opt("stall-floor", "stall_floor_s", _nonneg_float, "a stall is also longer than this many "
         "seconds (default 0.05)"),
    _Opt("stall-tolerance", "stall_tolerance_s", _nonneg_float, "seconds of slack when matching "
         "a culprit's first token to a stall's end, at most half a step (default 0.025)"),
    _Opt("otlp-endpoint", "otlp_endpoint", _url, "OTLP/HTTP collector base URL for spans and "
         "metrics, e.g. http://127.0.0.1:4318 (default: OTEL_EXPORTER_OTLP_ENDPOINT; unset: "
         "no OTLP export; the other OTEL_* variables apply)"),
    _Opt("otlp-histograms", "otlp_histograms", _histograms, "how OTLP histograms are "
         "bucketed: exponential (base-2 exponential histograms, at most 512 buckets; Prometheus "
         "stores them as native histograms) or explicit (each metric's fixed buckets, as "
         "/metrics has them) (default exponential)"),
    _Opt("capture-content", "capture_content", _bool, "record prompt and completion text on "
         "spans, capped at 16384 characters each: true/false (default false)"),
    _Opt("native-histograms", "native_histograms", _bool, "answer a scraper that prefers "
         "Prometheus's protobuf format (Prometheus with native histograms on) with it, every "
         "histogram with native buckets beside its classic ones; false: text or OpenMetrics "
         "only, classic buckets as before: true/false (default true)"),
    _Opt("timeline", "timeline", _bool, "serve the live token timeline page at /timeline on "
         "the admin listener; it shows request ids, models and prompt sizes, never prompt "
         "text: true/false (default false)"),
    _Opt("timeline-window", "timeline_window_s", _positive(float), "seconds of history the "
         "timeline keeps and shows (default 30)"),
    _Opt("heap-trim", "heap_trim", _bool, "on glibc, return the C heap's free pages to the OS "
         "once a second (malloc_trim, ~0.25 ms a call); keeps RSS flat: true/false (default "
         "true)"),
    _Opt("log-level", "log_level", _level, "debug, info, warning, error (default info)"),
    _Opt("loop", "loop", _loop, "event loop: uvloop, asyncio, or auto (uvloop where it is "
         "installed; default auto)"),
    _Opt("advisor", "advisor", _bool, "fit each backend's step cost from the streams and serve "
         "the chunk-size advice at /advice on the admin listener, with its gauges: true/false "
         "(default true)"),
    _Opt("trust-forwarded", "trust_forwarded", _bool, "clients are trusted proxies: pass their "
         "X-Forwarded-*, Forwarded and X-Real-IP on and append to X-Forwarded-For; false: drop "
         "them and set X-Forwarded-For/-Proto from the connection (default true)"),
)  # fmt: skip


_REPEATABLE = (_list, _tenant_headers)
"""Flags that may be given more than once (their values join, in order)."""


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every ``serve`` flag; values stay strings until ``build_config``."""
    for opt in SERVE_OPTIONS:
        env = ENV_PREFIX + opt.flag.upper().replace("-", "_")
        if opt.conv in _REPEATABLE:
            parser.add_argument(
                f"--{opt.flag}", dest=opt.field, metavar=opt.flag.split("-")[-1].upper(),
                action="append", help=f"{opt.help}; env {env}",
            )  # fmt: skip
            continue
        parser.add_argument(
            f"--{opt.flag}", dest=opt.field, metavar=opt.flag.split("-")[-1].upper(),
            nargs="?" if opt.conv is _bool else None, const="true" if opt.conv is _bool else None,
            help=f"{opt.help}; env {env}",
        )  # fmt: skip
        if opt.conv is _bool:
            parser.add_argument(
                f"--no-{opt.flag}", dest=opt.field, action="store_const", const="false",
                help=f"same as --{opt.flag} false",
            )  # fmt: skip


def build_config(args: argparse.Namespace, env: Mapping[str, str]) -> ProxyConfig:
    """Validate flags (which win) and ``TOKENSTAMP_*`` variables into a config."""
    values: dict[str, Any] = {}
    for opt in SERVE_OPTIONS:
        env_key = ENV_PREFIX + opt.flag.upper().replace("-", "_")
        raw = getattr(args, opt.field, None)
        if isinstance(raw, list):  # a repeatable flag: its values, in order
            raw = ",".join(raw)
        key = f"--{opt.flag}"
        if raw is None and env_key in env:
            raw, key = env[env_key], env_key
        if raw is not None:
            values[opt.field] = opt.conv(key, raw)
    if "upstream" not in values:
        raise ConfigError("--upstream: required (or set TOKENSTAMP_UPSTREAM)")
    cfg = ProxyConfig(**values)
    if cfg.listen == cfg.admin and cfg.listen.port != 0:
        raise ConfigError("--admin: must differ from --listen")
    if 0 < cfg.body_budget_bytes < cfg.max_body_bytes:
        raise ConfigError(f"--body-budget: must be 0 (automatic) or at least --max-body-bytes "
                          f"({cfg.max_body_bytes}), got {cfg.body_budget_bytes}")  # fmt: skip
    return cfg


def config_from_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProxyConfig:
    """Convenience for tests: parse ``serve`` flags from a list."""
    parser = argparse.ArgumentParser(prog="tokenstamp serve")
    add_serve_arguments(parser)
    return build_config(parser.parse_args(list(argv)), os.environ if env is None else env)
