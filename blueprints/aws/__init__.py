"""AWS blueprint: :class:`AwsGpuCluster` and its topic modules (plan, network, storage,
identity, nodes, userdata)."""

from blueprints.aws.cluster import AwsGpuCluster

__all__ = ["AwsGpuCluster"]
