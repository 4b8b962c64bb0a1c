"""The optional compiled build: ``TOKENSTAMP_COMPILE=1`` compiles the per-token modules with mypyc.

Everything about the package (metadata, packages, entry points) is in
``pyproject.toml``; this file only adds extension modules when asked. Without
the variable (the default, and what every editable install gets) tokenstamp is
pure Python. With it, the modules every token passes through are compiled from
the same source by mypyc (the type checker the project already passes), which
runs them as C: the same code, the same tests, about a sixth less CPU per
token (docs/benchmark.md). Build it without build isolation, from an
environment that has the dependencies and mypy installed, so mypyc sees the
same types as ``make lint``:

    TOKENSTAMP_COMPILE=1 pip install --no-build-isolation .

A module that fails to import compiled is a build error, never a silent
fallback: the pure-Python package is the fallback, installed without the variable.
"""

from __future__ import annotations

import os

from setuptools import setup

HOT_MODULES = [
    "proxy/core/timing.py",
    "proxy/core/decoders/sse.py",
    "proxy/core/decoders/openai.py",
    "proxy/core/decoders/shape.py",
    "proxy/core/backend_view.py",
    "proxy/core/stall_detector.py",
    "proxy/core/usage.py",
    "proxy/advisor/observations.py",
    "proxy/edge/relay.py",
    "proxy/edge/upstream.py",
    "proxy/edge/tracing.py",  # per request, but its timer subclasses the compiled one
    "exporters/fast_histogram.py",
]
"""What one token runs through, read by read (the profile in docs/benchmark.md)."""


def _ext_modules() -> list[object]:
    if os.environ.get("TOKENSTAMP_COMPILE") != "1":
        return []
    from mypyc.build import mypycify

    return list(mypycify(HOT_MODULES, opt_level="3"))


setup(ext_modules=_ext_modules())
