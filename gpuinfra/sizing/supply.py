"""What a sizing may rent: the cheapest offer of each GPU configuration in a scope, and which
instance types carry sharded training over several nodes.

High-bandwidth GPU network (the types gpuinfra's nodes use for inter-node GPU traffic): AWS EFA
(``EfaInfo`` in DescribeInstanceTypes), GCP GPUDirect-TCPX/TCPXO and RDMA NIC layouts
(``gcp_machine_facts.json`` ``nic_layout``); a type whose GPU fabric cannot be installed at boot
(rule fabric-installable-at-boot: A3 High's TCPX) counts as slow and is timed over its host NIC.
"""

from __future__ import annotations

from decimal import Decimal

from gpuinfra.catalog.store import Catalog
from gpuinfra.offers import OfferScope, node_limit
from gpuinfra.rules.spec_rules import type_fabric_blocker

FAST_GCP_LAYOUTS = ("tcpx", "tcpxo", "gib")


def high_bandwidth_network(catalog: Catalog, cloud: str, instance_type: str, image_fabric: str | None = None) -> bool:
    """True when the type has a GPU network for multi-node training that gpuinfra's nodes use:
    AWS EFA, GCP GPUDirect (TCPXO) or RDMA (``gib``) NIC layouts (catalog facts). A3 High's TCPX
    counts only when the node image carries it (``image_fabric`` ``tcpx``, a bake): it cannot be
    installed at boot (rule fabric-installable-at-boot), so its nodes otherwise use the primary NIC."""
    facts = catalog.fact(cloud, instance_type)
    if facts is None or _fabric_blocked(facts, image_fabric):
        return False
    return facts.efa_supported if cloud == "aws" else facts.nic_layout in FAST_GCP_LAYOUTS


def _fabric_blocked(facts, image_fabric: str | None) -> bool:
    return type_fabric_blocker(facts, image_fabric) is not None


def _inter_node_gbps(facts, image_fabric: str | None) -> float | None:
    """Bandwidth between nodes as gpuinfra deploys the type: the GPU NICs' total, or the host
    NIC(s) when the GPU fabric cannot be installed at boot (:func:`high_bandwidth_network`)."""
    if facts is None:
        return None
    return facts.host_nic_bandwidth_gbps if _fabric_blocked(facts, image_fabric) else facts.network_bandwidth_gbps


def cheapest_offers(catalog: Catalog, fast_only: bool, scope: OfferScope = OfferScope()) -> dict[tuple[str, int], dict]:
    """The cheapest offer of every (GPU model, GPUs per node) in ``scope``.

    Args:
        fast_only: keep only types with a high-bandwidth GPU network (:func:`high_bandwidth_network`).
        scope: location and markets; an offer counts in the first market its type is sold and
            priced in (:meth:`gpuinfra.offers.OfferScope.market_of`), never at a missing price.

    Returns:
        ``{(gpu, gpus_per_node): {"price", "market", "cloud", "region", "zone", "instance_type",
        "max_nodes", "host_memory_gib", "network_bandwidth_gbps", "storage_bandwidth_gbps"}}``;
        ``price`` is USD per node-hour, ``max_nodes`` the type's node limit
        (:func:`gpuinfra.offers.node_limit`).
    """
    best: dict[tuple[str, int], dict] = {}
    for o in catalog.offers:
        market = scope.market_of(catalog, o)
        if market is None:
            continue
        if fast_only and not high_bandwidth_network(catalog, o.cloud, o.instance_type, scope.image_fabric):
            continue
        price = o.price_per_hour_usd(market)
        key = (o.gpu, o.gpu_count)
        if key not in best or price < best[key]["price"]:
            facts = catalog.fact(o.cloud, o.instance_type)
            best[key] = {
                "price": price,
                "market": market,
                "cloud": o.cloud,
                "region": o.region,
                "zone": o.zone,
                "instance_type": o.instance_type,
                "max_nodes": node_limit(o.cloud, facts).nodes,
                "host_memory_gib": o.memory_gib,
                "network_bandwidth_gbps": _inter_node_gbps(facts, scope.image_fabric),
                "storage_bandwidth_gbps": None if facts is None else facts.host_nic_bandwidth_gbps,
            }
    return best


def fast_types(catalog: Catalog, gpu: str, gpus_per_node: int, scope: OfferScope) -> list[str]:
    """Instance types with ``gpus_per_node`` x ``gpu`` and a high-bandwidth GPU network
    (:func:`high_bandwidth_network`) sold in ``scope``, cheapest first: the types a sharded
    multi-node configuration may be planned on."""
    cheapest: dict[str, Decimal] = {}
    for o in catalog.offers:
        if (o.gpu, o.gpu_count) != (gpu, gpus_per_node) or not high_bandwidth_network(
            catalog, o.cloud, o.instance_type, scope.image_fabric
        ):
            continue
        market = scope.market_of(catalog, o)
        if market is not None and (price := o.price_per_hour_usd(market)) is not None:  # market_of: priced there
            cheapest[o.instance_type] = min(price, cheapest.get(o.instance_type, price))
    return sorted(cheapest, key=lambda t: (cheapest[t], t))


#: Keys of an offer (:func:`cheapest_offers`) that a :class:`Candidate` carries as ``offer``.
OFFER_KEYS = ("cloud", "region", "zone", "instance_type", "market")
