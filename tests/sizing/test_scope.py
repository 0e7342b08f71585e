"""Sizing in a scope (cloud, region, market) and `gpuinfra new --model/--params` planning what it sized.

Cloud facts the tests stand on:
- A3 High with 1, 2 or 4 GPUs: "you must create instances by using Spot VMs or Flex-start VMs"
  (cloud.google.com/compute/docs/accelerator-optimized-machines#a3-high-vms).
- A3 Ultra and A4 are sold as Spot, Flex-start and reservations, not on demand
  (cloud.google.com/ai-hypercomputer/docs/consumption-models).
- A3 High 8g's GPUDirect-TCPX needs a kernel no public image has, so gpuinfra nodes cannot use it
  without a bake (rule fabric-installable-at-boot); A3 Mega's GPUDirect-TCPXO installs at boot
  (8 GPU NICs x 200 Gbps, cloud.google.com/compute/docs/gpus/gpudirect).
Prices are the shipped catalog's (offers.csv: on-demand Cyclenerd pricing.yml 2026-08-20, spot
SkyPilot v8 GCP catalog).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import CatalogError, NoOfferError
from gpuinfra.newstack import NewStackRequest, create_stack
from gpuinfra.offers import OfferScope
from gpuinfra.planner import PlanRequest
from gpuinfra.sizing.recommend import candidates, nothing_fits, sizing_request
from gpuinfra.sizing.report import size_document
from gpuinfra.sizing.supply import fast_types

NOW = datetime(2026, 11, 23, 1, 0, tzinfo=UTC)
NOT_ON_DEMAND = {"a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g", "a3-ultragpu-8g", "a4-highgpu-8g"}


def test_on_demand_candidates_leave_out_types_google_sells_only_as_spot_or_flex_start():
    # LoRA on a 70B base sharded with FSDP: 4 x H100 would hold it, but a3-highgpu-4g is spot/flex-start only
    req = sizing_request(params="70B", method="lora", strategy="fsdp")
    ranked = candidates(req, load_catalog(), OfferScope(cloud="gcp"))
    types = {c.offer["instance_type"] for c in ranked}
    assert types and not types & NOT_ON_DEMAND
    assert {c.offer["market"] for c in ranked} == {"on-demand"}
    spot = candidates(req, load_catalog(), OfferScope(cloud="gcp", markets=("spot",)))
    assert "a3-highgpu-4g" in {c.offer["instance_type"] for c in spot}


def test_spot_scope_prices_spot():
    doc = size_document(
        sizing_request(model="llama-3.1-8b", method="lora"),
        spot=True,
        scope=OfferScope(region="us-central1", markets=("spot",)),
    )
    best = doc["candidates"][0]
    # a2-highgpu-1g us-central1: $1.92802/h spot (Cyclenerd pricing.yml @fd66b26 hour_spot, 2026-07-30),
    # $3.67338/h on demand (Cyclenerd @dac31281)
    assert (best["gpus"], best["instance_type"], best["market"], best["price_per_hour_usd"]) == (
        "1xA100",
        "a2-highgpu-1g",
        "spot",
        "1.928020",
    )
    assert doc["scope"] == {"cloud": None, "region": "us-central1", "markets": ["spot"]}
    assert (
        doc["next_command"]
        == "gpuinfra new --profile lora-finetune --gpus 1xA100 --nodes 1 --region us-central1 --spot"
    )


def test_sharded_multi_node_is_planned_on_a_gpudirect_type_only():
    # 30B full fine-tuning on GCP on demand without recompute: 8 x H100 x 2 nodes; A3 Mega
    # (TCPXO), never A3 High (TCPX not installable at boot) nor A3 Ultra / A4 (not sold on demand).
    # (Left to choose, full recompute holds it on one node: test_new_with_params_on_gcp_plans_what_was_sized.)
    assert fast_types(load_catalog(), "H100", 8, OfferScope(cloud="gcp")) == ["a3-megagpu-8g"]
    doc = size_document(sizing_request(params="30B", method="full", recompute="none"), scope=OfferScope(cloud="gcp"))
    assert (doc["gpus"], doc["nodes"], doc["recommendation"]["instance_type"]) == ("8xH100", 2, "a3-megagpu-8g")
    assert (
        doc["next_command"] == "gpuinfra new --profile llm-finetune --instance-type a3-megagpu-8g --nodes 2 --cloud gcp"
    )


def test_new_with_params_on_gcp_plans_what_was_sized(tmp_path):
    """Before: `new --params 30B --method full --cloud gcp` sized an 8xH200 (A3 Ultra) and the
    planner refused it (not sold on demand), exit 4."""
    result = create_stack(
        NewStackRequest(PlanRequest(None, cloud="gcp", name="g30"), params="30B", method="full"), tmp_path, now=NOW
    )
    spec = result.plan.spec
    # without recompute 30B needs two 8 x H100 nodes; with full recompute (sized so because none
    # does not fit one node) one 8 x A100-80GB node (A2 Ultra, the cheapest per hour) holds it
    assert (spec.cloud, spec.instance_type, spec.nodes, result.pricing) == ("gcp", "a2-ultragpu-8g", 1, "on-demand")
    sizing = result.to_json()["sizing"]
    assert (sizing["gpus"], sizing["recompute"]) == ("8xA100-80GB", "full") and result.sizing.passed_over == ()
    assert sizing["recompute_source"].startswith("none does not fit in 79.14 GiB")  # gpus.json A100-80GB


def test_new_passes_over_configurations_the_profile_refuses(tmp_path):
    # llm-pretrain requires EFA/GPUDirect NICs: the cheaper single-GPU configurations that hold
    # 1B are named with the rule, and the stack is the first one that has them
    result = create_stack(
        NewStackRequest(PlanRequest(None, cloud="gcp", name="p1"), params="1B", method="pretrain"), tmp_path, now=NOW
    )
    assert result.plan.spec.instance_type == "a3-megagpu-8g"
    first = result.sizing.passed_over[0]
    # one L4 holds 1B with full recompute (none does not fit it): the cheapest, and refused
    assert first.startswith("1xL4 x 1 node(s): ") and "rule high-bandwidth-nics" in first


def test_new_sized_on_aws_stays_on_aws(tmp_path):
    """Before: a 30B LoRA sized to 1 x A100-80GB (a GCP shape) and `--cloud aws` then found no AWS
    type with 1 or 2 of them, exit 4."""
    result = create_stack(
        NewStackRequest(PlanRequest(None, cloud="aws", name="a30", spot=False), params="30B", method="lora"),
        tmp_path,
        now=NOW,
    )
    assert result.plan.spec.cloud == "aws" and result.plan.spec.gpu in ("A100-80GB", "H100", "H200", "B200")


def test_nothing_fits_names_the_wider_place_and_the_spot_market():
    # 70B full fine-tuning on GCP on demand without recompute: A3 Mega x 64 is not enough; A4 (B200)
    # holds it but is spot only; AWS p6-b200 on demand holds it. (Pipeline parallel would hold it,
    # and so would full recompute on 4 A3 Mega nodes.)
    req = sizing_request(params="70B", method="full", tp=1, pp=1, recompute="none")
    scope = OfferScope(cloud="gcp")
    assert candidates(req, load_catalog(), scope) == []
    message = str(nothing_fits(req, scope, load_catalog()))
    assert message.startswith("no configuration in the catalog on gcp sold on-demand fits 70B params (full, bf16)")
    assert message.endswith(
        "try --method lora or qlora, without --tp / --pp (chosen to fit when not given), --recompute full, "
        "a shorter --seq, without --cloud, "
        "--spot (some GPU types are sold only as spot)"
    )


def test_size_cli_scope_options(run_cli):
    result = run_cli(
        "size", "--params", "70B", "--method", "full", "--cloud", "gcp", "--tp", "1", "--pp", "1", "--recompute", "none"
    )
    assert result.exit_code == 4 and "--spot (some GPU types are sold only as spot)" in result.stderr
    result = run_cli(
        "size",
        *("--params", "70B", "--method", "full", "--cloud", "gcp", "--spot", "--tp", "1", "--pp", "1"),
        *("--recompute", "none", "--json"),
    )
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["recommendation"]["market"] == "spot"
    assert doc["recommendation"]["instance_type"] == "a4-highgpu-8g"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--cloud", "azure"), "unknown cloud 'azure'; choose one of: aws, gcp"),
        (("--cloud", "aws", "--region", "us-central1"), "'us-central1' is a GCP region, not an AWS one"),
    ],
)
def test_size_refuses_an_unknown_scope(run_cli, args, message):
    result = run_cli("size", "--params", "7B", *args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_scope_is_validated_in_the_library():
    with pytest.raises(CatalogError, match="unknown cloud"):
        size_document(sizing_request(params="7B"), scope=OfferScope(cloud="azure"))


def test_new_where_nothing_fits_in_the_scope_writes_nothing(tmp_path):
    # 2T full fine-tuning holds on no GCP on-demand shape even pipelined over 64 nodes
    with pytest.raises(NoOfferError, match="^no configuration in the catalog on gcp sold on-demand fits 2000B params"):
        create_stack(
            NewStackRequest(PlanRequest(None, cloud="gcp", name="x"), params="2T", method="full"), tmp_path, now=NOW
        )
    assert list(tmp_path.iterdir()) == []


def test_new_cli_prints_what_it_passed_over(run_cli, tmp_path):
    result = run_cli("new", "--params", "1B", "--method", "pretrain", "--cloud", "gcp", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    # at the largest micro-batch that fits (layout.MICRO_BATCHES), not micro-batch 1
    # an H100 reports 79.18 GiB (gpus.json device_memory_gib, measured)
    assert lines[0] == "sized 1B params (pretrain): 60.2 GiB per GPU of 79.18 -> --gpus 8xH100 --nodes 1"
    # one L4 holds 1B only with full recompute; 8 x H100 holds it without (no recompute note)
    assert lines[1].startswith("  note: passed over 1xL4 x 1 node(s): ") and "rule high-bandwidth-nics" in lines[1]
    assert any(
        line.startswith("  note: and ") and line.endswith("more configuration(s) (--json lists them)") for line in lines
    )


def test_new_keeps_the_cheapest_plan_when_the_planner_rounds_up(tmp_path):
    """7B pretraining (FSDP over the nodes): configurations without EFA/GPUDirect, which
    llm-pretrain requires, are passed over (one 8 x L4 GCP node); two g6.12xlarge (4 x L4, EFA)
    at 2 x $4.6016/h are what the stack gets: 7B holds on 8 L4s with full recompute, sized so
    because no recompute does not fit (without recompute it took two p5.4xlarge, 1 x H100)."""
    result = create_stack(
        NewStackRequest(PlanRequest(None, name="p7"), params="7B", method="pretrain"), tmp_path, now=NOW
    )
    spec = result.plan.spec
    assert (spec.instance_type, spec.nodes, str(result.plan.offer.price_per_hour_usd)) == (
        "g6.12xlarge",
        2,
        "9.20320",
    )
    sizing = result.to_json()["sizing"]
    assert (sizing["gpus"], sizing["recompute"]) == ("4xL4", "full")
    assert sizing["recompute_source"].startswith("none does not fit in 22.03 GiB")


def test_new_passes_over_plans_over_the_budget(tmp_path):
    result = create_stack(
        NewStackRequest(PlanRequest(None, name="b7", max_price_per_hour_usd=14.5), params="7B", method="pretrain"),
        tmp_path,
        now=NOW,
    )
    assert result.plan.spec.instance_type == "g6.12xlarge"  # 2 x $4.6016/h (full recompute, test above)
    with pytest.raises(NoOfferError, match="over --max-price-per-hour 9"):
        create_stack(
            NewStackRequest(PlanRequest(None, name="b8", max_price_per_hour_usd=9.0), params="7B", method="pretrain"),
            tmp_path / "x",
            now=NOW,
        )


def test_new_names_why_no_configuration_could_be_planned(tmp_path):
    # me-central2 sells only configurations without EFA/GPUDirect: llm-pretrain refuses them all
    with pytest.raises(
        NoOfferError,
        match=r"^\d+ configuration\(s\) fit 1B params \(pretrain\) but none can be "
        r"planned with profile 'llm-pretrain': .*rule high-bandwidth-nics",
    ):
        create_stack(
            NewStackRequest(PlanRequest(None, region="me-central2", name="m"), params="1B", method="pretrain"),
            tmp_path,
            now=NOW,
        )
    assert list(tmp_path.iterdir()) == []


def test_passed_over_notes_carry_no_planner_advice(tmp_path):
    result = create_stack(
        NewStackRequest(PlanRequest(None, cloud="gcp", name="p1"), params="1B", method="pretrain"), tmp_path, now=NOW
    )
    assert result.sizing.passed_over and not any(
        "--strict" in r or "pick another" in r for r in result.sizing.passed_over
    )


def test_a_baked_tcpx_image_makes_a3_high_a_fast_type_for_sizing():
    """A3 High's GPUDirect-TCPX is usable when the node image carries it (a bake): sizing may
    then shard over a3-highgpu-8g nodes, timed over its 4 x 200 Gbps GPU NICs."""
    catalog = load_catalog()
    assert fast_types(catalog, "H100", 8, OfferScope(cloud="gcp")) == ["a3-megagpu-8g"]
    baked = OfferScope(cloud="gcp", instance_type="a3-highgpu-8g", image_fabric="tcpx")
    assert fast_types(catalog, "H100", 8, baked) == ["a3-highgpu-8g"]
    # without recompute 30B needs two nodes (full recompute would hold it on one)
    ranked = candidates(sizing_request(params="30B", method="full", recompute="none"), catalog, baked)
    assert (ranked[0].spec, ranked[0].nodes, ranked[0].network_bandwidth_gbps) == ("8xH100", 2, 800.0)


def test_new_hints_name_only_flags_new_has():
    message = str(
        nothing_fits(
            sizing_request(params="70B", method="lora"), OfferScope(cloud="gcp"), load_catalog(), command="new"
        )
    )
    assert "try --method qlora, " in message and message.endswith(
        ", `gpuinfra size` with --strategy fsdp (shards the frozen base) or a shorter --seq"
    )
