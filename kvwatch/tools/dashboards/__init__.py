"""Grafana dashboards and Prometheus recording rules generated from the engine-dialect table.

``python -m kvwatch.tools.dashboards`` rewrites ``dashboards/*.json`` and
``rules/prometheus/kvwatch-recording.yaml``; see ``docs/dashboards.md``.
"""
