"""AWS blueprint: :class:`AwsGpuCluster` and its topic modules (network, storage,
identity, nodes, monitoring, backstop, bake); the plan and user data are in
:mod:`gpuinfra.plan`."""

from blueprints.aws.cluster import AwsGpuCluster

__all__ = ["AwsGpuCluster"]
