"""The purchase spec (``gpuinfra:purchase``): capacity that ``gpuinfra plan --buy`` chose to buy.

Pure data, no Pulumi imports. A purchase stack (``stacks/Pulumi.<name>.yaml``) holds one
purchase; its program (:func:`blueprints.program.build_purchase`) registers the cloud resource
that buys it:

* ``capacity-block``: an EC2 Capacity Block for ML bought from a ``DescribeCapacityBlockOfferings``
  offering (``aws.ec2.CapacityBlockReservation``: ``capacity_block_offering_id`` and
  ``instance_platform``; EC2 ``PurchaseCapacityBlock``,
  docs.aws.amazon.com/AWSEC2/latest/APIReference/API_PurchaseCapacityBlock.html). It is paid up
  front and "You can't modify or cancel a Capacity Block"
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-release.html): destroying the
  Pulumi resource refunds nothing, so the resource is protected and the spec records the amount
  the user confirmed.

* ``calendar-reservation``: a GCP future reservation request in calendar mode
  (``gcp.compute.FutureReservation`` with ``reservation_mode`` ``CALENDAR`` and ``planning_status``
  ``SUBMITTED``; cloud.google.com/compute/docs/instances/create-future-reservations-calendar-mode):
  the machine type and count in one zone for the window ending at the deadline. Google Cloud
  approves or declines it (cloud.google.com/compute/docs/instances/future-reservations-calendar-mode-overview);
  it is priced at the catalog's DWS rate for the whole window and bought only with that amount
  confirmed.

The spec records the offering's window, fee, its source and date, and the cluster stack meant
to use it, so ``new --capacity-reservation`` prices the block at the fee bought
(:func:`gpuinfra.stackfile.purchased_block_price`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuinfra.spec import NEW_STACK_NAME_RE, REGION_RE, ZONE_RE, model_from_config

#: Key of the purchase spec in the stack config (``gpuinfra:purchase``).
PURCHASE_CONFIG_KEY = "purchase"
#: The platform gpuinfra's nodes run (a reservation takes only instances of its platform:
#: docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-using.html).
CAPACITY_BLOCK_PLATFORM = "Linux/UNIX"
_USD = r"^[0-9]{1,12}(\.[0-9]{1,6})?$"
#: Most VMs one calendar-mode request holds: "You can reserve between 1 and 80 GPU VMs per
#: request" (cloud.google.com/compute/docs/instances/create-future-reservations-calendar-mode,
#: Limitations for requests for GPU VMs).
CALENDAR_MAX_VMS = 80
#: Most instances of one Capacity Block gpuinfra buys (DescribeCapacityBlockOfferings'
#: ``InstanceCount``; the limit this spec has carried, not re-checked against a current page).
CAPACITY_BLOCK_MAX_INSTANCES = 64


class PurchaseSpec(BaseModel):
    """One purchase (module docstring).

    Attributes:
        schema_version: 1.
        stack: the purchase stack's name; cluster_stack: the cluster stack meant to use it.
        cloud / kind: ``aws`` / ``capacity-block``.
        region, availability_zone: where the block is.
        offering_id: ``cb-...`` (``capacityBlockOfferingId``), Capacity Blocks only.
        gcp_project: the project of a calendar-mode request (else the ``gcp:project`` config).
        instance_type / instance_count: what it holds.
        start / end: the block's window (UTC).
        upfront_usd: the offering's fee (USD, :func:`gpuinfra.money.usd_json` form); price_source /
            price_date: where and when it was read.
        confirmed_non_refundable_usd: the amount the user confirmed (``--confirm-non-refundable``),
            equal to ``upfront_usd``.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    stack: str = Field(pattern=NEW_STACK_NAME_RE.pattern)
    cluster_stack: str = Field(pattern=NEW_STACK_NAME_RE.pattern)
    cloud: Literal["aws", "gcp"] = "aws"
    kind: Literal["capacity-block", "calendar-reservation"] = "capacity-block"
    region: str = Field(pattern=REGION_RE.pattern)
    availability_zone: str = Field(pattern=ZONE_RE.pattern)
    offering_id: str | None = Field(default=None, pattern=r"^cb-[0-9a-f]{8,17}$")
    gcp_project: str | None = Field(default=None, pattern=r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
    instance_type: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,40}$")
    instance_count: int = Field(ge=1, le=CALENDAR_MAX_VMS, strict=True)
    start: datetime
    end: datetime
    upfront_usd: str = Field(pattern=_USD)
    price_source: str = Field(min_length=1, max_length=300)
    price_date: str = Field(pattern=r"^20[0-9]{2}-[01][0-9]-[0-3][0-9]$")
    confirmed_non_refundable_usd: str = Field(pattern=_USD)

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @model_validator(mode="after")
    def _window(self) -> PurchaseSpec:
        if self.end <= self.start:
            raise ValueError("end must be after start")
        if (self.kind == "capacity-block") != (self.cloud == "aws"):
            raise ValueError("a capacity-block is bought on aws, a calendar-reservation on gcp")
        if self.kind == "capacity-block" and self.instance_count > CAPACITY_BLOCK_MAX_INSTANCES:
            raise ValueError(f"a Capacity Block holds at most {CAPACITY_BLOCK_MAX_INSTANCES} instances")
        if (self.kind == "capacity-block") != (self.offering_id is not None):
            raise ValueError("offering_id is the Capacity Block offering: set for capacity-block only")
        return self

    def gcp_labels(self) -> dict[str, str]:
        """Labels of a calendar-mode request's description (GCP label rules: lowercase, digits, ``-``)."""
        return {"gpuinfra-stack": self.stack, "gpuinfra-cluster-stack": self.cluster_stack}

    def aws_tags(self) -> dict[str, str]:
        """Tags of the purchased block: the purchase stack, the cluster stack and the fee."""
        return {
            "gpuinfra:stack": self.stack,
            "gpuinfra:cluster-stack": self.cluster_stack,
            "gpuinfra:purchase": self.kind,
            "gpuinfra:upfront-usd": self.upfront_usd,
        }

    def to_config(self) -> dict[str, Any]:
        """The JSON-compatible mapping stored under ``gpuinfra:purchase``."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_config(cls, value: Any) -> PurchaseSpec:
        """Parse ``gpuinfra:purchase``.

        Raises:
            SpecError: not a mapping, or the first invalid field with its path.
        """
        return model_from_config(cls, value, f"gpuinfra:{PURCHASE_CONFIG_KEY}", "gpuinfra plan --buy")
