"""GcpGpuCluster under Pulumi mocks: NICs, networks, placement, scheduling, disks, bucket, labels."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuinfra.errors import SpecError
from gpuinfra.plan.gcp import plan_gcp_cluster
from gpuinfra.profiles import get_profile
from gpuinfra.rules.spec_rules import RuleViolationError
from tests.blueprints.helpers import gcp_script_files, make_spec, need_tool, preview

TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
NETWORK = "gcp:compute/network:Network"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
FIREWALL = "gcp:compute/firewall:Firewall"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
MIG = "gcp:compute/instanceGroupManager:InstanceGroupManager"
BULK_INSERT = "pulumi-python:dynamic/gcp:BulkInsert"
LABELS = {"gpuinfra-stack", "gpuinfra-stack-id", "gpuinfra-profile", "gpuinfra-expires-at"}


def gcp_spec(itype, nodes=2, profile="llm-finetune", **kw):
    return make_spec(itype, nodes=nodes, profile=profile, cloud="gcp", **kw)


def template(result):
    found = result.of_type(TEMPLATE)
    assert len(found) == 1
    return found[0].inputs


def _networks_by_subnet(result):
    networks = {r.name: r.inputs for r in result.of_type(NETWORK)}
    subnets = {f"{r.name}-id": r for r in result.of_type(SUBNET)}
    return networks, subnets


@pytest.mark.parametrize(
    ("itype", "gpus", "nics", "mtus", "lssd", "boot"),
    [
        # local SSD: cloud.google.com/compute/docs/disks/local-ssd#choose_number_local_ssds --
        # a2-highgpu-4g takes 4 or 8 (500 GiB scratch -> 4); A2 Ultra / A3 / A4 come with theirs,
        # which the template leaves out; g2-standard-4 takes 1; N1 1-8 or 16
        ("a2-highgpu-4g", None, ["GVNIC"], [1460], 4, "pd-balanced"),
        ("a2-ultragpu-8g", None, ["GVNIC"], [1460], 0, "pd-balanced"),
        # A3 High's TCPX cannot be installed at boot: with `preferred` and no baked image, plain networking
        ("a3-highgpu-8g", None, ["GVNIC"], [1460], 0, "pd-balanced"),
        ("a3-megagpu-8g", None, ["GVNIC"] * 9, [8244] * 9, 0, "pd-balanced"),  # 1 system + 8 GPU
        ("a3-ultragpu-8g", None, ["GVNIC", "GVNIC"] + ["MRDMA"] * 8, [8896] * 10, 0, "hyperdisk-balanced"),
        ("g2-standard-4", None, ["GVNIC"], [1460], 1, "pd-balanced"),
        ("n1-standard-8", "1xT4", ["GVNIC"], [1460], 1, "pd-balanced"),
    ],
)
def test_nics_networks_disks(itype, gpus, nics, mtus, lssd, boot):
    profile = "lora-finetune" if itype.startswith(("n1-", "g2-")) else "llm-finetune"
    kwargs = {"gpus": gpus} if gpus else {}
    if itype == "a3-ultragpu-8g":
        kwargs["spot"] = True  # not sold on demand
    result = preview(gcp_spec(itype, profile=profile, **kwargs))
    t = template(result)
    assert [n["nicType"] for n in t["networkInterfaces"]] == nics
    networks, subnets = _networks_by_subnet(result)
    per_nic_net = [subnets[n["subnetwork"]].inputs["network"].removesuffix("-id") for n in t["networkInterfaces"]]
    assert [networks[name]["mtu"] for name in per_nic_net] == mtus
    scratch = [d for d in t["disks"] if d.get("type") == "SCRATCH"]
    assert len(scratch) == lssd and all(d["interface"] == "NVME" and d["diskType"] == "local-ssd" for d in scratch)
    boot_disk = next(d for d in t["disks"] if d.get("boot"))
    assert boot_disk["diskType"] == boot
    if boot == "hyperdisk-balanced":
        # provisioned at what the volume includes at no extra charge, "up to 3,000 IOPS and 140 MiB/s"
        # (cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced): its cost is its capacity
        assert (boot_disk["provisionedIops"], boot_disk["provisionedThroughput"]) == (3000, 140)
    else:  # Persistent Disk takes no provisioned performance
        assert "provisionedIops" not in boot_disk and "provisionedThroughput" not in boot_disk
    assert boot_disk["sourceImage"].startswith("projects/deeplearning-platform-release/global/images/family/")
    if itype.startswith("n1-"):
        assert t["guestAccelerators"] == [{"count": 1, "type": "nvidia-tesla-t4"}]
    else:
        assert "guestAccelerators" not in t


def test_a3_ultra_roce_network_has_eight_subnets_and_no_firewall():
    spec = gcp_spec("a3-ultragpu-8g", spot=True)
    result = preview(spec)
    roce = next(r for r in result.of_type(NETWORK) if r.name.endswith("-roce"))
    assert roce.inputs["networkProfile"].endswith(f"/networkProfiles/{spec.zone}-vpc-roce")
    roce_subnets = [r for r in result.of_type(SUBNET) if r.inputs["network"] == f"{roce.name}-id"]
    assert len(roce_subnets) == 8
    assert [r for r in result.of_type(FIREWALL) if r.inputs["network"] == f"{roce.name}-id"] == []
    assert len(result.of_type(FIREWALL)) == 3  # system + net-1 allow-internal, IAP SSH


def test_a3_mega_two_nodes_must_show():
    spec = gcp_spec("a3-megagpu-8g", nodes=2, profile="llm-pretrain")
    result = preview(spec)
    t = template(result)
    assert len(t["networkInterfaces"]) == 9 and {n["nicType"] for n in t["networkInterfaces"]} == {"GVNIC"}
    # the nodes come from a bulk insert: a compact policy in the template places them ("compact
    # placement policies ... compute instances created in bulk", A3 Mega among the machines that
    # take them: cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy)
    policy = result.of_type(POLICY)
    assert len(policy) == 1
    assert policy[0].inputs["groupPlacementPolicy"] == {"collocation": "COLLOCATED", "vmCount": 2}
    assert t["resourcePolicies"].endswith(f"/resourcePolicies/{policy[0].name}")
    assert len([d for d in t["disks"] if d.get("type") == "SCRATCH"]) == 0  # 16 come with the machine
    assert t["scheduling"]["onHostMaintenance"] == "TERMINATE" and t["scheduling"]["automaticRestart"] is False
    group = result.of_type(MIG)
    assert len(group) == 1
    # STANDARD VMs: the nodes come from one all-or-nothing bulk insert, the MIG starts empty
    assert group[0].inputs["targetSize"] == 0 and group[0].inputs["zone"] == spec.zone
    assert [b.inputs["count"] for b in result.of_type(BULK_INSERT)] == [2]
    assert group[0].inputs["versions"][0]["instanceTemplate"] == (
        f"https://www.googleapis.com/compute/v1/projects/gpuinfra-preview/instanceTemplates/{t['namePrefix']}preview?uniqueId=1"
    )
    # STANDARD VMs: a VM that fails or that Compute Engine deletes is recreated (about-repair)
    assert group[0].inputs["instanceLifecyclePolicy"] == {
        "defaultActionOnFailure": "REPAIR",
        "forceUpdateOnRepair": "NO",
    }
    assert "resourcePolicies" not in group[0].inputs  # a workload policy would place only the MIG's own VMs
    # STANDARD VMs cannot use bulk mode (about-bulk-mode#limitations); the nodes' formation
    # watchdog stays as the second line
    assert "targetSizePolicies" not in group[0].inputs
    assert "gpuinfra-formation-deadline" in t["metadata"]["startup-script"]
    firewalls = result.of_type(FIREWALL)
    assert len(firewalls) == 10 and all(f.inputs["direction"] == "INGRESS" for f in firewalls)
    ssh = [
        f.inputs for f in firewalls for a in f.inputs["allows"] if a["protocol"] == "tcp" and a.get("ports") == ["22"]
    ]
    assert [f["sourceRanges"] for f in ssh] == [["35.235.240.0/20"]]  # IAP only


def test_one_node_4xa100_uses_a2_highgpu_4g_and_a_locked_bucket(run_cli, tmp_path):
    import json

    data = json.loads(
        run_cli("new", "--gpus", "4xA100", "--cloud", "gcp", "--project-dir", str(tmp_path), "--json").stdout
    )
    assert data["instance_type"] == "a2-highgpu-4g" and data["nodes"] == 1
    doc = json.loads(run_cli("preview", data["stack"], "--project-dir", str(tmp_path), "--json").stdout)
    bucket = next(r for r in doc["resources"] if r["type"] == "gcp:storage/bucket:Bucket")
    assert bucket["inputs"]["publicAccessPrevention"] == "enforced"
    assert bucket["inputs"]["uniformBucketLevelAccess"] is True
    assert bucket["inputs"]["location"] == data["region"].upper()
    assert bucket["retainOnDelete"] is True
    assert [r for r in doc["resources"] if r["type"] == POLICY] == []  # one VM: no compact policy


def test_scheduling_spot_and_max_run_duration():
    spec = gcp_spec("a2-highgpu-8g", nodes=2, spot=True)
    sched = template(preview(spec))["scheduling"]
    assert sched == {
        "automaticRestart": False,
        "instanceTerminationAction": "DELETE",
        # TTL + 600 s: the agent's 300 s checkpoint sync bound + 300 s margin (gpuinfra/plan/backstop.py)
        "maxRunDuration": {"seconds": spec.profile.ttl_hours * 3600 + 600},
        "onHostMaintenance": "TERMINATE",
        "preemptible": True,
        "provisioningModel": "SPOT",
    }


def test_spot_group_recreates_a_preempted_node():
    """A preempted Spot VM is deleted by Compute Engine (``instanceTerminationAction`` DELETE), an
    action the MIG did not initiate, so REPAIR recreates it (cloud.google.com/compute/docs/
    instance-groups/about-repair); with DO_NOTHING the node would stay lost."""
    result = preview(gcp_spec("a2-highgpu-8g", nodes=2, spot=True))
    assert template(result)["scheduling"]["instanceTerminationAction"] == "DELETE"
    (group,) = result.of_type(MIG)
    assert group.inputs["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "REPAIR"


def test_bucket_and_service_account_scope():
    spec = gcp_spec("a2-highgpu-8g")
    result = preview(spec)
    bucket = result.of_type("gcp:storage/bucket:Bucket")[0]
    rules = bucket.inputs["lifecycleRules"]
    assert rules[0] == {"action": {"type": "Delete"}, "condition": {"age": 7, "matchesPrefixes": ["scratch/"]}}
    assert bucket.inputs["versioning"] == {"enabled": True}
    # the node service account's bucket roles (read all, write all but the node bundle) are
    # pinned in tests/blueprints/test_gcp_bundle_access.py; here: on this bucket, this account
    members = result.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert {m.inputs["bucket"] for m in members} == {"t-2-bucket-0000preview"}
    # the account id carries the stack's name suffix: a stack t-2 of another folder has its own account
    email = "gi-t-2-t3st0a@gpuinfra-preview.iam.gserviceaccount.com"
    assert {m.inputs["member"] for m in members} == {f"serviceAccount:{email}"}
    assert template(result)["serviceAccount"]["email"] == email
    # a custom role with four permissions instead of project-wide compute.viewer and
    # instanceAdmin.v1 (each would let a node read or change its peers), bound to this stack's MIG and its VMs only
    (role,) = result.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    assert sorted(role.inputs["permissions"]) == [
        "compute.instanceGroupManagers.get",
        "compute.instanceGroupManagers.update",
        "compute.instances.delete",
        "compute.instances.get",
    ]
    (binding,) = [
        r.inputs
        for r in result.of_type("gcp:projects/iAMMember:IAMMember")
        if r.inputs["role"] not in ("roles/monitoring.metricWriter", "roles/secretmanager.secretAccessor")
    ]  # monitoring: tests/monitoring; job secrets: tests/blueprints/test_node_iam.py
    assert binding["role"] == role.inputs.get("name", binding["role"])
    # what the condition lets through is evaluated in tests/blueprints/test_node_iam.py
    assert binding["condition"]["title"] == "gpuinfra-own-group-only"


def test_labels_on_every_labelable_resource():
    spec = gcp_spec("a3-highgpu-8g")
    result = preview(spec)
    labelable = {TEMPLATE, "gcp:storage/bucket:Bucket"}
    for record in result.resources:
        if record.type in labelable:
            assert set(record.inputs["labels"]) == LABELS
            assert record.inputs["labels"]["gpuinfra-expires-at"] == "20261125t010000z"
    assert all(set(d["labels"]) == LABELS for d in template(result)["disks"] if d.get("boot"))


def test_private_google_access_nat_and_iap_ssh_by_default():
    result = preview(gcp_spec("a2-highgpu-8g"))
    system_subnet = next(r for r in result.of_type(SUBNET) if r.name.endswith("system-subnet"))
    assert system_subnet.inputs["privateIpGoogleAccess"] is True
    assert len(result.of_type("gcp:compute/routerNat:RouterNat")) == 1
    # no public IP, so IAP TCP forwarding (35.235.240.0/20, cloud.google.com/iap/docs/using-tcp-forwarding)
    # is the way in, on by default (no public IP)
    iap = [f.inputs for f in result.of_type(FIREWALL) if f.inputs["sourceRanges"] == ["35.235.240.0/20"]]
    assert iap and iap[0]["allows"] == [{"ports": ["22"], "protocol": "tcp"}]
    assert "--tunnel-through-iap" in result.outputs["ssh_command"]
    without = preview(gcp_spec("a2-highgpu-8g", network={"iap_ssh": False}))
    assert all("35.235.240.0/20" not in f.inputs["sourceRanges"] for f in without.of_type(FIREWALL))
    assert without.outputs["ssh_command"].startswith("no SSH path")


def test_resource_count_does_not_grow_with_nodes():
    results = {n: preview(gcp_spec("a3-megagpu-8g", nodes=n)) for n in (2, 8, 64)}
    assert len({len(res.resources) for res in results.values()}) == 1
    assert {n: res.of_type(BULK_INSERT)[0].inputs["count"] for n, res in results.items()} == {2: 2, 8: 8, 64: 64}
    assert {n: res.of_type(POLICY)[0].inputs["groupPlacementPolicy"]["vmCount"] for n, res in results.items()} == {
        2: 2,
        8: 8,
        64: 64,
    }
    g2 = {n: preview(gcp_spec("g2-standard-48", nodes=n, profile="llm-finetune")) for n in (2, 8)}
    assert {n: res.of_type(POLICY)[0].inputs["groupPlacementPolicy"] for n, res in g2.items()} == {
        2: {"collocation": "COLLOCATED", "vmCount": 2},
        8: {"collocation": "COLLOCATED", "vmCount": 8},
    }


def test_reservation_bound_group_is_all_or_nothing():
    spec = gcp_spec("a3-ultragpu-8g", spot=True)
    spec = type(spec).model_validate(
        {**spec.model_dump(), "spot": False, "gcp_reservation": "projects/owner-project/reservations/h200-block"}
    )
    result = preview(spec)
    t = template(result)
    assert t["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert t["reservationAffinity"] == {
        "specificReservation": {
            "key": "compute.googleapis.com/reservation-name",
            "values": ["projects/owner-project/reservations/h200-block"],
        },
        "type": "SPECIFIC_RESERVATION",
    }
    (group,) = result.of_type(MIG)
    assert group.inputs["targetSizePolicies"] == [{"mode": "BULK"}]
    # reservation-bound VMs end with the reservation: a repair then would retry forever
    assert group.inputs["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "DO_NOTHING"
    # bulk mode is fixed at creation and the group grows only from 0: a new size replaces it
    assert group.replace_on_changes == ("targetSizePolicies", "targetSize") and group.delete_before_replace is True
    one = preview(_edited(spec, nodes=1))
    assert one.of_type(MIG)[0].inputs["targetSizePolicies"] == [{"mode": "BULK"}]  # also for one node


def test_reservation_bound_group_of_a3_mega_keeps_its_workload_policy():
    """The MIG in bulk mode creates the nodes itself, so it keeps the HIGH_THROUGHPUT workload
    policy (workload policies are for MIGs with clustered GPUs,
    cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy) and the template
    no compact policy (the reservation accepts external policies here)."""
    spec = _edited(
        gcp_spec("a3-megagpu-8g"),
        gcp_reservation="projects/owner-project/reservations/h100-mega",
        gcp_reservation_accepts_placement=True,
        gcp_reservation_bound=True,
    )
    result = preview(spec)
    (policy,) = result.of_type(POLICY)
    assert policy.inputs["workloadPolicy"] == {"type": "HIGH_THROUGHPUT"}
    assert "resourcePolicies" not in template(result)
    (group,) = result.of_type(MIG)
    assert group.inputs["resourcePolicies"]["workloadPolicy"].endswith(f"/resourcePolicies/{policy.name}")
    assert result.of_type(BULK_INSERT) == []


@pytest.mark.parametrize("itype", ["a3-megagpu-8g", "a3-highgpu-8g"])
def test_bulk_inserted_a3_nodes_are_placed_by_a_compact_policy_in_their_template(itype):
    """A 2-node SPOT cluster of A3 8g / Mega forms through one bulk insert: the template it
    inserts from carries a COLLOCATED policy with vm_count 2 ("When you apply compact placement
    policies to standalone compute instances, or compute instances created in bulk, Compute
    Engine makes best-effort attempts to create compute instances as close to each other as
    possible", cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy), with
    no max distance (best effort, same page), and the empty MIG no workload policy. Without the
    template's policy the preview breaks gcp-placement-supported: a MIG's workload policy places
    only the VMs that MIG creates."""
    from gpuinfra.rules import check_preview

    spec = gcp_spec(itype, nodes=2, spot=True)
    result = preview(spec)
    t = template(result)
    (policy,) = result.of_type(POLICY)
    assert policy.inputs["groupPlacementPolicy"] == {"collocation": "COLLOCATED", "vmCount": 2}
    assert t["resourcePolicies"].endswith(f"/resourcePolicies/{policy.name}")
    assert t["scheduling"]["provisioningModel"] == "SPOT"
    (bulk,) = result.of_type(BULK_INSERT)
    assert bulk.inputs["count"] == bulk.inputs["min_count"] == 2
    assert bulk.inputs["template"].startswith(
        f"https://www.googleapis.com/compute/v1/projects/gpuinfra-preview/instanceTemplates/{t['namePrefix']}"
    )
    (group,) = result.of_type(MIG)
    assert "resourcePolicies" not in group.inputs
    assert check_preview(spec, result.resources, provider_values=False) == []
    # fault: the template without its policy (the shape before this change) is a violation
    bare = [r for r in result.resources if r.type != POLICY]
    for r in bare:
        if r.type == TEMPLATE:
            r.inputs.pop("resourcePolicies")
    found = check_preview(spec, bare, provider_values=False)
    assert [v.rule for v in found] == ["gcp-placement-supported"]
    assert "bulk-inserted nodes" in found[0].message


def test_a2_cluster_placement_is_unchanged():
    result = preview(gcp_spec("a2-highgpu-4g", nodes=2))
    (policy,) = result.of_type(POLICY)
    assert policy.inputs["groupPlacementPolicy"] == {"collocation": "COLLOCATED", "vmCount": 2}
    assert template(result)["resourcePolicies"].endswith(f"/resourcePolicies/{policy.name}")
    assert "resourcePolicies" not in result.of_type(MIG)[0].inputs


def _edited(spec, **changes):
    return type(spec).model_validate({**spec.model_dump(), **changes})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: _edited(
                gcp_spec("n1-standard-8", gpus="1xT4", profile="lora-finetune"),
                profile=get_profile("llm-finetune").model_dump(),
            ),  # hand-edited: placement required
            "gcp-placement-supported: n1-standard-8 supports neither a compact placement policy nor a workload policy",
        ),
        (
            lambda: _edited(gcp_spec("a3-ultragpu-8g", spot=True), spot=False),
            "provisioning-model-offered: a3-ultragpu-8g is not sold as on-demand",
        ),
    ],
)
def test_bad_input_before_any_resource(build, message):
    with pytest.raises(SpecError, match=message):
        preview(build())


def test_more_nodes_than_one_zonal_mig_holds_are_refused_by_the_spec():
    # the MIG's 1,000 VMs come before a compact placement policy's 1,500 (gcp-placement-max-vms):
    # cloud.google.com/compute/docs/instance-groups/creating-groups-of-managed-instances#limitations
    with pytest.raises(ValidationError, match="nodes 1001 is over the GCP limit of 1000 VMs in one zonal managed"):
        _edited(gcp_spec("a3-megagpu-8g"), nodes=1001)
    assert _edited(gcp_spec("a3-megagpu-8g"), nodes=1000).nodes == 1000


def test_spec_refuses_a_gpu_the_machine_does_not_carry():
    with pytest.raises(ValidationError, match="a2-highgpu-4g carries 4xA100, not 4xH100"):
        _edited(gcp_spec("a2-highgpu-4g"), gpu="H100")


def test_zone_outside_region_is_rejected_by_the_spec():
    spec = gcp_spec("a2-highgpu-4g")
    with pytest.raises(ValidationError, match="zone 'us-east1-b' is not in region"):
        type(spec).model_validate({**spec.model_dump(), "zone": "us-east1-b"})


def test_startup_script_passes_shellcheck(tmp_path):
    import subprocess

    result = preview(gcp_spec("a3-megagpu-8g", nodes=2, profile="llm-pretrain"))
    script = template(result)["metadata"]["startup-script"]
    assert script.startswith("#!/bin/bash")
    assert "NCCL_FASTRAK_IFNAME=enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0" in script
    assert "DEVICE_GLOB='google-local-nvme-ssd-*'" in script and '-name "$DEVICE_GLOB"' in script
    assert "gcloud compute instance-groups managed list-instances t-2--t3st0a-node --zone" in script
    assert "systemctl daemon-reexec" in script  # the DefaultLimitMEMLOCK drop-in takes effect now
    assert "LimitMEMLOCK=infinity" in script and "systemctl try-restart docker.service" in script
    # peers publish their IPs under the expiring scratch prefix; the watchdog never fires once formed
    assert 'PEERS="gs://t-2-bucket-0000preview/gpuinfra-peers/t-2--t3st0a-node"' in script
    assert 'if [ ! -e "$FORMED" ] && [ "$GROUP_FORMED" = 0 ] && [ "$LISTED" = 1 ]' in script
    assert 'gcloud storage rm "$PEERS/$MY_NAME/**"' in script  # stale entries of a re-created VM
    assert "systemctl enable --now --no-block gpuinfra-cluster-env.service" in script
    # the startup script and the two scripts it writes
    files = gcp_script_files(script)
    peers = files["/usr/local/sbin/gpuinfra-cluster-env"][1]
    scratch = files["/usr/local/sbin/gpuinfra-scratch-raid0"][1]
    for index, text in enumerate((script, peers, scratch)):
        path = tmp_path / f"script{index}.sh"
        path.write_text(text)
        check = subprocess.run([need_tool("shellcheck"), "--severity=style", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout


def test_blueprints_deploy_from_the_spec_alone(monkeypatch):
    # the spec is the whole contract: the program never reads the (deploying machine's) catalog
    from gpuinfra.catalog import store

    specs = [gcp_spec("a3-megagpu-8g"), make_spec("p5.48xlarge", nodes=2)]

    def no_catalog(*args, **kwargs):
        raise AssertionError("the Pulumi program loaded the catalog")

    no_catalog.cache_clear = lambda: None  # stands in for the lru_cache'd loader
    monkeypatch.setattr(store, "load_catalog", no_catalog)
    monkeypatch.setattr(store, "_load", no_catalog)  # also catches a `from ... import load_catalog` made earlier
    for spec in specs:
        assert preview(spec).resources


def test_spot_and_a_reservation_exclude_each_other():
    spec = gcp_spec("a3-ultragpu-8g", spot=True)
    with pytest.raises(ValidationError, match="spot and gcp_reservation / gcp_reservation_bound exclude each other"):
        _edited(spec, gcp_reservation="h200-block", gcp_reservation_bound=True)


def test_a_ttl_longer_than_gce_allows_for_max_run_duration_is_refused():
    from gpuinfra.plan.gcp import plan_gcp_cluster

    spec = gcp_spec("a2-highgpu-8g")
    ok = spec.model_copy(update={"profile": spec.profile.model_copy(update={"ttl_hours": 2879})})
    assert plan_gcp_cluster(ok).max_run_duration_seconds == 2879 * 3600 + 600  # 120 days = 2880 h
    long = spec.model_copy(update={"profile": spec.profile.model_copy(update={"ttl_hours": 2880})})
    with pytest.raises(SpecError, match=r"may be at most 120 days .* use ttl_hours <= 2879"):
        plan_gcp_cluster(long)


BAKED_TCPX_IMAGE = "projects/my-project/global/images/a3-high-tcpx-baked"  # an image with the TCPX kernel


def test_a3_high_gets_its_gpu_nics_only_from_a_baked_image():
    """TCPX needs a kernel the DLVM image lacks (rule fabric-installable-at-boot): the GPU NICs
    come with a baked image; `required` without one is refused before any resource."""
    baked = template(preview(gcp_spec("a3-highgpu-8g", gcp_image=BAKED_TCPX_IMAGE)))
    assert [n["nicType"] for n in baked["networkInterfaces"]] == ["GVNIC"] * 5  # 1 system + 4 GPU NICs
    assert baked["disks"][0]["sourceImage"] == BAKED_TCPX_IMAGE
    spec = gcp_spec("a3-highgpu-8g")
    required = spec.model_copy(
        update={"profile": spec.profile.model_copy(update={"high_bandwidth_networking": "required"})}
    )
    with pytest.raises(RuleViolationError, match="fabric-installable-at-boot.*linux-gcp-tcpx kernel"):
        plan_gcp_cluster(required)


def test_a_spot_cluster_forms_through_one_all_or_nothing_bulk_insert():
    """STANDARD / SPOT templates cannot use bulk mode (about-bulk-mode#limitations): the nodes come
    from one instances.bulkInsert with minCount = count = nodes under fixed names, and the MIG
    (same name, same template) starts empty, its size left to the nodes' replacements."""
    spec = gcp_spec("a3-highgpu-8g", nodes=2, spot=True)
    result = preview(spec)
    t = template(result)
    (bulk,) = result.of_type(BULK_INSERT)
    group_name = f"{spec.stack}--{spec.name_suffix}-node"
    assert bulk.inputs["count"] == bulk.inputs["min_count"] == 2
    assert bulk.inputs["names"] == [f"{group_name}-n000", f"{group_name}-n001"]
    assert bulk.inputs["template"] == (
        f"https://www.googleapis.com/compute/v1/projects/gpuinfra-preview/instanceTemplates/{t['namePrefix']}preview?uniqueId=1"
    )
    assert (bulk.inputs["zone"], bulk.inputs["project"]) == (spec.zone, "gpuinfra-preview")
    assert bulk.delete_before_replace is True  # fixed names: the old VMs go first
    (group,) = result.of_type(MIG)
    assert group.inputs["name"] == group_name and group.inputs["targetSize"] == 0
    assert group.ignore_changes == ("targetSize",)
    assert group.inputs["versions"][0]["instanceTemplate"] == bulk.inputs["template"]
    assert "targetSizePolicies" not in group.inputs
    from gpuinfra.rules import check_preview

    assert check_preview(spec, result.resources, provider_values=False) == []
    # the cost still counts two nodes (the MIG's 0 plus the bulk insert's 2)
    from gpuinfra.cost.estimate import read_cluster_facts

    assert read_cluster_facts(result.resources, spec.region).nodes == 2
