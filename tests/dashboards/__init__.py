"""Tests of the Grafana dashboards and Prometheus rules (``dashboards/``)."""
