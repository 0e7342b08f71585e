"""``gpuinfra:aws:CapacityBlockPurchase``: buy one EC2 Capacity Block for ML.

Child ``<name>-block``: ``aws.ec2.CapacityBlockReservation`` (pulumi-aws 7:
``capacity_block_offering_id``, ``instance_platform``, ``tags``; EC2 ``PurchaseCapacityBlock``,
docs.aws.amazon.com/AWSEC2/latest/APIReference/API_PurchaseCapacityBlock.html) from the offering
``gpuinfra plan --buy`` chose. The block is paid up front and cannot be modified or cancelled
(docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-release.html): deleting the
resource refunds nothing, so it is ``protect=True`` (``pulumi destroy`` refuses it) and
``retain_on_delete=True``.

Exports: ``capacity_reservation_id`` (the ``cr-...`` to give ``gpuinfra new
--capacity-reservation``), ``start_date``, ``end_date``, ``upfront_usd``.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from gpuinfra.plan.purchase import CAPACITY_BLOCK_PLATFORM, PurchaseSpec


class AwsCapacityBlockPurchase(pulumi.ComponentResource):
    """The Capacity Block of ``spec`` (module docstring).

    Args:
        name: the purchase stack's name (child names derive from it).
        spec: the validated purchase spec.
    """

    def __init__(self, name: str, spec: PurchaseSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpuinfra:aws:CapacityBlockPurchase", name, None, opts)
        self.block = aws.ec2.CapacityBlockReservation(
            f"{name}-block",
            capacity_block_offering_id=spec.offering_id,
            instance_platform=CAPACITY_BLOCK_PLATFORM,
            tags=spec.aws_tags(),
            opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
        )
        self.spec = spec
        self.register_outputs({"capacity_reservation_id": self.block.id})

    def exports(self) -> dict[str, pulumi.Input]:
        """Stack outputs (module docstring)."""
        return {
            "capacity_reservation_id": self.block.id,
            "start_date": self.block.start_date,
            "end_date": self.block.end_date,
            "upfront_usd": self.spec.upfront_usd,
        }
