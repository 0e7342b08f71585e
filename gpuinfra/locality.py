"""Data locality: what it costs to bring the training data to a cluster, and which offer is the
cheapest *run* (compute for the run's hours plus moving the data once).

Transfer rules (prices from ``prices.yaml``, each with its source):

* data and cluster in the same cloud and region: free (S3 to EC2 in one region,
  aws.amazon.com/s3/pricing "Data Transfer"; Cloud Storage to Compute Engine in one region,
  cloud.google.com/storage/pricing "Data transfer within Google Cloud");
* same cloud, another region: AWS inter-region transfer out of the bucket's region
  (``aws.inter_region_transfer_per_gb``); Cloud Storage transfer between regions (same
  continent or across) has no price read for gpuinfra yet, so it is unknown;
* another cloud: S3 internet egress from the bucket's region (``aws.internet_egress_per_gb``) or
  Cloud Storage download to the internet by destination group
  (``gcp.gcs_internet_egress_per_gb``); ingress is free on both clouds ("$0.000 per GB - data
  transfer in", AWS Price List; "No charge for inbound data transfer", cloud.google.com/vpc/pricing).

AWS inter-region prices are keyed by the source region; a few pairs are cheaper (us-east-1 to
us-east-2), so the estimate errs high there.

A route without a price is never counted as free: the offer's run cost is unknown and it is
ranked after every priced one, with the missing price named.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from gpuinfra.catalog.prices import Price, price
from gpuinfra.datasource import GCS_MULTI_REGIONS
from gpuinfra.offers import RankedOffer
from gpuinfra.spec import DataSource

#: GCP region prefix -> continent as Cloud Storage's transfer prices group them
#: (cloud.google.com/storage/pricing, "Data transfer within Google Cloud").
GCP_CONTINENTS: dict[str, str] = {
    "us": "northamerica",
    "northamerica": "northamerica",
    "southamerica": "southamerica",
    "europe": "europe",
    "asia": "asia",
    "australia": "oceania",
    "me": "middleeast",
    "africa": "africa",
}


def gcp_continent(location: str) -> str | None:
    """Continent of a GCP region or Cloud Storage multi-/dual-region (``us-central1`` -> ``northamerica``)."""
    if location in GCS_MULTI_REGIONS:
        return GCP_CONTINENTS.get(GCS_MULTI_REGIONS[location])
    return GCP_CONTINENTS.get(location.split("-", 1)[0])


def gcs_destination_group(aws_region: str) -> str:
    """Cloud Storage internet-egress destination group of an AWS region: ``apac`` for Asia
    Pacific (``ap-``), ``australia`` (Sydney, Melbourne), ``china`` (``cn-``), else
    ``worldwide-excluding-asia-australia`` (Billing Catalog "Download ..." SKUs)."""
    if aws_region in ("ap-southeast-2", "ap-southeast-4"):
        return "australia"
    if aws_region.startswith("cn-"):
        return "china"
    if aws_region.startswith("ap-"):
        return "apac"
    return "worldwide-excluding-asia-australia"


#: Bytes in a GB and a GiB: Cloud Storage and Compute Engine network prices are per GiB
#: (Billing Catalog usage unit ``GiBy``), AWS transfer prices per GB.
GIB_PER_GB = Decimal(10**9) / Decimal(2**30)


@dataclass(frozen=True)
class TransferQuote:
    """Moving a data set once to one cluster region.

    Attributes:
        gb: decimal GB moved.
        route: plain words (``same region: free``, ``S3 us-east-1 -> us-west-2``).
        price_per_gb: USD per unit (GB on AWS, GiB on GCP) with its source; ``None`` when no
            price is known (not free).
        free: True when the route is free by the clouds' rules.
        per_gib: the price is per GiB (GCP), so the quantity is converted.

    The first-tier rate is applied to the whole data set (AWS "first 10 TB / month", Cloud
    Storage "0-1 TiB"): for bigger data sets the estimate errs high.
    """

    gb: Decimal
    route: str
    price_per_gb: Price | None
    free: bool = False
    per_gib: bool = False

    @property
    def unit(self) -> str:
        """``GiB`` or ``GB``: the unit the price is quoted in."""
        return "GiB" if self.per_gib else "GB"

    @property
    def quantity(self) -> Decimal:
        """The data set in the price's unit."""
        return self.gb * GIB_PER_GB if self.per_gib else self.gb

    @property
    def usd(self) -> Decimal | None:
        """Total USD for the transfer; None when the price is unknown."""
        if self.free:
            return Decimal(0)
        # not rounded here: amounts are rounded once, when written (gpuinfra/money.py)
        return None if self.price_per_gb is None else self.quantity * self.price_per_gb.usd


def quote_transfer(data: DataSource, cloud: str, region: str) -> TransferQuote:
    """Price moving ``data`` to a cluster in ``cloud`` / ``region`` (rules in the module docstring)."""
    gb = data.size_gb
    if data.cloud == cloud and data.location == region:
        return TransferQuote(gb, "same region: free", None, free=True)
    if data.cloud != cloud:
        route = f"internet egress from {data.cloud} {data.location} to {cloud} {region}"
        if data.cloud == "aws":
            return TransferQuote(gb, route, price("aws", "internet_egress_per_gb", data.location))
        return TransferQuote(
            gb, route, price("gcp", "gcs_internet_egress_per_gb", gcs_destination_group(region)), per_gib=True
        )
    if cloud == "aws":
        return TransferQuote(
            gb,
            f"S3 {data.location} -> {region} (inter-region)",
            price("aws", "inter_region_transfer_per_gb", data.location),
        )
    # Cloud Storage transfer between regions: no price read for gpuinfra yet (module docstring)
    source, target = gcp_continent(data.location), gcp_continent(region)
    scope = "same continent" if source is not None and source == target else "between continents"
    return TransferQuote(gb, f"Cloud Storage {data.location} -> {region} ({scope}; no price read)", None, per_gib=True)


@dataclass(frozen=True)
class RunCost:
    """One ranked offer priced for a whole run with its data.

    Attributes:
        ranked: the offer (compute $/h for all nodes).
        hours: run length.
        transfer: moving the data set once.
    """

    ranked: RankedOffer
    hours: Decimal
    transfer: TransferQuote

    @property
    def compute_usd(self) -> Decimal:
        """Compute for the run: $/h x hours."""
        return self.ranked.price_per_hour_usd * self.hours

    @property
    def run_usd(self) -> Decimal | None:
        """Compute + transfer; None when the transfer price is unknown."""
        moved = self.transfer.usd
        return None if moved is None else self.compute_usd + moved


def rank_runs(ranked: list[RankedOffer], data: DataSource, hours: Decimal) -> list[RunCost]:
    """Order offers by run cost (compute x hours + data transfer), cheapest first.

    Offers whose transfer has no price come last (in compute order); ties keep the compute
    order (``find_offers``' order).

    Raises:
        ValueError: ``hours`` is not positive.
    """
    if hours <= 0:
        raise ValueError(f"hours must be > 0, got {hours}")
    runs = [RunCost(r, hours, quote_transfer(data, r.offer.cloud, r.offer.region)) for r in ranked]
    order = {id(r): i for i, r in enumerate(runs)}
    return sorted(runs, key=lambda r: (r.run_usd is None, r.run_usd if r.run_usd is not None else 0, order[id(r)]))


def cheapest_gpu_note(runs: list[RunCost]) -> str | None:
    """A sentence when the cheapest GPU offer is not the cheapest run, else None.

    Args:
        runs: :func:`rank_runs` output.
    """
    priced = [r for r in runs if r.run_usd is not None]
    if not priced:
        return None
    best_run = priced[0]
    best_gpu = min(runs, key=lambda r: r.ranked.price_per_hour_usd)
    if (
        best_gpu.ranked.offer == best_run.ranked.offer
        or best_gpu.ranked.price_per_hour_usd == best_run.ranked.price_per_hour_usd
    ):
        return None
    o, b = best_gpu.ranked.offer, best_run.ranked.offer
    gpu_run = best_gpu.run_usd
    saving = (
        ""
        if gpu_run is None or best_run.run_usd is None
        else f"; it saves ${gpu_run - best_run.run_usd:,.2f} over {best_run.hours:g} h"
    )
    moved = best_gpu.transfer.usd
    return (
        f"the cheapest GPU offer ({o.cloud} {o.zone} {o.instance_type}, ${best_gpu.ranked.price_per_hour_usd:,.2f}/h) "
        f"is not the cheapest run: moving the data there costs "
        f"{'an unknown amount' if moved is None else f'${moved:,.2f}'} ({best_gpu.transfer.route}); "
        f"{b.cloud} {b.zone} {b.instance_type} runs for ${best_run.run_usd:,.2f}{saving}"
    )
