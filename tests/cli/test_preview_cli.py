"""`gpuinfra preview` on stack files written by `gpuinfra new`."""

from __future__ import annotations

import json
from decimal import Decimal

import yaml


def test_preview_json_of_a_two_node_p5_stack(run_cli, tmp_path):
    assert (
        run_cli(
            "new",
            "--gpus",
            "8xH100",
            "--nodes",
            "2",
            "--cloud",
            "aws",
            "--profile",
            "llm-pretrain",
            "--name",
            "p5x2",
            "--project-dir",
            str(tmp_path),
        ).exit_code
        == 0
    )
    result = run_cli("preview", "p5x2", "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["stack"] == "p5x2"
    assert all(set(r) >= {"type", "name", "parent", "inputs"} for r in doc["resources"])
    component = [r for r in doc["resources"] if r["type"] == "gpuinfra:aws:GpuCluster"]
    assert len(component) == 1 and component[0]["parent"] is None
    # children of the cluster, or of its monitoring component (itself a child of the cluster)
    assert all(
        r["parent"] in ("p5x2", "p5x2-monitoring") for r in doc["resources"] if r["type"] != "gpuinfra:aws:GpuCluster"
    )
    assert next(r for r in doc["resources"] if r["type"] == "gpuinfra:aws:Monitoring")["parent"] == "p5x2"
    lt = next(r for r in doc["resources"] if r["type"] == "aws:ec2/launchTemplate:LaunchTemplate")["inputs"]
    assert sorted(n["networkCardIndex"] for n in lt["networkInterfaces"]) == list(range(32))
    assert doc["outputs"]["efa_interfaces_per_node"] == 32
    assert (
        doc["outputs"]["price_per_hour_usd"] == "110.080000"
    )  # 2 x 55.04 us-east-1 on-demand, catalog 2026-11-22; 6 places (README "JSON output")


def test_preview_tree_names_key_inputs(run_cli, tmp_path):
    run_cli("new", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "p4", "--project-dir", str(tmp_path))
    out = run_cli("preview", "p4", "--project-dir", str(tmp_path)).stdout
    assert "gpuinfra:aws:GpuCluster p4" in out
    assert "NICs=4 (1 efa, 3 efa-only; cards 0..3)" in out and "httpTokens=required" in out
    assert "strategy=cluster" in out and "next: gpuinfra up p4" in out


def test_preview_of_an_unknown_stack(run_cli, tmp_path):
    result = run_cli("preview", "nope", "--project-dir", str(tmp_path))
    assert result.exit_code == 2 and result.stderr.startswith("error: no stack 'nope':")


def test_preview_rejects_an_edited_invalid_spec(run_cli, tmp_path):
    run_cli("new", "--instance-type", "g5.xlarge", "--profile", "dev", "--name", "g5", "--project-dir", str(tmp_path))
    path = tmp_path / "stacks" / "Pulumi.g5.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["profile"]["high_bandwidth_networking"] = "required"
    path.write_text(yaml.safe_dump(doc))
    result = run_cli("preview", "g5", "--project-dir", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr == (
        "error: high-bandwidth-nics: profile 'dev' requires EFA, but g5.xlarge has no EFA (EFA types include "
        "p4d.24xlarge, p5.48xlarge, g6e.48xlarge, g5.8xlarge and larger) (source: "
        "docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html; cloud.google.com/compute/docs/gpus/gpudirect)\n"
    )
    doc["config"]["gpuinfra:cluster"]["nodes"] = 0
    path.write_text(yaml.safe_dump(doc))
    result = run_cli("preview", "g5", "--project-dir", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: gpuinfra:cluster.nodes: Input should be greater than or equal to 1")


def test_preview_cache_is_reused_and_invalidated(run_cli, tmp_path, monkeypatch):
    from gpuinfra import preview as preview_module

    run_cli("new", "--instance-type", "p4d.24xlarge", "--name", "c", "--project-dir", str(tmp_path))
    first = run_cli("cost", "c", "--project-dir", str(tmp_path), "--json").stdout
    assert len(list(preview_module.cache_dir().glob("*.json"))) == 1  # written by `new`, reused by `cost`

    def no_program(*args):
        raise AssertionError("the program ran although the cache holds this stack")

    monkeypatch.setattr(preview_module, "_run", no_program)
    assert run_cli("cost", "c", "--project-dir", str(tmp_path), "--json").stdout == first
    path = tmp_path / "stacks" / "Pulumi.c.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["nodes"] = 3
    path.write_text(yaml.safe_dump(doc))
    result = run_cli("cost", "c", "--project-dir", str(tmp_path), "--json")  # changed spec: must run again
    assert result.exit_code == 1 and "the program ran although the cache holds this stack" in result.stderr
    monkeypatch.setenv("GPUINFRA_NO_CACHE", "1")
    assert run_cli("preview", "c", "--project-dir", str(tmp_path)).exit_code == 1  # cache off: runs the program


def _edit(path, change):
    doc = yaml.safe_load(path.read_text())
    change(doc["config"]["gpuinfra:cluster"])
    path.write_text(yaml.safe_dump(doc))


def test_preview_refuses_hand_edited_rule_violations_by_rule_name(run_cli, tmp_path):
    assert (
        run_cli(
            "new",
            "--instance-type",
            "n1-standard-8",
            "--gpus",
            "1xT4",
            "--profile",
            "lora-finetune",
            "--name",
            "n1",
            "--project-dir",
            str(tmp_path),
        ).exit_code
        == 0
    )
    n1 = tmp_path / "stacks" / "Pulumi.n1.yaml"
    _edit(n1, lambda c: (c.update(nodes=2), c["profile"].update(placement="required")))
    result = run_cli("preview", "n1", "--project-dir", str(tmp_path))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: gcp-placement-supported: ")
    assert result.stderr.count("\n") == 1

    assert (
        run_cli("new", "--gpus", "4xA100", "--cloud", "gcp", "--name", "a2", "--project-dir", str(tmp_path)).exit_code
        == 0
    )
    a2 = tmp_path / "stacks" / "Pulumi.a2.yaml"
    original = a2.read_text()
    _edit(a2, lambda c: c["profile"]["scratch"].update(min_gib=4000))  # a2-highgpu-4g takes 4 or 8 x 375 GiB
    result = run_cli("preview", "a2", "--project-dir", str(tmp_path))
    assert result.exit_code == 2 and result.stderr.startswith("error: gcp-local-ssd-count: ")
    assert "takes local SSD counts 4, 8 of 375 GiB" in result.stderr
    a2.write_text(original)
    _edit(a2, lambda c: c["facts"]["local_ssd"].update(attach_counts=[2, 4, 8]))  # facts edited by hand
    result = run_cli("preview", "a2", "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 2 and result.stdout == ""
    assert (
        result.stderr.startswith("error: facts-current: the stack's facts of a2-highgpu-4g differ")
        and "local_ssd" in result.stderr
    )


def test_spot_fleet_max_price_is_the_budgeted_spot_price(run_cli, tmp_path, monkeypatch):
    args = ("--gpus", "8xH100", "--nodes", "2", "--cloud", "aws", "--region", "us-east-1", "--spot")
    new = run_cli("new", *args, "--profile", "llm-pretrain", "--name", "p5s", "--project-dir", str(tmp_path), "--json")
    assert new.exit_code == 0, new.stderr
    # us-east-1 p5.48xlarge: spot_max 52.0766 of the Vantage extract of 2025-11-30
    # (tsaol/aws-gpu data/gpu_instances_raw.json @2d0108c), the price budgets use
    cluster = yaml.safe_load((tmp_path / "stacks" / "Pulumi.p5s.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert Decimal(cluster["spot_max_price_per_hour_usd"]) == Decimal("52.0766")
    cost = json.loads(run_cli("cost", "p5s", "--project-dir", str(tmp_path), "--json").stdout)
    compute = next(line for line in cost["lines"] if line["component"].startswith("Instance usage"))
    doc = json.loads(run_cli("preview", "p5s", "--project-dir", str(tmp_path), "--json").stdout)
    fleet = next(r for r in doc["resources"] if r["type"] == "aws:ec2/fleet:Fleet")["inputs"]
    max_price = fleet["launchTemplateConfigs"][0]["overrides"][0]["maxPrice"]
    assert Decimal(max_price) == Decimal("52.0766")
    assert Decimal(max_price) == Decimal(compute["unit_price_usd"])  # exactly the estimate's spot price
    assert Decimal(fleet["spotOptions"]["maxTotalPrice"]) == 2 * Decimal(max_price)
    monkeypatch.setenv("COLUMNS", "400")  # the fleet's tree line unwrapped
    preview_text = run_cli("preview", "p5s", "--project-dir", str(tmp_path)).stdout
    assert "spot maxPrice=52.07660/instance-h maxTotalPrice=104.15320/h" in preview_text


def test_spot_max_price_flag_is_validated_and_written(run_cli, tmp_path):
    base = ("new", "--gpus", "8xH100", "--cloud", "aws", "--region", "us-east-1", "--spot", "--project-dir")
    above = run_cli(*base, str(tmp_path / "a"), "--spot-max-price", "60")
    assert above.exit_code == 2
    assert above.stderr.startswith("error: --spot-max-price 60 is above the on-demand price 55.04 of p5.48xlarge")
    assert not (tmp_path / "a").exists()
    negative = run_cli(*base, str(tmp_path / "b"), "--spot-max-price", "-1")
    assert negative.exit_code == 2 and "must be a positive USD amount" in negative.stderr
    gcp = run_cli(
        "new",
        "--gpus",
        "8xH100",
        "--cloud",
        "gcp",
        "--spot",
        "--spot-max-price",
        "40",
        "--project-dir",
        str(tmp_path / "c"),
    )
    assert gcp.exit_code == 2 and "GCP Spot VMs have no max price" in gcp.stderr
    ok = run_cli(*base, str(tmp_path / "d"), "--spot-max-price", "30.5", "--name", "p5m")
    assert ok.exit_code == 0, ok.stderr
    cluster = yaml.safe_load((tmp_path / "d" / "stacks" / "Pulumi.p5m.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert Decimal(cluster["spot_max_price_per_hour_usd"]) == Decimal("30.5")
    assert "fleet max price $30.50000/instance-h" in ok.stdout


def test_new_flags_a_spot_price_equal_to_on_demand(run_cli, tmp_path):
    # an AWS offer whose spot equals on-demand (a dated maximum above on-demand is capped there,
    # or the snapshot's point equals it)
    from gpuinfra.catalog.store import load_catalog

    flagged = next(o for o in load_catalog().offers if o.cloud == "aws" and o.spot_not_discounted and not o.local_zone)
    args = ("new", "--instance-type", flagged.instance_type, "--zone", flagged.zone, "--spot", "--profile", "dev")
    result = run_cli(*args, "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    spot = json.loads(result.stdout)["spot"]
    assert spot["spot_not_discounted"] is True
    assert spot["spot_price_per_node_hour_usd"] == spot["fleet_max_price_per_instance_hour_usd"]
    text = run_cli(*args, "--name", "t2", "--project-dir", str(tmp_path)).stdout
    assert "! spot is not below on-demand here: no saving" in text
