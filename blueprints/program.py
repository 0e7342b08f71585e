"""The Pulumi program: read ``gpuinfra:cluster`` and build the cloud's GPU cluster component.

Run by ``pulumi up`` (through ``blueprints/__main__.py`` or a scaffolded ``program/``) and,
in-process under Pulumi mocks, by ``gpuinfra preview``.
"""

from __future__ import annotations

import pulumi

from gpuinfra.bake.model import BakeSpec
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
        # only the stack's cloud: each provider SDK (pulumi_aws / pulumi_gcp) takes seconds to import
        from blueprints.aws import AwsGpuCluster

        cluster: AwsGpuCluster | GcpGpuCluster = AwsGpuCluster(spec.stack, spec)
    else:
        # only the stack's cloud: each provider SDK (pulumi_aws / pulumi_gcp) takes seconds to import
        from blueprints.gcp import GcpGpuCluster

        cluster = GcpGpuCluster(spec.stack, spec)
    for key, value in cluster.exports().items():
        pulumi.export(key, value)
    return cluster


def build_bake(spec):
    """Create the image bake component of a bake stack (``gpuinfra:bake``) and export
    its outputs.

    Args:
        spec: a :class:`gpuinfra.bake.model.BakeSpec`.

    Returns:
        The component resource.
    """
    if spec.cloud == "aws":
        # only the stack's cloud: each provider SDK (pulumi_aws / pulumi_gcp) takes seconds to import
        from blueprints.aws.bake import AwsImageBake

        bake = AwsImageBake(spec.stack, spec)
    else:
        # only the stack's cloud: each provider SDK (pulumi_aws / pulumi_gcp) takes seconds to import
        from blueprints.gcp.bake import GcpImageBake

        bake = GcpImageBake(spec.stack, spec)
    for key, value in bake.exports().items():
        pulumi.export(key, value)
    return bake


def build_purchase(spec):
    """Create the purchase component of a purchase stack (``gpuinfra:purchase``, written by
    ``gpuinfra plan --buy``) and export its outputs.

    Args:
        spec: a :class:`gpuinfra.plan.purchase.PurchaseSpec` (an AWS Capacity Block or a GCP
            calendar-mode future reservation).

    Returns:
        The component resource.
    """
    if spec.cloud == "aws":
        # only a purchase stack loads its component (and its cloud's provider SDK)
        from blueprints.aws.purchase import AwsCapacityBlockPurchase

        purchase: AwsCapacityBlockPurchase | GcpCalendarReservation = AwsCapacityBlockPurchase(spec.stack, spec)
    else:
        # only a purchase stack loads its component (and its cloud's provider SDK)
        from blueprints.gcp.purchase import GcpCalendarReservation

        purchase = GcpCalendarReservation(spec.stack, spec)
    for key, value in purchase.exports().items():
        pulumi.export(key, value)
    return purchase


def main() -> None:
    """Program entry: load the spec of the selected stack (a cluster, an image bake when the
    stack has ``gpuinfra:bake``, a purchase when it has ``gpuinfra:purchase``) and build it."""
    bake = pulumi.Config("gpuinfra").get_object("bake")
    if bake is not None:
        build_bake(BakeSpec.from_config(bake))
        return
    purchase = pulumi.Config("gpuinfra").get_object("purchase")
    if purchase is not None:
        # the purchase spec model: only for purchase stacks
        from gpuinfra.plan.purchase import PurchaseSpec

        build_purchase(PurchaseSpec.from_config(purchase))
        return
    build(load_spec())
