"""Bounded label values from untrusted input.

Model names and tenants: an allowlist, or the first N distinct values, then ``other``.
Error types an upstream reports in its stream: the first N distinct, then ``_OTHER``.
"""

from __future__ import annotations

OTHER = "other"
UNKNOWN = "unknown"
_MAX_NAME = 128


class ModelLabeler:
    """Maps a client-supplied model name to a label value with bounded cardinality.

    With an allowlist, listed names pass and everything else is ``other``.
    Without one, the first ``limit`` distinct names pass, then ``other``.
    Names longer than 128 characters or with control characters are ``other``.
    """

    __slots__ = ("_allow", "_limit", "_seen")

    def __init__(self, limit: int, allowlist: tuple[str, ...] = ()) -> None:
        if limit < 0:
            raise ValueError("model label limit must be >= 0")
        self._limit = limit
        self._allow = frozenset(allowlist)
        self._seen: set[str] = set()

    def label(self, model: object) -> str:
        """The label value for ``model`` (anything the client sent)."""
        if not isinstance(model, str) or not model:
            return UNKNOWN
        if self._allow:
            return model if model in self._allow else OTHER
        if model in self._seen:
            return model
        if len(self._seen) >= self._limit or len(model) > _MAX_NAME or not model.isprintable():
            return OTHER
        self._seen.add(model)
        return model


CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie", "set-cookie"}
)
"""Request headers that carry credentials: never logged, never a label, never a tenant."""


class TenantLabeler:
    """Maps a tenant header's value to a label value with bounded cardinality.

    With an allowlist, listed values pass and everything else is ``other``;
    without one, the first ``limit`` distinct values pass, then ``other``. A
    missing or empty value is ``unknown``; one longer than 128 characters or
    with control characters is ``other``. ``folded`` counts the requests made
    ``other``.
    """

    __slots__ = ("_allow", "_limit", "_seen", "folded")

    def __init__(self, limit: int, allowlist: tuple[str, ...] = ()) -> None:
        if limit < 0:
            raise ValueError("tenant limit must be >= 0")
        self._limit = limit
        self._allow = frozenset(allowlist)
        self._seen: set[str] = set()
        self.folded = 0
        """Requests whose tenant was folded into ``other`` so far."""

    def label(self, value: str | None) -> str:
        """The label value of the tenant ``value`` (a header's, as the client sent it)."""
        if not value:
            return UNKNOWN
        if value in self._seen:
            return value
        if (
            (self._allow and value not in self._allow)
            or (not self._allow and len(self._seen) >= self._limit)
            or len(value) > _MAX_NAME
            or not value.isprintable()
        ):
            self.folded += 1
            return OTHER
        self._seen.add(value)
        return value


ERROR_OTHER = "_OTHER"
"""``error.type`` past the limit (the OpenTelemetry semantic conventions' fallback)."""
ERROR_KIND_LIMIT = 32
"""Distinct upstream error types kept as label values per proxy."""


class ErrorKindLabeler:
    """Bounds the ``error.type`` values an upstream can create.

    The proxy's own error types are a fixed set; the ones a backend reports
    inside its stream (``overloaded_error``, ``validation``...) are safe in form
    (the decoders pass identifiers only) but not in number: a backend could
    send a new one with every request. The first ``limit`` distinct values
    pass, later new ones are ``_OTHER``.
    """

    __slots__ = ("_limit", "_seen")

    def __init__(self, limit: int = ERROR_KIND_LIMIT) -> None:
        if limit < 0:
            raise ValueError("error kind limit must be >= 0")
        self._limit = limit
        self._seen: set[str] = set()

    def label(self, kind: str) -> str:
        """The label value for the upstream-reported ``kind``."""
        if kind in self._seen:
            return kind
        if len(self._seen) >= self._limit:
            return ERROR_OTHER
        self._seen.add(kind)
        return kind
