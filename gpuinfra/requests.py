"""The GPU request grammar: ``4xA100``, ``A100:4``, ``8xH100``, ``A100-80GB:8``, ``1xL4``.

Grammar (case-insensitive, surrounding blanks ignored)::

    spec   := count ("x" | "X" | "*") model | model ":" count | model
    count  := a whole number from 1 to 64  (GPUs per node)
    model  := a GPU name or alias from gpus.json (A100, A100-40GB, H100-80GB, L40S ...)

A bare model means one GPU. The count is **per node**; the number of nodes is separate
(``--nodes``). Memory variants are distinct models: ``A100`` never matches an
``A100-80GB`` offer (a silent substitution would change price and capacity).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from decimal import Decimal

from gpuinfra.catalog.store import GpuModel, load_gpu_models
from gpuinfra.errors import RequestError

MAX_GPUS_PER_NODE = 64


@dataclass(frozen=True, slots=True)
class NodeLimit:
    """The most nodes one request for a cluster may have on a cloud, and why.

    Attributes:
        nodes: the limit.
        what: what holds the nodes ("VMs in one zonal managed instance group").
        source: the page that states the limit.
    """

    nodes: int
    what: str
    source: str


#: Per-request node limits of each cloud: gpuinfra starts every node of a cluster in one request
#: (one instant EC2 Fleet; one zonal MIG), so a cluster can have at most this many nodes. The
#: per-type limit of a GCP compact placement policy is in the facts
#: (``PlacementFacts.max_vms``, docs/sources/cluster-facts.md section 6 rule 3); see
#: :func:`gpuinfra.offers.node_limit` for both together.
CLOUD_NODE_LIMITS = {
    # all nodes come from one instant fleet whose MinTargetCapacity is the node count (all or
    # nothing): "MinTargetCapacity ... Constraints: Maximum value of 1000. Supported only for
    # fleets of type instant." (lower than "The target capacity per EC2 Fleet: 10,000",
    # docs.aws.amazon.com/AWSEC2/latest/UserGuide/fleet-quotas.html)
    "aws": NodeLimit(
        1_000,
        "instances in one all-or-nothing instant EC2 Fleet (MinTargetCapacity)",
        "docs.aws.amazon.com/AWSEC2/latest/APIReference/API_OnDemandOptionsRequest.html",
    ),
    # "By default, you can create up to 1,000 VMs in a zonal MIG"; more needs the PAGINATED
    # listManagedInstancesResults the blueprint does not set
    "gcp": NodeLimit(
        1_000,
        "VMs in one zonal managed instance group",
        "cloud.google.com/compute/docs/instance-groups/creating-groups-of-managed-instances#limitations",
    ),
}

#: The most nodes any request may name: the larger of the clouds' one-request limits (the node
#: subnets, AWS 10.0.0.0/18 and GCP 10.128.0.0/20 in ``blueprints/*/plan.py``, hold more). A
#: count up to 1,000 times that is refused later by the cloud's own limit (with its source,
#: :func:`gpuinfra.offers.find_offers`); one beyond is refused at once, naming both limits.
MAX_NODES = max(limit.nodes for limit in CLOUD_NODE_LIMITS.values())

_COUNT_FIRST = re.compile(r"^(?P<count>[+-]?\d+)\s*[x*]\s*(?P<model>[a-z0-9][a-z0-9_-]*)$", re.I | re.A)
_MODEL_FIRST = re.compile(r"^(?P<model>[a-z0-9][a-z0-9_-]*?)\s*:\s*(?P<count>[+-]?\d+)$", re.I | re.A)
_BARE_MODEL = re.compile(r"^(?P<model>[a-z][a-z0-9_-]*)$", re.I | re.A)
_COUNT_MISSING_MODEL = re.compile(r"^[x*]\s*\d+$", re.I | re.A)

_EXAMPLES = "4xA100, A100:4, 8xH100, A100-80GB:8, 1xL4"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """A parsed request: ``gpu_count`` GPUs of model ``gpu`` on each of ``nodes`` nodes.

    Attributes:
        gpu: canonical GPU model name (``A100-80GB``).
        gpu_count: GPUs per node, 1..64.
        nodes: number of nodes, 1..:data:`MAX_NODES`.
    """

    gpu: str
    gpu_count: int
    nodes: int = 1

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes."""
        return self.gpu_count * self.nodes

    def __str__(self) -> str:
        text = f"{self.gpu_count}x{self.gpu}"
        return text if self.nodes == 1 else f"{text} on {self.nodes} nodes"


def _alias_table(models: tuple[GpuModel, ...]) -> dict[str, str]:
    table = {}
    for model in models:
        table[model.name.upper()] = model.name
        for alias in model.aliases:
            table[alias] = model.name
    return table


def resolve_gpu_name(text: str) -> str:
    """Canonical GPU model for a name or alias.

    Args:
        text: e.g. ``a100-40gb``, ``H100``, ``l40s``.

    Raises:
        RequestError: unknown name; the message lists known models and the closest match.
    """
    models = load_gpu_models()
    table = _alias_table(models)
    key = text.strip().upper().replace("_", "-")
    if key in table:
        return table[key]
    known = ", ".join(m.name for m in models)
    # a name of the same family first (B100 -> B200, A100-160GB -> A100-80GB), then any close one
    family = [name for name in table if name[:1] == key[:1]]
    close = difflib.get_close_matches(key, family, n=4, cutoff=0.5) or difflib.get_close_matches(
        key, list(table), n=1, cutoff=0.6
    )
    suggestions = list(dict.fromkeys(table[name] for name in close))[:2]
    hint = f" Did you mean {' or '.join(suggestions)}?" if suggestions else ""
    raise RequestError(f"unknown GPU {text.strip()!r}.{hint} Known GPUs: {known}.")


def parse_gpu_spec(spec: str, nodes: int = 1) -> GpuRequest:
    """Parse a GPU spec string and a node count into a :class:`GpuRequest`.

    Args:
        spec: see the module grammar.
        nodes: node count, 1..:data:`MAX_NODES`.

    Raises:
        RequestError: any malformed input (never another exception type); the message
            names what was wrong and shows valid examples.
    """
    if not isinstance(spec, str):
        raise RequestError(f"GPU spec must be text like {_EXAMPLES}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 1000 * MAX_NODES:
        limits = "; ".join(f"{cloud}: {limit.nodes:,} {limit.what}" for cloud, limit in CLOUD_NODE_LIMITS.items())
        raise RequestError(f"--nodes must be a whole number from 1 to {MAX_NODES:,} ({limits}), got {nodes!r}")
    text = spec.strip()
    if not text:
        raise RequestError(f"empty GPU spec; use a form like {_EXAMPLES}")
    match = _COUNT_FIRST.match(text) or _MODEL_FIRST.match(text)
    if match:
        count_text, model_text = match.group("count"), match.group("model")
    elif _BARE_MODEL.match(text) and not _COUNT_MISSING_MODEL.match(text):
        count_text, model_text = "1", text
    else:
        raise RequestError(f"malformed GPU spec {spec!r}; use COUNTxMODEL or MODEL:COUNT, e.g. {_EXAMPLES}")
    count = int(count_text)
    if not 1 <= count <= MAX_GPUS_PER_NODE:
        raise RequestError(f"GPU count in {spec!r} must be from 1 to {MAX_GPUS_PER_NODE} per node, got {count}")
    return GpuRequest(gpu=resolve_gpu_name(model_text), gpu_count=count, nodes=nodes)


def spot_choice(spot: bool, on_demand: bool, default: str = "the profile's spot policy") -> bool | None:
    """The capacity type asked for with ``--spot`` / ``--on-demand``.

    Args:
        spot, on_demand: the two flags.
        default: what decides when neither is given, for the message.

    Returns:
        True for ``--spot``, False for ``--on-demand``, None for neither.

    Raises:
        RequestError: both flags were given.
    """
    if spot and on_demand:
        raise RequestError(f"--spot and --on-demand exclude each other: give one of them, or neither for {default}")
    return True if spot else (False if on_demand else None)


def spot_max_price_usd(value: float) -> Decimal:
    """``--spot-max-price``: USD per instance-hour as a Decimal (its text as typed, no float noise).

    Raises:
        RequestError: not a finite number above 0 (exit 2); the on-demand bound is checked
            against the chosen offer (:func:`gpuinfra.newstack.with_spot_max_price`).
    """
    if not math.isfinite(value) or value <= 0:
        raise RequestError(f"--spot-max-price must be a positive USD amount per instance-hour, got {value:g}")
    return Decimal(str(value))
