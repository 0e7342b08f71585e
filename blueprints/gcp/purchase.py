"""``gpuinfra:gcp:CalendarReservation``: a future reservation request in calendar mode.

Child ``<name>-request``: ``gcp.compute.FutureReservation`` (pulumi-gcp 10) with
``reservation_mode="CALENDAR"`` (Compute Engine API FutureReservation.ReservationMode: "The delivered
reservations will delivered at specified start time and terminated at specified end time along
with terminating the VMs running on it"), ``planning_status="SUBMITTED"`` (submitted for Google
Cloud's approval), ``time_window`` (start and end, RFC 3339), ``specific_sku_properties``
(machine type and count) in the zone, ``specific_reservation_required`` (only VMs that name it use
it) and ``auto_delete_auto_created_reservations`` (the delivered reservation goes at the end)
(cloud.google.com/compute/docs/instances/create-future-reservations-calendar-mode).

Exports: ``future_reservation`` (its name, for ``gcp_reservation`` of the cluster stack),
``start_time``, ``end_time``, ``price_usd``.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from gpuinfra.plan.purchase import PurchaseSpec


class GcpCalendarReservation(pulumi.ComponentResource):
    """The calendar-mode request of ``spec`` (module docstring).

    Args:
        name: the purchase stack's name (child names derive from it).
        spec: the validated purchase spec (``kind`` ``calendar-reservation``).
    """

    def __init__(self, name: str, spec: PurchaseSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpuinfra:gcp:CalendarReservation", name, None, opts)
        labels = spec.gcp_labels()
        self.request = gcp.compute.FutureReservation(
            f"{name}-request",
            name=f"{name}-request",
            project=spec.gcp_project,
            zone=spec.availability_zone,
            reservation_mode="CALENDAR",
            planning_status="SUBMITTED",
            specific_reservation_required=True,
            auto_delete_auto_created_reservations=True,
            description=f"gpuinfra {labels['gpuinfra-stack']} for {labels['gpuinfra-cluster-stack']}",
            time_window=gcp.compute.FutureReservationTimeWindowArgs(
                start_time=spec.start.strftime("%Y-%m-%dT%H:%M:%SZ"), end_time=spec.end.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
            specific_sku_properties=gcp.compute.FutureReservationSpecificSkuPropertiesArgs(
                total_count=str(spec.instance_count),
                instance_properties=gcp.compute.FutureReservationSpecificSkuPropertiesInstancePropertiesArgs(
                    machine_type=spec.instance_type
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.spec = spec
        self.register_outputs({"future_reservation": self.request.name})

    def exports(self) -> dict[str, pulumi.Input]:
        """Stack outputs (module docstring)."""
        return {
            "future_reservation": self.request.name,
            "start_time": self.spec.start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "end_time": self.spec.end.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "price_usd": self.spec.upfront_usd,
        }
