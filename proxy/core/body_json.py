"""A request body's JSON object, parsed with orjson and exactly as the standard library would.

The proxy reads the model, ``stream``, the prompt and the rest from every
observed request body. ``json.loads`` costs about four times what
``orjson.loads`` does on a short body, but the two differ on some inputs, and
the proxy must read every body as it did with ``json``. Where orjson refuses
what ``json`` accepts (NaN and Infinity, a number beyond a float, a lone
surrogate, a byte order mark, UTF-16 or UTF-32 text, nesting of 1024 and more)
the body goes to ``json``. Where orjson accepts a body but would read it
differently, the body goes to ``json`` before orjson sees it:

- an integer beyond 64 bits: orjson makes it a float, ``json`` an exact ``int``.
  An integer of 18 digits or fewer always fits, so a run of 19 digits anywhere
  in the body (in a string too: harmless) sends it to ``json``;
- nesting between ``json``'s limit and orjson's (1024): ``json`` raises
  ``RecursionError`` at about 1000 levels less the caller's stack depth (read
  here as not JSON), orjson does not. A body of 1024 bytes or more with 512 or more ``[`` and ``{``
  goes to ``json``, so the depth at which ``json`` fails is never reached by
  orjson (a shorter body cannot nest 512 deep).

Both keep the last of duplicate keys at the place of the first, read floats
correctly rounded, and allow the same whitespace (RFC 8259 section 2).
``tests/proxy/core/test_body_json.py`` checks all of it against ``json``.
"""

from __future__ import annotations

import json
from typing import Any

from orjson import JSONDecodeError, loads

_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")
_LONG_NUMBER = b"0" * 19
"""Nineteen digits in a row once every digit is a ``0``: an integer orjson may not hold."""
_SHALLOW_BYTES = 1024
"""A body shorter than this cannot nest ``_DEEP`` levels."""
_DEEP = 512
"""Openers (``[`` and ``{``) from which a body goes to ``json``: well below its recursion limit."""


def parse_object(body: bytes) -> dict[str, Any] | None:
    """The body's JSON object; ``None`` when it is not JSON or not an object.

    Same result as ``json.loads(body)`` for every body, but ``None`` where that raises
    ``RecursionError`` (nested about 1000 deep): the body is then forwarded unobserved, as
    one that is not JSON, where the proxy used to answer 500 and lose the request.
    """
    if body.translate(_DIGITS).find(_LONG_NUMBER) < 0 and (
        len(body) < _SHALLOW_BYTES or body.count(b"[") + body.count(b"{") < _DEEP
    ):
        try:
            obj = loads(body)
        except JSONDecodeError:
            obj = _stdlib(body)  # what orjson refuses, json may accept
    else:
        obj = _stdlib(body)
    return obj if type(obj) is dict else None


def _stdlib(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # too deep for json: forwarded unread, as not JSON
        return None
