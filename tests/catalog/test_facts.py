"""Instance facts follow cluster-facts.md section 4 and agree with EC2 DescribeInstanceTypes."""

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
    assert f.local_nvme_count == nvme and f.nvswitch is nvswitch and f.cluster_placement
    assert f.nic_layout == ("efa" if efa else "ena") and f.mtu == 9001


@pytest.mark.parametrize(
    ("mtype", "layout", "gpu_nics", "mtu", "lssd", "compact"),
    [
        ("a2-highgpu-4g", "gvnic", 0, 1460, 0, True),
        ("a2-ultragpu-8g", "gvnic", 0, 1460, 8, True),
        ("a3-highgpu-8g", "tcpx", 4, 8244, 16, True),
        ("a3-megagpu-8g", "tcpxo", 8, 8244, 16, True),
        ("a3-ultragpu-8g", "gib", 8, 8896, 32, True),
        ("g2-standard-4", "gvnic", 0, 1460, 0, True),
        ("n1-standard-8", "gvnic", 0, 1460, 0, False),
    ],
)
def test_gcp_facts(mtype, layout, gpu_nics, mtu, lssd, compact):
    f = load_catalog().fact("gcp", mtype)
    assert (f.nic_layout, f.gpu_nic_count, f.mtu, f.local_nvme_count, f.cluster_placement) == (layout, gpu_nics, mtu, lssd, compact)
    assert f.local_nvme_size_gib == (375.0 if lssd else 0.0)


def test_every_offered_type_has_facts():
    catalog = load_catalog()
    missing = {(o.cloud, o.instance_type) for o in catalog.offers if catalog.fact(o.cloud, o.instance_type) is None}
    assert missing == set()


@pytest.mark.parametrize(
    ("text", "gbps"),
    [("100 Gigabit", 100.0), ("4x 100 Gigabit", 400.0), ("Up to 25 Gigabit", 25.0), ("3200 Gigabit", 3200.0), ("Moderate", None)],
)
def test_network_performance(text, gbps):
    assert parse_network_performance_gbps(text) == gbps
