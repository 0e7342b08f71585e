"""Totals, the versioned JSON schema, the text table and the diff of two estimates.

JSON schema (``schema_version`` "3"): money as :func:`gpuinfra.money.usd_json` strings (6 places),
``{"schema_version", "stack", "currency", "catalog_date", "pricing", "hours", "hourly_usd",
"run_usd", "monthly_if_left_running_usd", "spot_savings_percent", "lines": [{"resource",
"resource_type", "component", "unit", "quantity", "unit_price_usd", "hourly_usd", "run_usd",
"usage_based", "price_source", "price_date", "note"}], "price_not_found", "not_priced",
"free_resources", "lines_without_price", "left_after_down": {"monthly_usd",
"lines_without_price", "lines": [{"resource", "component", "unit", "monthly_quantity",
"unit_price_usd", "monthly_usd", "price_source", "price_date", "note"}]}}``. ``quantity`` is units per hour; lines whose price is
not found carry null prices and are listed in ``price_not_found``, resources with no cost model
in ``not_priced``; ``lines_without_price`` counts both. The totals (``hourly_usd``, ``run_usd``,
``monthly_if_left_running_usd``) are :class:`gpuinfra.money.Total`: ``null`` when
``lines_without_price`` > 0 (a sum of the priced lines is never shown as the total), and
``spot_savings_percent`` is null when a compute line has no price.
The service adds ``commitments`` (:mod:`gpuinfra.cost.commitment`): the plan's compute under
1-year / 3-year commitments, outside the totals.
Version 2 (was 1): ``monthly_usd_if_left_running`` became ``monthly_if_left_running_usd`` (every
money key ends in ``_usd``). Version 3 (was 2): the totals are null when a line has no price (they
were the sum of the priced lines); ``lines_without_price`` was added. ``left_after_down`` (what
``down`` keeps, per month: :mod:`gpuinfra.cost.after_down`; its ``monthly_usd`` null when one of
its lines has no price, apart from the run's totals) was added to version 3 (a new key only).

Diff schema (``schema_version`` "3", :func:`diff_json`): ``{"schema_version", "before", "after",
"before_hourly_usd", "after_hourly_usd", "before_run_usd", "after_run_usd", "hourly_change_usd",
"run_change_usd", "before_price_not_found", "after_price_not_found", "rows": [{"change",
"resource", "component", "before_hourly_usd", "after_hourly_usd"}]}``. A side with a line
without a price has null totals and lists it in ``<side>_price_not_found``; then both changes
are null (``cost diff`` exits 4). Version 2 (was 1): ``hourly_usd_change`` / ``run_usd_change`` became
``hourly_change_usd`` / ``run_change_usd``; the four totals were added. Version 3 (was 2): null
totals and changes when a side is incomplete; ``before_price_not_found`` / ``after_price_not_found``
were added.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from gpuinfra.catalog.prices import usage_for
from gpuinfra.catalog.store import load_catalog
from gpuinfra.cost.after_down import kept_json
from gpuinfra.cost.estimate import Estimate, capacity_block_price, estimate
from gpuinfra.cost.lines import CostLine
from gpuinfra.money import Total, usd_json

SCHEMA_VERSION = "3"
DIFF_SCHEMA_VERSION = "3"
LEFT_RUNNING_HOURS = Decimal(720)  # 30 days
_Q = Decimal("0.000001")


def compute_hourly(est: Estimate) -> Decimal | None:
    """$/h of the compute lines (instances, GCP host + GPUs); None when one has no price."""
    return Total.of(
        line.hourly_usd for line in est.lines if line.component.startswith(("Instance usage", "Machine (", "GPUs ("))
    ).amount_usd


def spot_savings_percent(est: Estimate, market: str) -> Decimal | None:
    """How much cheaper spot compute is than on-demand for this plan, in percent."""
    current, other = compute_hourly(est), est.alternative_compute_hourly_usd
    if other is None or current is None or current == 0:
        return None
    spot, on_demand = (current, other) if market == "spot" else (other, current)
    if on_demand == 0:
        return None
    return ((on_demand - spot) / on_demand * 100).quantize(Decimal("0.1"))


def to_json(est: Estimate, stack: str, hours: Decimal, catalog_date: str, market: str) -> dict:
    """The versioned JSON document (see module docstring).

    Totals are the sums of the lines as written (each rounded to 6 places), so a reader that
    adds up ``lines`` gets exactly ``hourly_usd`` and ``run_usd``.
    """
    lines = [_line_json(line, hours) for line in est.lines]
    no_model = Total.unpriced(len(est.not_priced))
    hourly = Total.of(_amount(line["hourly_usd"]) for line in lines) + no_model
    run = Total.of(_amount(line["run_usd"]) for line in lines) + no_model
    return {
        "schema_version": SCHEMA_VERSION,
        "stack": stack,
        "currency": "USD",
        "catalog_date": catalog_date,
        "pricing": market,
        "hours": format(hours.normalize(), "f"),
        "hourly_usd": hourly.json(),
        "run_usd": run.json(),
        "monthly_if_left_running_usd": (_left_running(est, hours) + no_model).json(),
        "spot_savings_percent": None if (s := spot_savings_percent(est, market)) is None else str(s),
        "lines": lines,
        "price_not_found": [
            f"{line.resource}: {line.component} ({line.source})" for line in est.lines if line.unit_price_usd is None
        ],
        "not_priced": [{"resource": n, "resource_type": t_, "reason": why} for n, t_, why in est.not_priced],
        "free_resources": est.free,
        "lines_without_price": hourly.missing,
        "left_after_down": kept_json(est.left_after_down),
    }


def document_total(doc: dict, key: str) -> Total:
    """The :class:`~gpuinfra.money.Total` behind ``doc[key]`` of a :func:`to_json` document."""
    return Total.from_json(doc[key], doc["lines_without_price"])


#: How to fill an AWS price-table gap (:mod:`gpuinfra.catalog.refresh_aws_prices` reads them).
AWS_PRICE_REFRESH_HINT = "`gpuinfra catalog refresh --cloud aws` reads it from the AWS Price List"
#: an unpriced line's source when an AWS region misses a table value: AWS region codes end in
#: ``-<digit>`` (``eu-north-1``), GCP's do not (``europe-north1``)
_TABLE_MISS = re.compile(r".*\(no .+ price for [a-z]{2}(-[a-z]+)+-\d\)")


def fill_advice(doc: dict) -> str:
    """How to fill the missing prices of a cost document (its ``price_not_found``), or "": an
    AWS line that misses a price-table value ("no NAT gateway price for eu-north-1") is read by
    ``gpuinfra catalog refresh --cloud aws``."""
    return AWS_PRICE_REFRESH_HINT if any(_TABLE_MISS.fullmatch(x) for x in doc["price_not_found"]) else ""


def unpriced_lines(doc: dict) -> list[str]:
    """Every line of a :func:`to_json` document without a price, a resource with no cost model too."""
    return doc["price_not_found"] + [
        f"{r['resource']} ({r['resource_type']}: {r['reason']})" for r in doc["not_priced"]
    ]


def _amount(value: str | None) -> Decimal | None:
    return None if value is None else Decimal(value)


def _left_running(est: Estimate, hours: Decimal) -> Total:
    """30 days of the recurring lines plus the one-time lines once."""
    recurring = Total.of(line.hourly_usd for line in est.lines if not line.one_time)
    once = Total.of(line.hourly_usd for line in est.lines if line.one_time)
    return recurring * LEFT_RUNNING_HOURS + once * hours


def _line_json(line: CostLine, hours: Decimal) -> dict:
    hourly = line.hourly_usd
    return {
        "resource": line.resource,
        "resource_type": line.resource_type,
        "component": line.component,
        "unit": line.unit,
        "quantity": str(line.hourly_quantity.quantize(_Q)),
        "unit_price_usd": usd_json(line.unit_price_usd),
        "hourly_usd": usd_json(hourly),
        "run_usd": usd_json(None if hourly is None else hourly * hours),
        "usage_based": line.usage_based,
        "price_source": line.source,
        "price_date": line.price_date,
        "note": line.note,
    }


@dataclass
class DiffRow:
    """One resource component in a diff: '+' added, '-' removed, '~' changed."""

    symbol: str
    resource: str
    component: str
    before_hourly: Decimal | None
    after_hourly: Decimal | None


def _key(line: dict, stack: str) -> tuple[str, str]:
    """(resource role, component kind): the resource name without its ``<stack>-`` prefix."""
    return line["resource"].removeprefix(f"{stack}-"), line["component"].split(" (")[0]


def diff(before: dict, after: dict) -> tuple[list[DiffRow], Total, Total]:
    """Compare two cost JSON documents by (resource role, component).

    Resource names are matched without their stack prefix (``a-lt`` vs ``b-lt`` are the same
    role). Returns the rows and the changes in $/h and run total (incomplete when either side
    has a line without a price).
    """
    old = {_key(line, before["stack"]): line for line in before["lines"]}
    new = {_key(line, after["stack"]): line for line in after["lines"]}
    rows = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        ah = None if a is None or a["hourly_usd"] is None else Decimal(a["hourly_usd"])
        bh = None if b is None or b["hourly_usd"] is None else Decimal(b["hourly_usd"])
        if a is None:
            assert b is not None  # the key is in old or new
            rows.append(DiffRow("+", key[0], b["component"], None, bh))
        elif b is None:
            rows.append(DiffRow("-", key[0], a["component"], ah, None))
        elif ah != bh or a["component"] != b["component"]:
            rows.append(
                DiffRow(
                    "~",
                    key[0],
                    f"{a['component']} -> {b['component']}" if a["component"] != b["component"] else b["component"],
                    ah,
                    bh,
                )
            )
    hourly_change = document_total(after, "hourly_usd") - document_total(before, "hourly_usd")
    run_change = document_total(after, "run_usd") - document_total(before, "run_usd")
    return rows, hourly_change, run_change


def diff_json(before: dict, after: dict) -> dict:
    """The versioned ``cost diff`` JSON document of two cost documents (module docstring).

    Args:
        before, after: :func:`to_json` documents; ``stack`` names each side.
    """
    rows, hourly_change, run_change = diff(before, after)
    return {
        "schema_version": DIFF_SCHEMA_VERSION,
        "before": before["stack"],
        "after": after["stack"],
        "before_hourly_usd": before["hourly_usd"],
        "after_hourly_usd": after["hourly_usd"],
        "before_run_usd": before["run_usd"],
        "after_run_usd": after["run_usd"],
        "hourly_change_usd": hourly_change.json(),
        "run_change_usd": run_change.json(),
        "before_price_not_found": unpriced_lines(before),
        "after_price_not_found": unpriced_lines(after),
        "rows": [
            {
                "change": r.symbol,
                "resource": r.resource,
                "component": r.component,
                "before_hourly_usd": usd_json(r.before_hourly),
                "after_hourly_usd": usd_json(r.after_hourly),
            }
            for r in rows
        ],
    }


def cost_summary(spec, resources: list) -> dict:
    """Totals of the cost preview of ``resources`` planned for ``spec`` (a ClusterSpec), for the
    stack's own run hours and pricing: ``hourly_usd``, ``run_usd``, ``monthly_if_left_running_usd``
    (:func:`gpuinfra.money.usd_json` strings), ``hours``, ``pricing``, ``catalog_date``,
    ``price_not_found``, ``not_priced``, ``lines_without_price`` (as in :func:`to_json`: the
    totals are null when ``lines_without_price`` > 0), ``left_after_down`` (what ``down`` keeps,
    per month)."""
    hours = Decimal(str(spec.run_hours))
    catalog = load_catalog()
    est = estimate(
        resources,
        catalog,
        spec.region,
        usage_for(spec.profile.name),
        hours,
        data=spec.data,
        capacity_block_price=capacity_block_price(spec),
    )
    doc = to_json(est, spec.stack, hours, catalog.date_for(spec.cloud), est.facts.market)
    return {
        k: doc[k]
        for k in (
            "hourly_usd",
            "run_usd",
            "hours",
            "pricing",
            "catalog_date",
            "price_not_found",
            "not_priced",
            "lines_without_price",
            "monthly_if_left_running_usd",
            "left_after_down",
        )
    }
