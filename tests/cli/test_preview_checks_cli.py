"""`preview` checks a hand-edited stack file as `new` would have: node limits and types, a
created_at in the future, recorded GPU facts, a known region and a zone inside it, a known data
location. Each edit is refused with one line naming it, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    from gpuinfra.cli import main

    folder = tmp_path_factory.mktemp("project")
    for args in (["--gpus", "4xA100", "--name", "g1"], ["--gpus", "8xA100", "--cloud", "aws", "--name", "a1"]):
        try:
            main(["new", *args, "--project-dir", str(folder)])
        except SystemExit as exc:
            assert exc.code in (0, None)
    return folder


def _edited(project: Path, source: str, name: str, change) -> str:
    doc = yaml.safe_load((project / "stacks" / f"Pulumi.{source}.yaml").read_text())
    cluster = doc["config"]["gpuinfra:cluster"]
    cluster["stack"] = name
    change(doc, cluster)
    (project / "stacks" / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return name


EDITS = {
    # the TTL (the main watchdog) counts from created_at: a future one moves it
    "created-future": ("g1", lambda d, c: c.update(created_at="2099-01-01T00:00:00Z"), "is in the future"),
    "nodes-true": ("g1", lambda d, c: c.update(nodes=True), "gpuinfra:cluster.nodes: Input should be a valid integer"),
    # one zonal MIG holds 1,000 VMs; one instant EC2 Fleet starts at most 1,000 (MinTargetCapacity)
    "gcp-1200": ("g1", lambda d, c: c.update(nodes=1200), "nodes 1200 is over the GCP limit of 1000 VMs"),
    "aws-1200": ("a1", lambda d, c: c.update(nodes=1200), "nodes 1200 is over the AWS limit of 1000 instances"),
    # an A100 40GB has 40 GiB (EC2 p4d GpuInfo 40,960 MiB), not 800
    "gpu-facts": (
        "g1",
        lambda d, c: c["gpu_facts"].update(memory_gib=800.0),
        "facts-current: the stack's gpu_facts of A100 differ from the catalog's in memory_gib",
    ),
    "data-mars": (
        "g1",
        lambda d, c: c.update(data={"cloud": "aws", "location": "mars-1", "size_gb": 5}),
        "data location 'mars-1' is not an AWS region like us-east-1",
    ),
    "region-mars": (
        "a1",
        lambda d, c: (c.update(region="mars-1"), d["config"].update({"aws:region": "mars-1"})),
        "offered-in-zone: region 'mars-1' has no AWS GPU offer in the catalog",
    ),
    # use1-az1 is a us-east-1 AZ ID; us-east-2's are use2-az1..az3
    "zone-elsewhere": (
        "a1",
        lambda d, c: (c.update(region="us-east-2"), d["config"].update({"aws:region": "us-east-2"})),
        "is in us-east-1, not in the stack's region us-east-2",
    ),
    # a Capacity Block is paid up front: a fee of 0 would price a p4d block at nothing
    "block-fee-zero": (
        "a1",
        lambda d, c: c.update(
            capacity_block=True,
            capacity_reservation_id="cr-0123456789abcdef0",
            capacity_block_upfront_usd="0",
            capacity_block_price_source="the bill",
            capacity_block_price_date="2026-11-20",
        ),
        "capacity_block_upfront_usd must be above 0",
    ),
    "block-date-bad": (
        "a1",
        lambda d, c: c.update(
            capacity_block=True,
            capacity_reservation_id="cr-0123456789abcdef0",
            capacity_block_upfront_usd="1234.5",
            capacity_block_price_source="the bill",
            capacity_block_price_date="2026-19-39",
        ),
        "capacity_block_price_date '2026-19-39' is not a date",
    ),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_preview_refuses_a_hand_edit_new_would_refuse(run_cli, project, case):
    source, change, words = EDITS[case]
    name = _edited(project, source, case, change)
    result = run_cli("preview", name, "--project-dir", str(project))
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and words in result.stderr, result.stderr


def test_the_unedited_stacks_preview_cleanly(run_cli, project):
    for name in ("g1", "a1"):
        result = run_cli("preview", name, "--project-dir", str(project))
        assert result.exit_code == 0 and "no violation" in result.stdout, result.stderr
