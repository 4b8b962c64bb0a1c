"""The timing core imports no framework: checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

CORE = [
    "proxy.decoders.sse",
    "proxy.decoders.openai",
    "proxy.timing",
    "proxy.records",
    "proxy.usage",
    "proxy.labels",
    "proxy.stalls",
    "proxy.stall_detector",
    "proxy.tokenlog",
]
FORBIDDEN = ("asyncio", "aiohttp", "prometheus_client", "opentelemetry")


def test_core_modules_import_no_framework():
    code = (
        "import importlib, json, sys\n"
        f"for m in {CORE!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    bad = [m for m in loaded if m.split(".")[0] in FORBIDDEN]
    assert bad == [], f"the pure core pulled in {bad}"
