"""Instance facts follow docs/sources/cluster-facts.md section 4 and agree with EC2 DescribeInstanceTypes."""

from __future__ import annotations

import pytest

from gpuinfra.catalog.facts import parse_network_performance_gbps
from gpuinfra.catalog.store import load_catalog


@pytest.mark.parametrize(
    ("itype", "efa", "cards", "per_card", "nvme", "nvswitch"),
    [
        ("g5.xlarge", 0, 1, 4, 1, False),
        ("g6e.48xlarge", 4, 4, 10, 4, False),
        ("g6e.24xlarge", 2, 2, 10, 2, False),
        ("p4d.24xlarge", 4, 4, 15, 8, True),
        ("p4de.24xlarge", 4, 4, 15, 8, True),
        ("p5.48xlarge", 32, 32, 2, 8, True),
        ("p5en.48xlarge", 16, 16, 4, 8, True),
        ("p6-b200.48xlarge", 8, 8, 4, 8, True),
        ("p3.2xlarge", 0, 1, 4, 0, False),
        ("g4dn.8xlarge", 1, 1, 4, 1, False),
    ],
)
def test_aws_facts(itype, efa, cards, per_card, nvme, nvswitch):
    f = load_catalog().fact("aws", itype)
    assert (f.max_efa_interfaces, f.network_cards, f.max_interfaces_per_network_card) == (efa, cards, per_card)
    assert f.local_ssd.bundled_count == nvme and f.nvswitch is nvswitch and f.placement.cluster_placement_group
    assert f.nic_layout == ("efa" if efa else "ena") and f.mtu == 9001
    assert f.local_ssd.attach_counts == ()  # instance store comes with the type


@pytest.mark.parametrize(
    ("itype", "models"),
    [
        # EC2 DescribeInstanceTypes SupportedUsageClasses
        ("p5.48xlarge", ("capacity-block", "on-demand", "spot")),
        ("p4d.24xlarge", ("capacity-block", "on-demand", "spot")),
        ("g5.xlarge", ("on-demand", "spot")),
    ],
)
def test_aws_provisioning_models(itype, models):
    assert load_catalog().fact("aws", itype).provisioning_models == models


@pytest.mark.parametrize(
    ("mtype", "layout", "gpu_nics", "mtu", "bundled", "attach", "compact", "workload"),
    [
        # cloud.google.com/compute/docs/disks/local-ssd#choose_number_local_ssds: A2 Standard
        # attach counts per type, A2 Ultra / A3 / G2 fixed counts; MTUs: cluster-toolkit blueprints;
        # placement: cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy --
        # compact policies (standalone / bulk-created VMs) on A4, A3 Ultra, A3 Mega, A3 High, A2, G2;
        # workload policies (MIGs with clustered GPUs) on A4, A3 Ultra, A3 Mega, A3 High 8g; N1 neither
        ("a2-highgpu-1g", "gvnic", 0, 1460, 0, (1, 2, 4, 8), True, False),
        ("a2-highgpu-4g", "gvnic", 0, 1460, 0, (4, 8), True, False),
        ("a2-highgpu-8g", "gvnic", 0, 1460, 0, (8,), True, False),
        ("a2-megagpu-16g", "gvnic", 0, 1460, 0, (8,), True, False),
        ("a2-ultragpu-8g", "gvnic", 0, 1460, 8, (), True, False),
        ("a3-highgpu-1g", "gvnic", 0, 8244, 2, (), True, False),
        ("a3-highgpu-4g", "gvnic", 0, 8244, 8, (), True, False),
        ("a3-highgpu-8g", "tcpx", 4, 8244, 16, (), True, True),
        ("a3-megagpu-8g", "tcpxo", 8, 8244, 16, (), True, True),
        ("a3-ultragpu-8g", "gib", 8, 8896, 32, (), True, True),
        ("a4-highgpu-8g", "gib", 8, 8896, 32, (), True, True),
        ("g2-standard-4", "gvnic", 0, 1460, 0, (1,), True, False),
        ("g2-standard-24", "gvnic", 0, 1460, 0, (2,), True, False),
        ("g2-standard-48", "gvnic", 0, 1460, 0, (4,), True, False),
        ("g2-standard-96", "gvnic", 0, 1460, 0, (8,), True, False),
        ("n1-standard-8", "gvnic", 0, 1460, 0, (1, 2, 3, 4, 5, 6, 7, 8, 16), False, False),
    ],
)
def test_gcp_facts(mtype, layout, gpu_nics, mtu, bundled, attach, compact, workload):
    f = load_catalog().fact("gcp", mtype)
    assert (f.nic_layout, f.gpu_nic_count, f.mtu) == (layout, gpu_nics, mtu)
    assert (f.local_ssd.bundled_count, f.local_ssd.attach_counts) == (bundled, attach)
    assert f.local_ssd.size_gib == 375.0 and f.local_ssd.interface == "NVME"
    assert (f.placement.compact_policy, f.placement.workload_policy) == (compact, workload)


@pytest.mark.parametrize(
    ("mtype", "on_demand"),
    [
        # cloud.google.com/compute/docs/accelerator-optimized-machines: a3-highgpu-1g/2g/4g are
        # Spot / Flex-start only; A3 Ultra and A4 are not sold on demand
        ("a3-highgpu-1g", False),
        ("a3-highgpu-4g", False),
        ("a3-ultragpu-8g", False),
        ("a4-highgpu-8g", False),
        ("a3-highgpu-8g", True),
        ("a3-megagpu-8g", True),
        ("a2-highgpu-4g", True),
        ("g2-standard-8", True),
    ],
)
def test_gcp_on_demand(mtype, on_demand):
    assert load_catalog().fact("gcp", mtype).offers_model("on-demand") is on_demand


def test_gcp_boot_disks_a3_ultra_and_a4_take_hyperdisk_only():
    catalog = load_catalog()
    for mtype in ("a3-ultragpu-8g", "a4-highgpu-8g"):
        assert catalog.fact("gcp", mtype).boot_disk_types == ("hyperdisk-balanced",)


def test_one_memory_value_per_gpu_model():
    from gpuinfra.catalog.gpus import gpu_model

    catalog = load_catalog()
    for gpu in {o.gpu for o in catalog.offers}:
        assert {o.gpu_memory_gib for o in catalog.offers if o.gpu == gpu} == {gpu_model(gpu).memory_gib}
    assert gpu_model("L4").memory_gib == gpu_model("A10G").memory_gib == 22.35  # EC2 GpuInfo 22,888 MiB


def test_every_fact_cites_its_source():
    for fact in load_catalog().facts.values():
        assert fact.sources and all(v for v in fact.sources.values())
        if fact.cloud == "gcp":
            assert {"networks", "local_ssd", "placement", "provisioning_models", "boot_disk_types"} <= set(fact.sources)


def test_every_offered_type_has_facts():
    catalog = load_catalog()
    missing = {(o.cloud, o.instance_type) for o in catalog.offers if catalog.fact(o.cloud, o.instance_type) is None}
    assert missing == set()


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("100 Gigabit", 100.0),
        ("4x 100 Gigabit", 400.0),
        ("Up to 25 Gigabit", 25.0),
        ("3200 Gigabit", 3200.0),
        ("Moderate", None),
    ],
)
def test_network_performance(text, gbps):
    assert parse_network_performance_gbps(text) == gbps
