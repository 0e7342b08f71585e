"""Sanity gates every catalog must pass before it is written (snapshot build and refresh).

A catalog that fails a gate is never written: the previous one stays in use. The gates catch
the snapshot's known defects (data/snapshot/README.md: DWS prices posing as on-demand, spot
above on-demand):

* ``price-positive``: every price present is > 0 (a missing price is ``None``, never 0).
* ``aws-spot-not-above-on-demand``: a Spot Instance's default maximum price is the On-Demand
  price (docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-instances.html, "Pricing and
  savings"), so a spot price above on-demand is never what a default request pays: a data
  error (the snapshot's import drops such spot prices and counts them).
* ``aws-spot-not-below-10-percent-of-on-demand``: AWS sells Spot Instances "at up to a 90%
  discount compared to On-Demand prices" (aws.amazon.com/ec2/spot/, "Amazon EC2 Spot
  Instances"; aws.amazon.com/ec2/spot/pricing/), so a spot price below 10% of the same
  offer's on-demand price (by more than :data:`SPOT_PRICE_ROUNDING_USD`, the snapshot's
  4-decimal rounding) is no price AWS charges: a data error (the snapshot build drops such
  spot prices and counts them in ``catalog.json`` ``dropped_on_build``). A price just above
  the floor (p4d.24xlarge use1-az1 at 11%) passes: no cited source rules it out.
* ``gcp-on-demand-not-below-spot``: a GCP on-demand price below the same machine's spot
  price means one of them is from the wrong SKU (Spot VMs are discounted,
  cloud.google.com/compute/docs/instances/spot).
* ``gcp-on-demand-vs-us-central1``: a GCP on-demand price below 0.8x the same machine
  type's (same GPU count) on-demand price in us-central1. us-central1 is among the cheapest
  GCP regions for every GPU machine (cloud.google.com/compute/vm-instance-pricing lists
  regional prices); a price far below it is a discounted SKU posing as on-demand, as the
  DWS ("... attached to DWS Defined Duration VMs") GPU SKUs did at 0.45-0.55x. A machine
  type with no on-demand price in us-central1 (a3-megagpu-8g: Cyclenerd pricing.yml
  @dac31281 lists none there) is checked against the median of its on-demand prices over
  the regions that list one (lowest zone per region), so one discounted SKU among them is
  still caught; :func:`reference_prices` builds both. The reference
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
#: Lowest spot price AWS sells, as a fraction of on-demand: "up to a 90% discount"
#: (aws.amazon.com/ec2/spot/).
MIN_SPOT_FRACTION_OF_ON_DEMAND = Decimal("0.1")
#: Rounding allowed below that floor: the snapshot's spot prices have 4 decimal places.
SPOT_PRICE_ROUNDING_USD = Decimal("0.0001")


def aws_spot_below_floor(on_demand: Decimal | None, spot: Decimal | None) -> bool:
    """True when an AWS ``spot`` price (USD/h) is below :data:`MIN_SPOT_FRACTION_OF_ON_DEMAND`
    x ``on_demand`` by more than :data:`SPOT_PRICE_ROUNDING_USD` (False when either is None)."""
    if on_demand is None or spot is None:
        return False
    return spot + SPOT_PRICE_ROUNDING_USD < MIN_SPOT_FRACTION_OF_ON_DEMAND * on_demand


def _key(offer: Offer) -> tuple[str, str, int]:
    return (offer.instance_type, offer.gpu, offer.gpu_count)


def reference_prices(offers: Iterable[Offer]) -> dict[tuple[str, str, int], Decimal]:
    """The GCP on-demand reference per (machine type, GPU, GPU count): its lowest on-demand
    price in :data:`REFERENCE_REGION`; for a machine with none there, the median over regions of
    its lowest on-demand price per region (module docstring)."""
    by_region: dict[tuple[str, str, int], dict[str, Decimal]] = {}
    for o in offers:
        od = o.on_demand_price_per_hour_usd
        if o.cloud == "gcp" and od is not None:
            regions = by_region.setdefault(_key(o), {})
            regions[o.region] = min(regions.get(o.region, od), od)
    ref: dict[tuple[str, str, int], Decimal] = {}
    for k, regions in by_region.items():
        if REFERENCE_REGION in regions:
            ref[k] = regions[REFERENCE_REGION]
        else:
            ordered = sorted(regions.values())
            mid = len(ordered) // 2
            ref[k] = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
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
        if o.cloud == "aws" and aws_spot_below_floor(od, spot):
            failures.append(
                f"aws-spot-not-below-10-percent-of-on-demand: {where} spot {spot} < "
                f"{MIN_SPOT_FRACTION_OF_ON_DEMAND} x on-demand {od}"
            )
        if o.cloud == "gcp" and od is not None:
            if spot is not None and od < spot:
                failures.append(f"gcp-on-demand-not-below-spot: {where} on-demand {od} < spot {spot}")
            base = ref.get(_key(o))
            if base is not None and od < MIN_FRACTION_OF_REFERENCE * base:
                failures.append(
                    f"gcp-on-demand-vs-us-central1: {where} on-demand {od} < "
                    f"{MIN_FRACTION_OF_REFERENCE} x {base} ({REFERENCE_REGION} or the median region)"
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
