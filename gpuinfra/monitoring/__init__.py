"""GPU monitoring: what the nodes' agents collect, the dashboards and idle alarms built on it,
and ``gpuinfra status`` (utilization now and over the last hour, cost so far and to the TTL).

Layers: :mod:`~gpuinfra.monitoring.metrics` (metric names, agent configurations, series
counts: pure data), :mod:`~gpuinfra.monitoring.dashboards` (dashboard bodies and alarm
filters: pure), :mod:`~gpuinfra.monitoring.status` (the figures ``status`` shows: pure),
:mod:`~gpuinfra.services.monitoring_sources` (reads EC2/CloudWatch and Compute/Cloud Monitoring),
:mod:`~gpuinfra.monitoring.render` (terminal view) and :mod:`~gpuinfra.monitoring.html`
(self-contained plotly page).
"""
