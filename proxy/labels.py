"""Bounded model labels: an allowlist, or the first N distinct names, then ``other``."""

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
