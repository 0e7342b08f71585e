"""`gpuinfra new` names the cheapest fully priced alternative when its own total is incomplete.

The expected regions come from outside the function under test: which AWS regions the shipped
price book prices (the gap table of docs/prices.md, "AWS regions with a GPU offer", which
tests/test_region_prices.py holds to the book) and the price ranking `gpuinfra offers` prints;
the alternative's total is then checked by writing that stack with `new --region`.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from gpuinfra.cost import estimate

ROOT = Path(__file__).resolve().parents[2]
#: The request of the report: a p5 (8 x H100) on spot, where the cheapest dated spot price is in
#: a region without a NAT data price in the shipped book.
P5_SPOT = ("--gpus", "8xH100", "--cloud", "aws", "--spot", "--profile", "llm-finetune")
#: The per-GB NAT gateway data price every AWS training stack has a line for
#: (https://aws.amazon.com/vpc/pricing/: "Price per GB data processed").
NAT_DATA = ("aws", "nat_gateway_per_gb")
#: Gap rows of docs/prices.md that price a p5 training stack (the others are bakes and data locality).
STACK_GAP_ROWS = ("NAT data processed", "NAT gateway hours", "EBS gp3 GB / IOPS / throughput")


def _gap_table() -> dict[str, str]:
    """docs/prices.md "table | regions without a price" rows: table -> its regions cell."""
    text = (ROOT / "docs" / "prices.md").read_text()
    block = text.split("| table | regions without a price |", 1)[1].split("\n\n", 1)[0]
    rows = [line.strip("|").split("|") for line in block.splitlines()[2:] if line.startswith("|")]
    return {cells[0].strip(): cells[1].strip() for cells in rows}


def _regions(cell: str) -> set[str]:
    return set(re.findall(r"\b[a-z]{2}-[a-z]+-\d\b", cell.split("(")[0]))


def stack_priced(region: str) -> bool:
    """True when docs/prices.md says the shipped book prices every table of a training stack (a p5 one) in ``region``."""
    rows = _gap_table()
    for name in STACK_GAP_ROWS:
        cell = rows[name]
        if cell.startswith("all but"):
            if region not in _regions(cell):
                return False
        elif region in _regions(cell):
            return False
    return True


def _new(run_cli, project, *args) -> dict:
    result = run_cli("new", *args, "--project-dir", str(project), "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _ranked_regions(run_cli) -> list[str]:
    """AWS regions of `offers --gpus 8xH100 --spot`, cheapest first, each once."""
    result = run_cli("offers", "--gpus", "8xH100", "--cloud", "aws", "--spot", "--json")
    assert result.exit_code == 0, result.stderr
    regions: list[str] = []
    for row in json.loads(result.stdout):
        if row["instance_type"] == "p5.48xlarge" and row["region"] not in regions:
            regions.append(row["region"])
    return regions


def test_the_gap_table_reads_as_the_docs_state_it():
    # docs/prices.md: "a stack with a NAT gateway ... gets a complete total in us-east-1,
    # us-east-2, us-west-2, ca-central-1, eu-west-1, eu-west-2, eu-central-1, ap-northeast-1,
    # ap-northeast-2 and ap-southeast-1"
    assert stack_priced("us-east-2") and stack_priced("eu-west-2") and stack_priced("us-west-2")
    assert not stack_priced("eu-north-1") and not stack_priced("ap-southeast-3") and not stack_priced("me-central-1")


def test_incomplete_p5_spot_names_a_fully_priced_region_whose_stack_totals(run_cli, tmp_path):
    doc = _new(run_cli, tmp_path, *P5_SPOT, "--name", "p5")
    chosen, alt = doc["region"], doc["fully_priced_alternative"]
    if stack_priced(chosen):  # the book gained the chosen region's prices: nothing to name
        assert doc["cost"]["lines_without_price"] == 0 and alt is None
        return
    assert doc["cost"]["run_usd"] is None and doc["cost"]["lines_without_price"] >= 1
    # the cheapest region of the ranking that the book prices fully
    expected = next(r for r in _ranked_regions(run_cli) if r != chosen and stack_priced(r))
    assert alt["region"] == expected and alt["cloud"] == "aws" and alt["market"] == "spot"
    assert Decimal(alt["compute_price_per_hour_usd"]) > Decimal(doc["compute_price_per_hour_usd"])
    assert Decimal(alt["run_usd"]) > Decimal(alt["compute_price_per_hour_usd"]) * 24
    # the hint is what it says: `new --region <it>` writes a stack with a complete total of that amount
    moved = _new(run_cli, tmp_path, *P5_SPOT, "--name", "p5", "--region", alt["region"], "--force")
    assert moved["cost"]["lines_without_price"] == 0 and moved["fully_priced_alternative"] is None
    assert (moved["zone"], moved["instance_type"]) == (alt["zone"], alt["instance_type"])
    assert moved["compute_price_per_hour_usd"] == alt["compute_price_per_hour_usd"]
    assert (moved["cost"]["hourly_usd"], moved["cost"]["run_usd"]) == (alt["hourly_usd"], alt["run_usd"])
    text = run_cli("new", *P5_SPOT, "--name", "p5", "--force", "--project-dir", str(tmp_path))
    assert text.exit_code == 0, text.stderr
    lines = text.stderr.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning: no total:"))
    hint = lines[warning + 1]
    assert hint.startswith(f"note: complete total in {expected}: ${Decimal(alt['compute_price_per_hour_usd']):,.2f}/h")
    assert f"${Decimal(alt['run_usd']):,.2f} for the 24 h run" in hint
    assert f"rerun with --region {expected} --force" in hint


@pytest.fixture
def nat_data_only_in(monkeypatch):
    """The NAT data price kept only in the given regions (every other region loses it)."""
    kept: set[str] = set()
    real = estimate.price

    def price(cloud, key, region):
        if (cloud, key) == NAT_DATA and region not in kept:
            return None
        return real(cloud, key, region)

    monkeypatch.setattr(estimate, "price", price)
    return kept


def test_the_first_priced_region_of_the_ranking_is_named(run_cli, tmp_path, nat_data_only_in):
    ranked = [r for r in _ranked_regions(run_cli) if stack_priced(r)]
    assert len(ranked) >= 2
    cheaper, dearer = ranked[-2], ranked[-1]
    nat_data_only_in.update({dearer, cheaper})  # the cheaper one of the two must be named
    doc = _new(run_cli, tmp_path, *P5_SPOT)
    assert doc["fully_priced_alternative"]["region"] == cheaper
    nat_data_only_in.discard(cheaper)
    doc = _new(run_cli, tmp_path, *P5_SPOT, "--force")
    assert doc["fully_priced_alternative"]["region"] == dearer


def test_no_region_prices_the_line_so_none_is_named(run_cli, tmp_path, nat_data_only_in):
    doc = _new(run_cli, tmp_path, *P5_SPOT)
    assert doc["cost"]["lines_without_price"] >= 1 and doc["fully_priced_alternative"] is None
    text = run_cli("new", *P5_SPOT, "--force", "--project-dir", str(tmp_path))
    assert text.exit_code == 0 and "warning: no total:" in text.stderr
    assert "complete total in" not in text.stderr + text.stdout


def test_a_complete_total_names_no_alternative(run_cli, tmp_path):
    # on-demand p5 is cheapest in us-east-1, which the book prices fully (docs/prices.md)
    doc = _new(run_cli, tmp_path, "--gpus", "8xH100", "--cloud", "aws", "--on-demand")
    assert stack_priced(doc["region"]) and doc["cost"]["lines_without_price"] == 0
    assert "fully_priced_alternative" in doc and doc["fully_priced_alternative"] is None
    text = run_cli(
        "new", "--gpus", "8xH100", "--cloud", "aws", "--on-demand", "--force", "--project-dir", str(tmp_path)
    )
    assert text.exit_code == 0 and "complete total in" not in text.stderr + text.stdout


@pytest.mark.parametrize("where", [("--region", "eu-north-1"), ("--zone", "eun1-az1")])
def test_a_pinned_region_or_zone_names_no_alternative(run_cli, tmp_path, where):
    assert not stack_priced("eu-north-1")  # docs/prices.md: no NAT data price there
    doc = _new(run_cli, tmp_path, *P5_SPOT, *where)
    assert doc["cost"]["run_usd"] is None and doc["fully_priced_alternative"] is None
    text = run_cli("new", *P5_SPOT, *where, "--force", "--project-dir", str(tmp_path))
    assert text.exit_code == 0 and "warning: no total:" in text.stderr
    assert "complete total in" not in text.stderr + text.stdout


def test_a_budget_refusal_of_an_incomplete_total_names_the_priced_region_within_it(run_cli, tmp_path):
    # no budget passes a total with a line without a price (docs/exit-codes.md, exit 2 budget-max-price)
    budget = "100"
    refused = run_cli("new", *P5_SPOT, "--max-price-per-hour", budget, "--project-dir", str(tmp_path))
    chosen = _new(run_cli, tmp_path / "plain", *P5_SPOT)
    if stack_priced(chosen["region"]):
        assert refused.exit_code == 0
        return
    assert refused.exit_code == 2 and not (tmp_path / "stacks").exists()
    lines = refused.stderr.splitlines()
    assert lines[0].startswith("error: budget-max-price: no price for")
    expected = next(r for r in _ranked_regions(run_cli) if r != chosen["region"] and stack_priced(r))
    (hint,) = [line for line in lines if "complete total within the budget" in line]
    assert hint.startswith(f"error: complete total within the budget in {expected}: $")
    assert hint.endswith(f"rerun with --region {expected}")
    hourly = Decimal(hint.split(": $", 1)[1].split("/h", 1)[0].replace(",", ""))
    assert hourly <= Decimal(budget)
    # the rerun it names passes the same budget with a complete total of that amount
    moved = _new(run_cli, tmp_path, *P5_SPOT, "--max-price-per-hour", budget, "--region", expected)
    assert moved["cost"]["lines_without_price"] == 0
    assert Decimal(moved["cost"]["hourly_usd"]).quantize(Decimal("0.01")) == hourly
    # a budget below that region's total: no region within it is named
    tight = hourly - Decimal("0.01")
    refused = run_cli("new", *P5_SPOT, "--max-price-per-hour", str(tight), "--project-dir", str(tmp_path / "t"))
    assert refused.exit_code == 2 and "complete total" not in refused.stderr
    pinned = run_cli(
        "new", *P5_SPOT, "--max-price-per-hour", budget, "--region", chosen["region"], "--project-dir", str(tmp_path)
    )
    assert pinned.exit_code == 2 and "complete total" not in pinned.stderr


def test_cost_of_an_incomplete_stack_names_the_same_alternative(run_cli, tmp_path):
    doc = _new(run_cli, tmp_path, *P5_SPOT, "--name", "p5")
    alt = doc["fully_priced_alternative"]
    result = run_cli("cost", "p5", "--project-dir", str(tmp_path))
    if alt is None:  # the book gained the chosen region's prices
        assert result.exit_code == 0 and "complete total in" not in result.stderr
        return
    assert result.exit_code == 4
    (hint,) = [line for line in result.stderr.splitlines() if line.startswith("note: complete total in")]
    assert hint.startswith(
        f"note: complete total in {alt['region']}: ${Decimal(alt['compute_price_per_hour_usd']):,.2f}/h compute, "
        f"${Decimal(alt['run_usd']):,.2f} for the 24 h run"
    )
    assert f"--region {alt['region']}" in hint
    assert result.stderr.index("note: complete total") < result.stderr.index("error: price-known")
    # a complete stack: no such line
    _new(run_cli, tmp_path, *P5_SPOT, "--name", "p5", "--region", alt["region"], "--force")
    result = run_cli("cost", "p5", "--project-dir", str(tmp_path))
    assert result.exit_code == 0 and "complete total in" not in result.stderr


L4_SPOT = ("--gpus", "1xL4", "--cloud", "aws", "--spot", "--profile", "llm-finetune")


def test_an_alternative_of_another_type_is_priced_from_its_own_preview(run_cli, tmp_path, monkeypatch):
    from gpuinfra import newstack
    from gpuinfra.cost.alternative import MAX_PREVIEWS

    previewed: list[str] = []
    real = newstack.run_preview_cached

    def counted(spec, config=None):
        previewed.append(spec.instance_type)
        return real(spec, config)

    monkeypatch.setattr(newstack, "run_preview_cached", counted)
    doc = _new(run_cli, tmp_path, *L4_SPOT, "--name", "l4")
    alt = doc["fully_priced_alternative"]
    assert len(previewed) <= MAX_PREVIEWS  # bounded: one offline preview per other type and region
    if doc["cost"]["lines_without_price"] == 0:
        assert alt is None
        return
    # the shipped book: the cheapest 1xL4 spot is a g6 in eu-south-2, which has no EBS gp3 price
    # (docs/prices.md); the first fully priced offer of the ranking is of another type
    assert not stack_priced(doc["region"]) and alt["instance_type"] != doc["instance_type"]
    assert alt["instance_type"] in previewed
    moved = _new(run_cli, tmp_path, *L4_SPOT, "--name", "l4", "--region", alt["region"], "--force")
    assert moved["cost"]["lines_without_price"] == 0
    assert (moved["zone"], moved["instance_type"]) == (alt["zone"], alt["instance_type"])
    assert (moved["cost"]["hourly_usd"], moved["cost"]["run_usd"]) == (alt["hourly_usd"], alt["run_usd"])


def test_the_docs_example_is_what_new_prints(run_cli, tmp_path):
    # docs/prices.md shows `new`'s warning and note for the p5 spot request; "(...)" elides a part
    text = (ROOT / "docs" / "prices.md").read_text()
    block = text.split("$ gpuinfra new " + " ".join(P5_SPOT) + "\n", 1)[1].split("```", 1)[0]
    shown = [line for line in block.splitlines() if line and line != "..."]
    result = run_cli("new", *P5_SPOT, "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    printed = result.stderr.splitlines()
    for line in shown:
        pattern = ".*".join(re.escape(part) for part in line.split("(...)"))
        assert any(re.fullmatch(pattern, p) for p in printed), (line, printed)
