"""GCP blueprint: :class:`GcpGpuCluster` and its topic modules (plan, network, storage, nodes,
startup)."""

from blueprints.gcp.cluster import GcpGpuCluster

__all__ = ["GcpGpuCluster"]
