"""Sanity gates every catalog must pass before it is written (snapshot build and refresh).

A catalog that fails a gate is never written: the previous one stays in use. The gates catch
the snapshot's known defects (data/snapshot/README.md: DWS prices posing as on-demand, spot
above on-demand):

* ``price-positive``: every price present is > 0 (a missing price is ``None``, never 0).
* ``aws-spot-not-above-on-demand``: a Spot Instance's default maximum price is the On-Demand
  price (docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-instances.html, "Pricing and
  savings"), so a spot price above on-demand is never what a default request pays: a data
  error (the snapshot's import drops such spot prices and counts them).
* ``gcp-on-demand-not-below-spot``: a GCP on-demand price below the same machine's spot
  price means one of them is from the wrong SKU (Spot VMs are discounted,
  cloud.google.com/compute/docs/instances/spot).
* ``gcp-on-demand-vs-us-central1``: a GCP on-demand price below 0.8x the same machine
  type's (same GPU count) on-demand price in us-central1. us-central1 is among the cheapest
  GCP regions for every GPU machine (cloud.google.com/compute/vm-instance-pricing lists
  regional prices); a price far below it is a discounted SKU posing as on-demand, as the
  DWS ("... attached to DWS Defined Duration VMs") GPU SKUs did at 0.45-0.55x. The reference
  must be independent of the prices checked where a discounted SKU could also sit in
  us-central1: ``catalog refresh`` uses the higher of the shipped catalog's (cited) and the
  fresh us-central1 price; the snapshot build's on-demand prices are the cited table itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from gpuinfra.catalog.model import MARKETS, Offer
from gpuinfra.errors import CatalogGateError

REFERENCE_REGION = "us-central1"
MIN_FRACTION_OF_REFERENCE = Decimal("0.8")


def _key(offer: Offer) -> tuple[str, str, int]:
    return (offer.instance_type, offer.gpu, offer.gpu_count)


def reference_prices(offers: Iterable[Offer]) -> dict[tuple[str, str, int], Decimal]:
    """Lowest GCP on-demand price per (machine type, GPU, GPU count) in :data:`REFERENCE_REGION`."""
    ref: dict[tuple[str, str, int], Decimal] = {}
    for o in offers:
        if o.cloud == "gcp" and o.region == REFERENCE_REGION and o.on_demand_price_per_hour_usd is not None:
            k = _key(o)
            ref[k] = min(ref.get(k, o.on_demand_price_per_hour_usd), o.on_demand_price_per_hour_usd)
    return ref


def gate_failures(offers: Iterable[Offer], reference: dict[tuple[str, str, int], Decimal] | None = None) -> list[str]:
    """Every gate failure of ``offers`` (empty list: the catalog may be written).

    Args:
        offers: the offers about to be written (both clouds).
        reference: us-central1 on-demand prices by (type, GPU, count); default: taken from
            ``offers`` themselves (a refresh limited to other regions passes the current
            catalog's).

    Returns:
        Lines like ``"gcp-on-demand-vs-us-central1: a2-highgpu-4g europe-west4-a 9.71 < 0.8 x 14.69354"``.
    """
    offers = list(offers)
    ref = reference_prices(offers) if reference is None else reference
    failures: list[str] = []
    for o in offers:
        where = f"{o.cloud} {o.instance_type} {o.gpu_count}x{o.gpu} {o.zone}"
        for market in MARKETS:
            p = o.price_per_hour_usd(market)
            if p is not None and p <= 0:
                failures.append(f"price-positive: {where} {market} price {p}")
        od, spot = o.on_demand_price_per_hour_usd, o.spot_price_per_hour_usd
        if o.cloud == "aws" and od is not None and spot is not None and spot > od:
            failures.append(f"aws-spot-not-above-on-demand: {where} spot {spot} > on-demand {od}")
        if o.cloud == "gcp" and od is not None:
            if spot is not None and od < spot:
                failures.append(f"gcp-on-demand-not-below-spot: {where} on-demand {od} < spot {spot}")
            base = ref.get(_key(o))
            if base is not None and od < MIN_FRACTION_OF_REFERENCE * base:
                failures.append(
                    f"gcp-on-demand-vs-us-central1: {where} on-demand {od} < "
                    f"{MIN_FRACTION_OF_REFERENCE} x {base} ({REFERENCE_REGION})"
                )
    return failures


def check_offers(offers: Iterable[Offer], reference: dict[tuple[str, str, int], Decimal] | None = None) -> None:
    """Raise when any gate fails.

    Raises:
        CatalogGateError: with every failure.
    """
    failures = gate_failures(offers, reference)
    if failures:
        raise CatalogGateError(failures)
