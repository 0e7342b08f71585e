"""GCP blueprint: :class:`GcpGpuCluster` and its topic modules (network, storage, nodes,
monitoring, bake); the plan and startup script are in :mod:`gpuinfra.plan`."""

from blueprints.gcp.cluster import GcpGpuCluster

__all__ = ["GcpGpuCluster"]
