"""One priced line of a cost estimate (:class:`CostLine`): the shape that
:mod:`gpuinfra.cost.estimate`, :mod:`gpuinfra.cost.monitoring` and :mod:`gpuinfra.cost.report`
share, kept apart so that neither of the first two has to import the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal


@dataclass
class CostLine:
    """One cost component of one resource.

    Attributes:
        resource: logical name of the resource.
        resource_type: Pulumi type token.
        component: what is charged (``Instance usage (on-demand, p5.48xlarge)``).
        unit: unit of ``hourly_quantity`` (``instance-hours``, ``GB-months``, ``GB`` ...).
        hourly_quantity: units consumed per hour of the run.
        unit_price_usd: USD per unit; None = price not found.
        source: where the unit price comes from; price_date: its date.
        usage_based: quantity comes from the usage estimate (profile defaults / --usage file).
        note: a remark shown next to the line.
        one_time: a charge paid once per run (moving the data set), spread over the run's
            hours like the per-run usage; the "left running" figure counts it once.
    """

    resource: str
    resource_type: str
    component: str
    unit: str
    hourly_quantity: Decimal
    unit_price_usd: Decimal | None
    source: str
    price_date: str
    usage_based: bool = False
    note: str = ""
    one_time: bool = False

    @property
    def hourly_usd(self) -> Decimal | None:
        """USD per hour of the run (None when the price was not found)."""
        return None if self.unit_price_usd is None else self.hourly_quantity * self.unit_price_usd
