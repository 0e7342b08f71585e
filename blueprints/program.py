"""The Pulumi program: read ``gpuinfra:cluster`` and build the cloud's GPU cluster component.

Run by ``pulumi up`` (through ``blueprints/__main__.py`` or a scaffolded ``program/``) and,
in-process under Pulumi mocks, by ``gpuinfra preview``.
"""

from __future__ import annotations

import pulumi

from gpuinfra.spec import ClusterSpec


def load_spec() -> ClusterSpec:
    """The validated cluster spec of the current stack.

    Raises:
        gpuinfra.errors.SpecError: missing or invalid ``gpuinfra:cluster``.
    """
    return ClusterSpec.from_config(pulumi.Config("gpuinfra").require_object("cluster"))


def build(spec: ClusterSpec):
    """Create the cluster component for ``spec`` and export its outputs.

    Returns:
        The component resource.
    """
    if spec.cloud == "aws":
        from blueprints.aws import AwsGpuCluster

        cluster = AwsGpuCluster(spec.stack, spec)
    else:
        from blueprints.gcp import GcpGpuCluster

        cluster = GcpGpuCluster(spec.stack, spec)
    for key, value in cluster.exports().items():
        pulumi.export(key, value)
    return cluster


def main() -> None:
    """Program entry: load the spec of the selected stack and build it."""
    build(load_spec())
