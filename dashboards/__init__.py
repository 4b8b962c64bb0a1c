"""Grafana dashboards and Prometheus rules for tokenstamp, kept like a monitoring mixin.

One ``Config`` (``dashboards.config``) holds the selectors, SLO targets,
burn-rate windows and stall thresholds; ``python -m dashboards.build`` turns it
into the committed dashboard JSON and rule YAML. Every metric name comes from
``exporters.names``. This package is a build tool: it is not part of the wheel.
"""

from dashboards.config import BurnWindow, Config

__all__ = ["BurnWindow", "Config"]
