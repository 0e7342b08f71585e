"""GCP network bandwidth in the catalog facts (``gcp_machine_facts.json`` ``network_bandwidth``),
pinned to Google's pages: the GPU NICs carry inter-node NCCL traffic (``network_bandwidth_gbps``),
the host gVNIC(s) reach Cloud Storage (``host_nic_bandwidth_gbps``); unknown stays unknown."""

from __future__ import annotations

import copy
import re

import pytest

from gpuinfra.catalog.facts import gcp_facts
from gpuinfra.catalog.store import load_catalog, load_gcp_curated_facts


@pytest.mark.parametrize(
    ("mtype", "gpu_traffic_gbps", "host_nic_gbps"),
    [
        # cloud.google.com/compute/docs/accelerator-optimized-machines, "Maximum egress bandwidth
        # (Gbps)" of the A2 Standard, A2 Ultra and G2 tables; one gVNIC, so one figure for both
        ("a2-highgpu-1g", 24, 24),
        ("a2-highgpu-2g", 32, 32),
        ("a2-highgpu-4g", 50, 50),
        ("a2-highgpu-8g", 100, 100),
        ("a2-megagpu-16g", 100, 100),
        ("a2-ultragpu-1g", 24, 24),
        ("a2-ultragpu-2g", 32, 32),
        ("a2-ultragpu-4g", 50, 50),
        ("a2-ultragpu-8g", 100, 100),
        ("g2-standard-4", 10, 10),
        ("g2-standard-8", 16, 16),
        ("g2-standard-12", 16, 16),
        ("g2-standard-16", 32, 32),
        ("g2-standard-24", 32, 32),
        ("g2-standard-32", 32, 32),
        ("g2-standard-48", 50, 50),
        ("g2-standard-96", 100, 100),
        # same page, "A3 High machine type": 1 physical NIC, 25 / 50 / 100 Gbps
        ("a3-highgpu-1g", 25, 25),
        ("a3-highgpu-2g", 50, 50),
        ("a3-highgpu-4g", 100, 100),
        # cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx: "Up to 200 Gbps
        # bandwidth on the primary NIC. Secondary NICs (up to eight on A3 Mega machine types and up
        # to four on A3 High machine types), each supporting up to 200 Gbps bandwidth for GPU data
        # transfer." (Vertex AI configure-compute: a3-megagpu-8g "8 secondary NICs each ... 200 Gbps")
        ("a3-highgpu-8g", 4 * 200, 200),
        ("a3-megagpu-8g", 8 * 200, 200),
        # cloud.google.com/compute/docs/gpus/gpu-network-bandwidth: "The eight CX7 NICs deliver a
        # total network bandwidth of 3,200 Gbps ... The two other gVNIC network interface cards ...
        # provide an additional 400 Gbps"
        ("a3-ultragpu-8g", 3200, 400),
        ("a4-highgpu-8g", 3200, 400),
    ],
)
def test_gcp_bandwidth_follows_googles_pages(mtype, gpu_traffic_gbps, host_nic_gbps):
    f = load_catalog().fact("gcp", mtype)
    assert (f.network_bandwidth_gbps, f.host_nic_bandwidth_gbps) == (gpu_traffic_gbps, host_nic_gbps)


@pytest.mark.parametrize(
    ("mtype", "vm_total_gbps"),
    [
        # gpu-network-bandwidth overview table "Max total bandwidth": A3 Mega 1,800, A3 High 1,000,
        # A3 Ultra and A4 3,600 ("Combined, the network interface cards provide a total maximum
        # network bandwidth of 3,600 Gbps")
        ("a3-megagpu-8g", 1800),
        ("a3-highgpu-8g", 1000),
        ("a3-ultragpu-8g", 3600),
        ("a4-highgpu-8g", 3600),
    ],
)
def test_gpu_nics_plus_host_nics_is_the_documented_vm_total(mtype, vm_total_gbps):
    f = load_catalog().fact("gcp", mtype)
    assert f.gpu_nic_count > 0
    assert f.network_bandwidth_gbps + f.host_nic_bandwidth_gbps == vm_total_gbps


def test_n1_bandwidth_stays_unknown():
    # N1 + T4/V100: "up to 100 Gbps, based on the combination of GPU and vCPU count" -- it
    # depends on the attached GPUs, not on the host type; no citable per-combination table here
    n1 = [f for (cloud, t), f in load_catalog().facts.items() if cloud == "gcp" and t.startswith("n1-")]
    assert n1 and all((f.network_bandwidth_gbps, f.host_nic_bandwidth_gbps) == (None, None) for f in n1)
    assert all(f.sources["network_bandwidth"].startswith("unknown") for f in n1)


@pytest.mark.parametrize(
    ("itype", "total_gbps", "primary_card_gbps"),
    [
        # DescribeInstanceTypes NetworkPerformance: p5 "3200 Gigabit" on 32 cards, p4d "4x 100
        # Gigabit" on 4, g6e.48xlarge "400 Gigabit" on 4 (AWS EFA page: G6e "up to 4 cards / 400
        # Gbps"; the snapshot's per-card peaks, 4 x 400, contradict it), p6-b200 "3200 Gigabit" on
        # 8 (per-card peaks 8 x 200 contradict it); g5.xlarge "Up to 10 Gigabit": the card's peak
        ("p5.48xlarge", 3200, 100),
        ("p4d.24xlarge", 400, 100),
        ("g6e.48xlarge", 400, 100),
        ("g6e.24xlarge", 200, 100),
        ("p6-b200.48xlarge", 3200, 400),
        ("g5.xlarge", 10, 10),
    ],
)
def test_aws_host_nic_is_the_primary_network_card(itype, total_gbps, primary_card_gbps):
    f = load_catalog().fact("aws", itype)
    assert (f.network_bandwidth_gbps, f.host_nic_bandwidth_gbps) == (total_gbps, primary_card_gbps)


def test_every_gcp_family_cites_its_bandwidth_and_names_only_its_own_types():
    for family in load_gcp_curated_facts()["families"]:
        source = family["sources"]["network_bandwidth"]
        assert "cloud.google.com" in source, family["match"]
        for mtype, entry in family["network_bandwidth"].items():
            assert re.match(family["match"], mtype), mtype
            assert set(entry) <= {"vm_max_gbps", "gpu_nics_gbps", "host_nics_gbps"}, mtype


def _curated_with(mtype: str, entry: dict | None) -> dict:
    curated = copy.deepcopy(load_gcp_curated_facts())
    family = next(f for f in curated["families"] if re.match(f["match"], mtype))
    if entry is None:
        del family["network_bandwidth"][mtype]
    else:
        family["network_bandwidth"][mtype] = entry
    return curated


def test_a_type_missing_from_the_table_is_unknown():
    f = gcp_facts("a3-megagpu-8g", _curated_with("a3-megagpu-8g", None))
    assert (f.network_bandwidth_gbps, f.host_nic_bandwidth_gbps) == (None, None)
    partial = gcp_facts("a3-megagpu-8g", _curated_with("a3-megagpu-8g", {"vm_max_gbps": 1800, "gpu_nics_gbps": 1600}))
    assert (partial.network_bandwidth_gbps, partial.host_nic_bandwidth_gbps) == (1600, None)


@pytest.mark.parametrize(
    ("mtype", "entry", "message"),
    [
        (
            "a3-megagpu-8g",
            {"vm_max_gbps": 1800, "gpu_nics_gbps": 1800, "host_nics_gbps": 200},
            "a3-megagpu-8g GPU NICs 1800 \\+ host NICs 200 Gbps exceed the VM's 1800 Gbps",
        ),
        (
            "a2-highgpu-8g",
            {"vm_max_gbps": 100, "gpu_nics_gbps": 100},
            "a2-highgpu-8g has no GPU NICs but lists GPU/host NIC bandwidth",
        ),
    ],
)
def test_inconsistent_curated_bandwidth_is_refused(mtype, entry, message):
    with pytest.raises(ValueError, match=message):
        gcp_facts(mtype, _curated_with(mtype, entry))


def test_aws_facts_recorded_before_the_host_nic_field_stay_current():
    # stack files and refreshed catalogs written before host_nic_bandwidth_gbps existed
    from gpuinfra.catalog.facts_model import InstanceFacts

    current = load_catalog().fact("aws", "p5.48xlarge")
    older = {k: v for k, v in current.to_dict().items() if k != "host_nic_bandwidth_gbps"}
    assert InstanceFacts.from_dict(older) == current and current.host_nic_bandwidth_gbps == 100
