"""``gpuinfra plan --buy N``: turn plan N into a purchase stack, with consent naming the amount.

AWS Capacity Blocks and GCP calendar-mode future reservations are bought this way
(:mod:`gpuinfra.plan.purchase`); a calendar-mode request is bought with its DWS-priced total
confirmed the same way. A Capacity Block is
paid up front and "You can't modify or cancel a Capacity Block"
(docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-release.html), so buying needs
``--confirm-non-refundable USD`` equal to the offering's upfront fee; anything else is refused
with one message naming the amount (``--yes`` is not a confirmation of an amount).

The purchase stack records the offering (id, type, count, AZ, window, fee, source, date) and the
cluster stack meant to use it. After ``pulumi up`` of that stack bought the block, ``gpuinfra new
--capacity-reservation cr-...`` writes the cluster stack through its usual path (type, AZ and
count from the reservation, TTL capped to the block's end) and prices the block at the fee
recorded here (:func:`gpuinfra.stackfile.purchased_block_price` reads it).
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from pathlib import Path

import yaml

from gpuinfra import __version__
from gpuinfra.errors import RequestError, RuleViolationError, SpecError
from gpuinfra.money import usd_json
from gpuinfra.plan.purchase import PURCHASE_CONFIG_KEY, PurchaseSpec
from gpuinfra.preview import PreviewMocks, PreviewResult, run_program
from gpuinfra.rules import check_graph
from gpuinfra.rules.model import ResourceGraph, Violation
from gpuinfra.spec import NEW_STACK_NAME_MAX, check_new_stack_name
from gpuinfra.stackfile import write_one_stack_file

#: The purchase stack of cluster stack ``NAME`` is ``NAME-block``.
PURCHASE_STACK_SUFFIX = "-block"
#: The ways to buy ``--buy`` writes a purchase stack for.
BUYABLE = ("capacity-block", "calendar-reservation")


def check_confirmation(plan: dict, confirm_usd: str | None) -> Decimal:
    """The upfront fee of ``plan`` when ``confirm_usd`` names exactly that amount.

    Args:
        plan: one entry of the plan document's ``plans`` (:func:`gpuinfra.services.deadline.deadline_document`).
        confirm_usd: ``--confirm-non-refundable`` as given (``6144``, ``6144.00``), or None.

    Raises:
        RequestError: the plan is not a priced Capacity Block, or the confirmation is missing or
            names another amount (one line, naming the amount; exit 2).
    """
    if plan["way"] not in BUYABLE:
        raise RequestError(
            f"--buy buys AWS Capacity Blocks and GCP calendar-mode reservations; plan {plan.get('index', '?')} is "
            f"{plan['way']} (create it with `gpuinfra new`, or request it in the cloud console)"
        )
    block = plan["way"] == "capacity-block"
    what = f"Capacity Block {plan['offering_id']}" if block else f"calendar-mode reservation in {plan['zone']}"
    if plan["compute_cost_usd"] is None:
        raise RequestError(
            f"{what} has no USD price: not bought"
            + ("" if block else " (`gpuinfra catalog refresh --cloud gcp` reads the DWS prices)")
        )
    fee = Decimal(plan["compute_cost_usd"])
    amount = f"{fee:.2f}"
    terms = (
        "paid up front, cannot be cancelled and is not refunded if the stack is destroyed"
        if block
        else "billed for the whole window once Google Cloud approves and delivers it"
    )
    ask = (
        f"{what} ({plan['nodes']} x {plan['instance_type']}, {plan['zone']}, {plan['window_start']} to "
        f"{plan['window_end']}) costs ${fee:,.2f}, {terms}: pass --confirm-non-refundable {amount} to buy it "
        "(--yes is not enough)"
    )
    if confirm_usd is None:
        raise RequestError(ask)
    try:
        confirmed = Decimal(confirm_usd.strip().lstrip("$").replace(",", ""))
    except InvalidOperation:
        raise RequestError(ask) from None
    if not confirmed.is_finite() or confirmed.quantize(Decimal("0.01")) != fee.quantize(Decimal("0.01")):
        raise RequestError(ask)
    return fee


def purchase_spec(
    plan: dict, name: str, cluster_stack: str, confirmed_usd: Decimal, read_on: str, gcp_project: str | None = None
) -> PurchaseSpec:
    """The purchase spec of plan ``plan`` (checked by :func:`check_confirmation`).

    Args:
        name / cluster_stack: the purchase stack's and the cluster stack's names.
        read_on: the day the offering was read (``YYYY-MM-DD``).

    Raises:
        SpecError: a field the offering gave does not validate (the message names it).
    """
    try:
        return PurchaseSpec.model_validate(
            dict(
                stack=name,
                cluster_stack=cluster_stack,
                cloud=plan["cloud"],
                kind=plan["way"],
                region=plan["region"],
                availability_zone=plan["zone"],
                offering_id=plan["offering_id"],
                gcp_project=gcp_project,
                instance_type=plan["instance_type"],
                instance_count=plan["nodes"],
                start=plan["window_start"],
                end=plan["window_end"],
                upfront_usd=str(usd_json(Decimal(plan["compute_cost_usd"]))),
                price_source=plan["price_source"][:300],
                price_date=read_on,
                confirmed_non_refundable_usd=str(usd_json(confirmed_usd)),
            )
        )
    except ValueError as exc:
        raise SpecError(f"the offering does not make a valid purchase: {exc}") from None


def purchase_provider_config(spec: PurchaseSpec) -> dict[str, str]:
    """Provider settings of a purchase stack: ``aws:region``, or ``gcp:region`` / ``gcp:zone``
    (and ``gcp:project`` when the spec names one)."""
    if spec.cloud == "aws":
        return {"aws:region": spec.region}
    project = {"gcp:project": spec.gcp_project} if spec.gcp_project else {}
    return {**project, "gcp:region": spec.region, "gcp:zone": spec.availability_zone}


def next_steps(spec: PurchaseSpec, project_dir: Path) -> list[str]:
    """What to run after ``plan --buy`` wrote ``spec``'s stack (``gpuinfra up`` does not run
    purchase stacks: ``pulumi up`` does)."""
    if spec.kind == "capacity-block":
        return [
            f"buy:  pulumi up --stack {spec.stack}   (in {project_dir}; output capacity_reservation_id)",
            f"then: gpuinfra new --capacity-reservation <capacity_reservation_id> --region {spec.region} "
            f"--nodes {spec.instance_count} --name {spec.cluster_stack}; gpuinfra up {spec.cluster_stack} from "
            f"{spec.start:%Y-%m-%d %H:%M} UTC",
        ]
    return [
        f"request: pulumi up --stack {spec.stack}   (in {project_dir}; Google Cloud approves or declines it)",
        f"then: gpuinfra new --cloud gcp --instance-type {spec.instance_type} --zone {spec.availability_zone} "
        f"--nodes {spec.instance_count} --name {spec.cluster_stack}, with gcp_reservation set to the delivered "
        f"reservation and gcp_reservation_bound: true; gpuinfra up {spec.cluster_stack} from "
        f"{spec.start:%Y-%m-%d %H:%M} UTC",
    ]


def render_purchase_stack(spec: PurchaseSpec) -> str:
    """The purchase stack file's text: a header with the next steps, the provider settings and
    ``gpuinfra:purchase``."""
    window = f"{spec.start:%Y-%m-%d %H:%M} to {spec.end:%Y-%m-%d %H:%M} UTC"
    if spec.kind == "capacity-block":
        what = f"a Capacity Block purchase ({window}, ${Decimal(spec.upfront_usd):,.2f} paid up front, NOT refundable)"
        use = (
            f"# Buy:  pulumi up --stack {spec.stack}   (output capacity_reservation_id)\n"
            f"# Use:  gpuinfra new --capacity-reservation <capacity_reservation_id> --region {spec.region} "
            f"--nodes {spec.instance_count} --name {spec.cluster_stack}\n"
            f"#       then gpuinfra up {spec.cluster_stack} from {spec.start:%Y-%m-%d %H:%M} UTC (the block takes "
            "instances from its start)\n"
        )
    else:
        what = f"a calendar-mode reservation request ({window}, ${Decimal(spec.upfront_usd):,.2f} at DWS rates)"
        use = (
            f"# Request: pulumi up --stack {spec.stack}   (Google Cloud approves or declines it)\n"
            f"# Use:     gpuinfra new --cloud gcp --instance-type {spec.instance_type} --zone {spec.availability_zone} "
            f"--nodes {spec.instance_count} --name {spec.cluster_stack}, then set gcp_reservation and "
            "gcp_reservation_bound: true in its stack file (README, stack-file settings)\n"
        )
    header = (
        f'# Pulumi stack "{spec.stack}" of the gpuinfra project: {what}, written by gpuinfra {__version__} '
        f"(gpuinfra plan --buy).\n# {spec.instance_count} x {spec.instance_type} in {spec.availability_zone}.\n" + use
    )
    config = {**purchase_provider_config(spec), f"gpuinfra:{PURCHASE_CONFIG_KEY}": spec.to_config()}
    return header + yaml.safe_dump({"config": config}, sort_keys=False, width=100)


def write_purchase_stack(spec: PurchaseSpec, project_dir: Path, force: bool = False) -> Path:
    """Write ``stacks/Pulumi.<name>.yaml`` for ``spec`` (all or nothing).

    Raises:
        FileExistsGpuinfraError: the file exists and not ``force`` (exit 5).
        ProjectDirError: ``project_dir`` cannot be written (exit 2).
    """
    return write_one_stack_file(
        project_dir, spec.stack, render_purchase_stack(spec), force, "pass --force or pick another --name"
    )


def preview_purchase(spec: PurchaseSpec) -> tuple[PreviewResult, list[Violation]]:
    """The purchase stack's resources offline (the real program under Pulumi's mocks,
    :func:`gpuinfra.preview.run_program`) and the rule violations over them."""

    def program():
        # imported when the program runs: blueprints load Pulumi and the cloud provider SDK
        from blueprints.program import build_purchase

        return build_purchase(spec)

    config = {f"gpuinfra:{PURCHASE_CONFIG_KEY}": json.dumps(spec.to_config()), **purchase_provider_config(spec)}
    result = run_program(spec.stack, PreviewMocks(spec), config, program)
    return result, check_graph(ResourceGraph.from_records(result.resources), {})


def purchase_stack_name(name: str) -> str:
    """The purchase stack's name for cluster stack ``name``: ``<name>-block``.

    Raises:
        SpecError: no valid new stack name (one line; too long: how long ``--name`` may be).
    """
    try:
        return check_new_stack_name(f"{name}{PURCHASE_STACK_SUFFIX}")
    except SpecError as exc:
        room = NEW_STACK_NAME_MAX - len(PURCHASE_STACK_SUFFIX)
        raise SpecError(
            f"{exc}; the purchase stack adds '{PURCHASE_STACK_SUFFIX}': use a --name of at most {room} characters"
        ) from None


def buy(
    doc: dict,
    number: int,
    confirm_usd: str | None,
    name: str,
    project_dir: Path,
    force: bool = False,
    gcp_project: str | None = None,
) -> tuple[Path, PurchaseSpec]:
    """Write the purchase stack of plan ``number`` (1-based, as listed) of ``doc``.

    Args:
        doc: :func:`gpuinfra.services.deadline.deadline_document`.
        confirm_usd: ``--confirm-non-refundable``; name: the cluster stack's name (the purchase
            stack is ``<name>-block``); gcp_project: the project of a calendar-mode request.

    Raises:
        RequestError: no plan ``number``, not a priced Capacity Block, or no matching confirmation.
        SpecError: ``name`` leaves no room for :data:`PURCHASE_STACK_SUFFIX` (:func:`purchase_stack_name`).
        RuleViolationError: the purchase stack's offline preview breaks a rule (nothing written).
        FileExistsGpuinfraError / ProjectDirError: as :func:`write_purchase_stack`.
    """
    plans = doc["plans"]
    if not 1 <= number <= len(plans):
        raise RequestError(f"--buy {number}: there are {len(plans)} plans (1 to {len(plans)})")
    plan = {**plans[number - 1], "index": number}
    stack = purchase_stack_name(name)
    fee = check_confirmation(plan, confirm_usd)
    spec = purchase_spec(plan, stack, name, fee, str(doc["now"])[:10], gcp_project)
    _, violations = preview_purchase(spec)
    if violations:
        raise RuleViolationError(violations)
    return write_purchase_stack(spec, project_dir, force), spec
