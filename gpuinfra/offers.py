"""Offer ranking: which catalog offers fit a GPU request, cheapest first.

Rules:

* An offer **fits** a request for ``n`` GPUs of model ``M`` per node when it carries model
  ``M`` (exactly; memory variants never substitute) and ``n <= gpu_count <= 2n``. A round-up
  is allowed (AWS has no 4xA100 machine, so 4xA100 on AWS is a p4d.24xlarge with 8) but a
  round-up that would leave more than half of the paid GPUs idle is not a fit: ask for the
  larger count explicitly (``--gpus 8xH100``).
* Price is the total per hour for all ``nodes`` in the market asked for (on-demand by
  default, spot or flex-start); offers without a price in that market, or whose type the cloud
  does not sell in it (``InstanceFacts.provisioning_models``), are left out, never priced at $0.
* The commitment markets ``commit-1y`` / ``commit-3y`` rank by the committed hourly rate of
  the offer's type in its region (:mod:`gpuinfra.catalog.commitments`). A commitment is a
  billing construct over on-demand VMs, so only offers sold and priced on demand take part.
* Order: total $/h ascending; at equal price, exact GPU counts first; then cloud, region,
  zone, type for a stable result.
* AWS Local Zones are left out unless ``include_local_zones`` or the zone is named.
* A cluster never has more nodes than one request on its cloud may start (:func:`node_limit`):
  offers over the limit are left out, and a request that only such offers fit is refused
  naming the limit and its source.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from gpuinfra.catalog.commitments import COMMITMENT_MARKETS, CommitmentPrice
from gpuinfra.catalog.facts_model import InstanceFacts
from gpuinfra.catalog.model import MARKETS, Offer
from gpuinfra.catalog.store import Catalog
from gpuinfra.errors import CatalogError, NoOfferError, RequestError
from gpuinfra.requests import CLOUD_NODE_LIMITS, GpuRequest, NodeLimit, parse_gpu_spec

CLOUDS = ("aws", "gcp")
MAX_ROUND_UP_FACTOR = 2


@dataclass(frozen=True, slots=True)
class OfferQuery:
    """Filters for :func:`find_offers`.

    Attributes:
        request: the GPU request (model, GPUs per node, nodes).
        cloud: ``aws`` / ``gcp`` or None for both.
        region: region name or None.
        zone: AWS AZ ID (``use1-az4``) or GCP zone (``us-central1-a``) or None.
        instance_type: restrict to one type, or None.
        market: ``on-demand``, ``spot`` or ``flex-start`` (:data:`MARKETS`), or
            ``commit-1y`` / ``commit-3y`` (:data:`COMMITMENT_MARKETS`).
        include_local_zones: keep AWS Local Zones / Wavelength zones.
    """

    request: GpuRequest
    cloud: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    market: str = "on-demand"
    include_local_zones: bool = False


@dataclass(frozen=True, slots=True)
class OfferScope:
    """Where, and in which markets, configurations are looked for when no GPU request exists
    yet (``gpuinfra size`` and ``gpuinfra new --model``).

    Attributes:
        cloud, region, zone, instance_type, include_local_zones: as in :class:`OfferQuery`.
        markets: the markets tried, in order (:data:`MARKETS`): an offer counts when the
            cloud sells its type in one of them and the catalog prices it there; it is priced
            in the first such market (the planner's order, :func:`gpuinfra.planner.markets_tried`).
        image_fabric: the GPU fabric the node image carries (a bake's, ``PlanRequest.image_fabric``),
            which makes a type whose fabric cannot be installed at boot usable
            (:func:`gpuinfra.rules.spec_rules.type_fabric_blocker`).
    """

    cloud: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    markets: tuple[str, ...] = ("on-demand",)
    include_local_zones: bool = False
    image_fabric: str | None = None

    def market_of(self, catalog: Catalog, offer: Offer) -> str | None:
        """The first market of :attr:`markets` the offer is sold and priced in; None when
        none is, or when the offer lies outside the scope."""
        if not matches_location(offer, self):
            return None
        return next(
            (m for m in self.markets if offer.price_per_hour_usd(m) is not None and sold_as(catalog, offer, m)), None
        )

    def describe(self) -> str:
        """``" on gcp in us-central1"`` ("" for the whole catalog)."""
        parts = [
            f"on {self.cloud}" if self.cloud else "",
            f"in {self.zone or self.region}" if self.zone or self.region else "",
            f"as {self.instance_type}" if self.instance_type else "",
        ]
        return "".join(f" {p}" for p in parts if p)


class Located(Protocol):
    """The location filters of :class:`OfferQuery` and :class:`OfferScope`."""

    @property
    def cloud(self) -> str | None: ...
    @property
    def region(self) -> str | None: ...
    @property
    def zone(self) -> str | None: ...
    @property
    def instance_type(self) -> str | None: ...
    @property
    def include_local_zones(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RankedOffer:
    """An offer that fits, priced for the whole cluster.

    Attributes:
        offer: the catalog row (per-node prices).
        nodes: node count.
        market: which market ``price_per_hour_usd`` uses (:data:`MARKETS` or
            :data:`COMMITMENT_MARKETS`).
        requested_gpu_count: GPUs per node asked for (``offer.gpu_count`` may be larger).
        commitment: the committed rate when ``market`` is a commitment market, else None.
    """

    offer: Offer
    nodes: int
    market: str
    requested_gpu_count: int
    commitment: CommitmentPrice | None = None

    @property
    def spot(self) -> bool:
        """True when priced as spot."""
        return self.market == "spot"

    @property
    def price_per_hour_usd(self) -> Decimal:
        """Total $/h for all nodes in the market asked for."""
        price = self.market_price_per_hour_usd(self.market)
        assert price is not None  # filtered in find_offers
        return price

    def market_price_per_hour_usd(self, market: str) -> Decimal | None:
        """Total $/h for all nodes in ``market`` (None: no price known there; a commitment
        market other than the one ranked by is not looked up)."""
        if market in COMMITMENT_MARKETS:
            c = self.commitment if market == self.market else None
            return None if c is None else c.price_per_hour_usd * self.nodes
        p = self.offer.price_per_hour_usd(market)
        return None if p is None else p * self.nodes

    @property
    def total_gpus(self) -> int:
        """GPUs rented over all nodes (after any round-up)."""
        return self.offer.gpu_count * self.nodes

    @property
    def price_per_gpu_hour_usd(self) -> Decimal:
        """$/GPU-hour over the GPUs actually rented."""
        return self.price_per_hour_usd / self.total_gpus

    @property
    def round_up(self) -> bool:
        """True when the node has more GPUs than asked for."""
        return self.offer.gpu_count > self.requested_gpu_count

    @property
    def round_up_note(self) -> str:
        """Plain-language note for a round-up ("" when exact)."""
        if not self.round_up:
            return ""
        return (
            f"{self.offer.instance_type} has {self.offer.gpu_count}x{self.offer.gpu} per node; "
            f"you asked for {self.requested_gpu_count} (rounded up)"
        )


def _did_you_mean(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=3, cutoff=0.6)
    return f" Did you mean {', '.join(close)}?" if close else ""


def validate_location(catalog: Catalog, query: Located) -> None:
    """Check cloud, region, zone and instance type against the catalog.

    Raises:
        CatalogError: an unknown value, with the allowed values or the closest matches.
    """
    if query.cloud is not None and query.cloud not in CLOUDS:
        raise CatalogError(f"unknown cloud {query.cloud!r}; choose one of: {', '.join(CLOUDS)}")
    if query.region is not None:
        regions = catalog.regions(query.cloud)
        if query.region not in regions:
            raise CatalogError(
                _other_cloud("region", query.region, query.cloud, catalog.regions)
                or _unknown_region(query.region, query.cloud, regions)
            )
    if query.zone is not None:
        zones = catalog.zones(query.cloud, query.region)
        if query.zone not in zones:
            raise CatalogError(_zone_problem(catalog, query, zones))
    if query.instance_type is not None:
        types = catalog.instance_types(query.cloud)
        if query.instance_type not in types:
            raise CatalogError(
                f"unknown instance type {query.instance_type!r}"
                f"{' on ' + query.cloud if query.cloud else ''}."
                f"{_did_you_mean(query.instance_type, types)}"
            )


_NAMES = {"aws": "AWS", "gcp": "GCP"}
_ZONE_FORMS = {"aws": "AZ IDs such as use1-az4", "gcp": "named <region>-<letter>, such as us-central1-a"}


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "AEIOU" else f"a {word}"


def _unknown_region(region: str, cloud: str | None, regions: list[str]) -> str:
    where = f" for {cloud}" if cloud else ""
    return f"unknown region {region!r}{where}.{_did_you_mean(region, regions)} Known regions: {', '.join(regions)}."


def _other_cloud(kind: str, value: str, cloud: str | None, known) -> str | None:
    """ "'us-central1-a' is a gcp zone, not an aws one ..." when ``value`` belongs to the other
    cloud; None otherwise. ``known(cloud)`` lists the regions or zones of a cloud."""
    if cloud is None:
        return None
    other = next((c for c in CLOUDS if c != cloud and value in known(c)), None)
    if other is None:
        return None
    hint = f"; {_NAMES[cloud]} zones are {_ZONE_FORMS[cloud]}" if kind == "zone" else ""
    return f"{value!r} is {_article(_NAMES[other])} {kind}, not {_article(_NAMES[cloud])} one: use --cloud {other} (or drop --cloud){hint}"


def _zone_problem(catalog: Catalog, query: Located, zones: list[str]) -> str:
    """Why ``query.zone`` is not among ``zones`` (the zones of the query's cloud and region):
    another cloud's zone, a zone of another region, an AWS AZ name, or unknown."""
    zone = query.zone
    assert zone is not None  # validate_location asks only about a zone it did not find
    other = _other_cloud("zone", zone, query.cloud, catalog.zones)
    if other:
        return other
    home = sorted({o.region for o in catalog.offers if o.zone == zone and query.cloud in (None, o.cloud)})
    if query.region and home:
        return (
            f"zone {zone!r} is in {home[0]}, not {query.region}: use --region {home[0]} or drop --region. "
            f"Zones in {query.region}: {', '.join(zones)}."
        )
    if zone[-1:].isalpha() and zone[:-1] in catalog.regions("aws"):
        return (
            f"{zone!r} is an AWS AZ *name*, which maps to a different zone in each account; give the AZ ID "
            "instead (e.g. use1-az4; `aws ec2 describe-availability-zones` shows both). AZ IDs in "
            f"{zone[:-1]}: {', '.join(catalog.zones('aws', zone[:-1]))}."
        )
    scope = f" in {query.region}" if query.region else ""
    if query.region:
        listing = f" Zones{scope}: {', '.join(zones)}."
    else:
        listing = f" {_NAMES[query.cloud]} zones are {_ZONE_FORMS[query.cloud]}." if query.cloud in _NAMES else ""
    return f"unknown zone {zone!r}{scope}.{_did_you_mean(zone, zones)}{listing}"


def node_limit(cloud: str, fact: InstanceFacts | None) -> NodeLimit:
    """The most nodes one cluster of a type may have: the cloud's per-request limit
    (:data:`gpuinfra.requests.CLOUD_NODE_LIMITS`), or the type's placement-policy limit
    (``PlacementFacts.max_vms``) when that is lower."""
    limit = CLOUD_NODE_LIMITS[cloud]
    placed = fact.placement.max_vms if fact is not None else None
    if placed is not None and placed < limit.nodes:
        return NodeLimit(
            placed,
            "VMs in one compact placement policy",
            "cloud.google.com/compute/docs/instances/placement-policies-overview",
        )
    return limit


def matches_location(offer: Offer, query: Located) -> bool:
    """Cloud, region, zone and type filters; a named zone is taken even when it is a Local Zone."""
    return (
        query.cloud in (None, offer.cloud)
        and query.region in (None, offer.region)
        and query.zone in (None, offer.zone)
        and query.instance_type in (None, offer.instance_type)
        and (query.include_local_zones or query.zone is not None or not offer.local_zone)
    )


def fits(offer: Offer, request: GpuRequest) -> bool:
    """True when ``offer`` carries the requested GPU model with an allowed count."""
    return offer.gpu == request.gpu and request.gpu_count <= offer.gpu_count <= MAX_ROUND_UP_FACTOR * request.gpu_count


def find_offers(catalog: Catalog, query: OfferQuery) -> list[RankedOffer]:
    """Every fitting offer, cheapest first (see module docstring for the rules).

    Args:
        catalog: the loaded catalog.
        query: request and filters.

    Returns:
        A non-empty list of :class:`RankedOffer`.

    Raises:
        CatalogError: an unknown cloud, region, zone or instance type, or one of another cloud
            or region than the query's (the message says which).
        NoOfferError: nothing fits; the message says what GPU counts exist for that model.
        RequestError: offers fit, but none takes ``request.nodes`` nodes (:func:`node_limit`).
    """
    if query.market not in MARKETS + COMMITMENT_MARKETS:
        choices = ", ".join(MARKETS + COMMITMENT_MARKETS)
        raise CatalogError(f"unknown market {query.market!r}; choose one of: {choices}")
    validate_location(catalog, query)
    request = query.request
    located = [o for o in catalog.offers if matches_location(o, query)]
    market = query.market
    priced = [
        RankedOffer(
            offer=o,
            nodes=request.nodes,
            market=market,
            requested_gpu_count=request.gpu_count,
            commitment=commitment_of(catalog, o, market),
        )
        for o in located
        if fits(o, request) and _priced_in(catalog, o, market) and sold_as(catalog, o, market)
    ]
    ranked = [r for r in priced if request.nodes <= _limit_of(catalog, r.offer).nodes]
    if priced and not ranked:
        raise _over_node_limit(catalog, request, priced)
    if not ranked:
        unsold = {
            o.instance_type: fact
            for o in located  # not sold_as: the type has facts
            if fits(o, request)
            and not sold_as(catalog, o, market)
            and (fact := catalog.fact(o.cloud, o.instance_type)) is not None
        }
        sold = [o for o in located if fits(o, request) and sold_as(catalog, o, market)]
        if unsold and not sold:  # nothing that fits is sold in this market at all
            raise NoOfferError(
                f"provisioning-model-offered: {', '.join(sorted(unsold))} {'is' if len(unsold) == 1 else 'are'} not "
                f"sold {_AS[market]}; sold as "
                + "; ".join(f"{t}: {', '.join(unsold[t].provisioning_models)}" for t in sorted(unsold))
            )
        raise NoOfferError(_no_fit_message(catalog, query, located))
    ranked.sort(
        key=lambda r: (
            r.price_per_hour_usd,
            r.round_up,
            r.offer.cloud,
            r.offer.region,
            r.offer.zone,
            r.offer.instance_type,
        )
    )
    return ranked


_AS = {
    "on-demand": "on demand",
    "spot": "as spot",
    "flex-start": "as flex-start",
    "commit-1y": "on demand (a 1-year commitment covers on-demand VMs)",
    "commit-3y": "on demand (a 3-year commitment covers on-demand VMs)",
}


def _limit_of(catalog: Catalog, offer: Offer) -> NodeLimit:
    return node_limit(offer.cloud, catalog.fact(offer.cloud, offer.instance_type))


def _over_node_limit(catalog: Catalog, request: GpuRequest, offers: list[RankedOffer]) -> RequestError:
    """Every offer that fits is over its node limit: name the highest limit and its source, and
    the other cloud when it sells the GPU and takes that many nodes."""
    cloud, limit = max(((r.offer.cloud, _limit_of(catalog, r.offer)) for r in offers), key=lambda c: c[1].nodes)
    others = [
        c
        for c in CLOUDS
        if c not in {r.offer.cloud for r in offers}
        and request.nodes <= CLOUD_NODE_LIMITS[c].nodes
        and any(o.cloud == c and o.gpu == request.gpu for o in catalog.offers)
    ]
    hint = f", or --cloud {others[0]}" if others else ""
    return RequestError(
        f"--nodes {request.nodes} is over the {_NAMES[cloud]} limit of {limit.nodes} {limit.what} "
        f"(source: {limit.source}); ask for at most {limit.nodes} nodes{hint}"
    )


def sold_as(catalog: Catalog, offer: Offer, market: str) -> bool:
    """The cloud sells the offer's type in ``market`` (``InstanceFacts.provisioning_models``;
    a3-highgpu-1g/2g/4g, A3 Ultra and A4 are not sold on demand, whatever a price row says).
    A commitment market counts as on-demand: the committed nodes are on-demand VMs.
    Types without facts are kept (the planner refuses them later)."""
    fact = catalog.fact(offer.cloud, offer.instance_type)
    return fact is None or fact.offers_model("on-demand" if market in COMMITMENT_MARKETS else market)


def commitment_of(catalog: Catalog, offer: Offer, market: str) -> CommitmentPrice | None:
    """The committed rate of the offer's type in its region when ``market`` is a commitment
    market (None otherwise, or when no cited source prices it)."""
    if market not in COMMITMENT_MARKETS:
        return None
    return catalog.commitments.price(offer.cloud, offer.instance_type, offer.region, market)


def _priced_in(catalog: Catalog, offer: Offer, market: str) -> bool:
    if market in COMMITMENT_MARKETS:  # a commitment discounts an on-demand price: both must be known
        return offer.on_demand_price_per_hour_usd is not None and commitment_of(catalog, offer, market) is not None
    return offer.price_per_hour_usd(market) is not None


def _no_fit_message(catalog: Catalog, query: OfferQuery, located: list[Offer]) -> str:
    request = query.request
    where = " ".join(
        part
        for part in (
            f"on {query.cloud}" if query.cloud else "",
            f"in {query.zone or query.region}" if (query.zone or query.region) else "",
            f"as {query.instance_type}" if query.instance_type else "",
        )
        if part
    )
    shapes = sorted({(o.gpu_count, o.instance_type) for o in located if o.gpu == request.gpu})
    if query.instance_type and located and located[0].gpu != request.gpu:
        o = located[0]
        return f"{query.instance_type} carries {o.gpu_count}x{o.gpu}, not {request.gpu}; drop --gpus or ask for {o.gpu}"
    if not shapes:
        clouds = sorted({o.cloud for o in catalog.offers if o.gpu == request.gpu})
        hint = f" {request.gpu} is offered on: {', '.join(clouds)}." if clouds else ""
        return f"no offer has {request.gpu} {where}.{hint}".replace("  ", " ")
    by_count: dict[int, list[str]] = {}
    for count, itype in shapes:
        by_count.setdefault(count, []).append(itype)
    listing = "; ".join(f"{c} per node: {', '.join(sorted(set(t)))}" for c, t in sorted(by_count.items()))
    pricing = query.market
    bigger = [c for c in by_count if c > request.gpu_count]
    if by_count and all(c < request.gpu_count or c > MAX_ROUND_UP_FACTOR * request.gpu_count for c in by_count):
        elsewhere = sorted(
            {
                o.instance_type
                for o in catalog.offers
                if o.gpu == request.gpu and request.gpu_count <= o.gpu_count <= MAX_ROUND_UP_FACTOR * request.gpu_count
            }
        )
        if bigger:
            advice = f" Ask for --gpus {min(bigger)}x{request.gpu} to take the next size."
        elif query.instance_type and elsewhere:
            advice = (
                f" {request.gpu_count}x{request.gpu} per node needs another type ({', '.join(elsewhere[:3])}): "
                f"drop --instance-type, or ask for fewer GPUs per node and more nodes."
            )
        elif elsewhere:
            advice = f" {', '.join(elsewhere[:3])} carry {request.gpu_count}x{request.gpu} elsewhere: widen --cloud/--region/--zone."
        else:
            advice = f" No {request.gpu} machine has {request.gpu_count} GPUs per node; use more nodes."
        return (
            (
                f"no offer {where} fits {request.gpu_count}x{request.gpu} per node: {listing} "
                f"(a round-up above {MAX_ROUND_UP_FACTOR}x is not a fit).{advice}"
            )
            .replace("  ", " ")
            .replace("offer  fits", "offer fits")
        )
    others = [m for m in MARKETS if m != pricing]
    hint = {
        "commit-1y": " No cited source has a 1-year commitment price for it here (AWS: EC2 Standard RI no upfront, "
        "GCP: resource-based CUD; see docs/prices.md, price table).",
        "commit-3y": " No cited source has a 3-year commitment price for it here (AWS: EC2 Standard RI no upfront, "
        "GCP: resource-based CUD; see docs/prices.md, price table).",
        "flex-start": " This catalog has no flex-start (DWS) price for it (the shipped snapshot has none); "
        "`gpuinfra catalog refresh --cloud gcp` reads them from the Cloud Billing Catalog.",
    }.get(pricing, "")
    return (
        f"price-known: no {pricing} price for {request.gpu_count}x{request.gpu} {where}: {listing}."
        f"{hint} Other markets: {', '.join(others)} (`gpuinfra offers --market ...` lists them)."
    ).replace("  ", " ")


def request_from_instance_type(catalog: Catalog, cloud: str | None, instance_type: str, nodes: int) -> GpuRequest:
    """The GPU request implied by an instance type (its GPU model and count).

    Raises:
        CatalogError: unknown type, or a host that takes several GPU shapes (GCP N1: give --gpus).
    """
    validate_location(catalog, OfferScope(cloud=cloud, instance_type=instance_type))
    shapes = sorted(
        {(o.gpu_count, o.gpu) for o in catalog.offers if o.instance_type == instance_type and cloud in (None, o.cloud)}
    )
    if len(shapes) > 1:
        listed = ", ".join(f"{count}x{gpu}" for count, gpu in shapes)
        raise CatalogError(f"{instance_type} takes attached GPUs; give --gpus with one of: {listed}")
    count, gpu = shapes[0]
    return GpuRequest(gpu=gpu, gpu_count=count, nodes=nodes)


def gpu_request(
    catalog: Catalog, gpus: str | None, instance_type: str | None, cloud: str | None, nodes: int
) -> GpuRequest:
    """The GPU request of ``--gpus`` or, without it, the one ``--instance-type`` implies.

    Args:
        gpus: GPUs per node (``4xA100``), or None.
        instance_type: a type whose GPUs make the request when ``gpus`` is None.
        cloud: the cloud to look ``instance_type`` up in (None: both).
        nodes: node count.

    Raises:
        RequestError: neither given, a malformed spec, or a bad node count.
        CatalogError: an unknown type (:func:`request_from_instance_type`).
    """
    if gpus:
        return parse_gpu_spec(gpus, nodes)
    if instance_type:
        request = request_from_instance_type(catalog, cloud, instance_type, nodes)
        parse_gpu_spec(f"{request.gpu_count}x{request.gpu}", nodes)  # validates nodes
        return request
    raise RequestError("give --gpus (e.g. 4xA100) or --instance-type (e.g. p4d.24xlarge)")


def spot_price_note(offer: Offer, fleet_max_price_usd: Decimal | None = None) -> str:
    """One line on an offer's spot price for ``new`` / ``cost``: its source date, the window
    range where known, the fleet's maximum price (AWS) or that GCP has none, and a flag when
    spot is not below on-demand (no saving there).

    Args:
        offer: the catalog offer (per node-hour prices).
        fleet_max_price_usd: the stack's ``spot_max_price_per_hour_usd`` (AWS), or None.
    """
    spot = offer.spot_price_per_hour_usd
    if spot is None:
        return "spot: no spot price in the catalog (unpriced)"
    parts = [f"spot ${spot:,.2f}/node-h, dated {offer.spot_price_date or 'unknown'}"]
    lo, hi = offer.spot_price_min_per_hour_usd, offer.spot_price_max_per_hour_usd
    if lo is not None and hi is not None:
        parts.append(f"window range ${lo:,.2f}-${hi:,.2f}")
    if offer.cloud == "aws":
        parts.append(
            f"fleet max price ${fleet_max_price_usd:,.5f}/instance-h"
            if fleet_max_price_usd is not None
            else "no fleet max price (AWS caps at on-demand)"
        )
    else:
        parts.append("GCP Spot VMs have no max price")
    if offer.spot_not_discounted:
        parts.append("! spot is not below on-demand here: no saving")
    return "; ".join(parts)
