"""Fixtures for the dashboards and rules tests."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool; the rule tests need it (Debian: apt-get install prometheus)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Prometheus (Debian: apt-get install prometheus)")
    return path
