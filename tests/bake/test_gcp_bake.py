"""The GCP bake stack: Cloud Build + Packer resources under the offline preview, the rendered
Packer template parses (python-hcl2), every provisioned script passes shellcheck; the Packer VM
builds in the bake's own network with no external IP, reached over IAP; the build service
account holds no project-wide compute or actAs role, and its IAM condition is evaluated
(cel-python) against its own VM and against another bake's whose name shares its prefix."""

from __future__ import annotations

import ipaddress
import json
import subprocess

import hcl2
import pytest

from gpuinfra.bake.preview import check_bake, run_bake_preview
from gpuinfra.bake.render import PACKER_IMAGE, cloud_build_steps, hcl_string, packer_build
from gpuinfra.errors import SpecError
from gpuinfra.plan.fabric_host import HOST_SCRIPT_PATH
from tests.bake.conftest import GCP_BASE, NGC
from tests.blueprints.helpers import make_spec, need_tool
from tests.blueprints.helpers import preview as run_preview
from tests.iam_cel import cel_true as iam_cel_true
from tests.iam_cel import resource_allowed as cel_true

HOST = "us-central1-docker.pkg.dev"
SUBNET = "projects/p/regions/us-central1/subnetworks/s"
PROJECT = "gpuinfra-test-1"
ZONE = "us-central1-a"
MEMBER = "gcp:projects/iAMMember:IAMMember"
#: IAP's TCP-forwarding source range (cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule).
IAP_RANGE = "35.235.240.0/20"
#: Predefined roles that must never be project-wide for a build that runs third-party images:
#: actAs on every service account, or every VM of the project (cloud.google.com/compute/docs/access/iam).
FORBIDDEN_PROJECT_ROLES = {
    "roles/iam.serviceAccountUser",
    "roles/iam.serviceAccountTokenCreator",
    "roles/compute.instanceAdmin.v1",
    "roles/compute.instanceAdmin",
    "roles/compute.admin",
    "roles/editor",
    "roles/owner",
}


@pytest.fixture(scope="module")
def preview(a3mega_bake):
    return run_bake_preview(a3mega_bake)


@pytest.fixture(scope="module")
def build(a3mega_bake):
    return packer_build(a3mega_bake, "gv-x@p.iam.gserviceaccount.com", f"{HOST}/p/r/train:abc", HOST, SUBNET)


def _plain(value):
    """python-hcl2 8 keeps HCL string quotes ('"x"'): strip them, recursively."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value[1:-1] if isinstance(value, str) and len(value) > 1 and value[0] == value[-1] == '"' else value


def _one(preview, token):
    [record] = preview.of_type(token)
    return record


def _previewed_hcl(preview) -> dict:
    [obj] = [r for r in preview.of_type("gcp:storage/bucketObject:BucketObject") if r.inputs["name"].endswith(".hcl")]
    content = obj.inputs["content"]
    content = content["value"] if isinstance(content, dict) else content  # recorded as a secret
    return _plain(hcl2.loads(content))


def _previewed_template(preview) -> dict:
    return _previewed_hcl(preview)["source"][0]["googlecompute"]["gpuinfra"]


def _iap_allows(expression: str, port: int) -> bool:
    """An IAP TCP-forwarding condition over ``destination.port`` (cloud.google.com/iap/docs/using-tcp-forwarding)."""
    return iam_cel_true(expression, {"destination": {"ip": "10.128.0.2", "port": port}})


def test_exact_resources_and_zero_violations(preview):
    counts: dict[str, int] = {}
    for r in preview.resources:
        counts[r.type] = counts.get(r.type, 0) + 1
    assert counts == {
        "gpuinfra:gcp:ImageBake": 1,
        "gcp:serviceaccount/account:Account": 2,
        "gcp:compute/network:Network": 1,
        "gcp:compute/subnetwork:Subnetwork": 1,
        "gcp:compute/router:Router": 1,
        "gcp:compute/routerNat:RouterNat": 1,
        "gcp:compute/firewall:Firewall": 1,
        MEMBER: 3,
        "gcp:projects/iAMCustomRole:IAMCustomRole": 2,
        "gcp:serviceaccount/iAMMember:IAMMember": 1,
        "gcp:compute/subnetworkIAMMember:SubnetworkIAMMember": 1,
        "gcp:iap/tunnelIamMember:TunnelIamMember": 1,
        "gcp:storage/bucket:Bucket": 1,
        "gcp:storage/bucketIAMMember:BucketIAMMember": 1,
        "gcp:storage/bucketObject:BucketObject": 6,
        "gcp:artifactregistry/repository:Repository": 1,
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": 2,
        "gcp:pubsub/topic:Topic": 1,
        "gcp:cloudbuild/trigger:Trigger": 1,
    }
    repo = _one(preview, "gcp:artifactregistry/repository:Repository").inputs
    assert repo["format"] == "DOCKER" and repo["dockerConfig"]["immutableTags"] is True
    assert check_bake(preview.resources) == []


def test_build_vm_has_no_external_ip_and_is_reached_over_iap(preview):
    source = _previewed_template(preview)
    assert source["omit_external_ip"] is True and source["use_internal_ip"] is True and source["use_iap"] is True
    assert "address" not in source and "network" not in source  # "default" only when both are unset


def test_build_vm_runs_in_the_bakes_own_network(preview):
    network = _one(preview, "gcp:compute/network:Network")
    subnet = _one(preview, "gcp:compute/subnetwork:Subnetwork")
    assert network.inputs["autoCreateSubnetworks"] is False
    assert subnet.inputs["network"] == f"{network.name}-id" and subnet.inputs["privateIpGoogleAccess"] is True
    source = _previewed_template(preview)
    assert source["subnetwork"] == f"{subnet.name}-id"  # the preview's id of the bake's own subnet
    nat = _one(preview, "gcp:compute/routerNat:RouterNat").inputs
    router = _one(preview, "gcp:compute/router:Router")
    assert nat["router"] == router.inputs.get("name", router.name) and router.inputs["network"] == f"{network.name}-id"
    [rule] = preview.of_type("gcp:compute/firewall:Firewall")
    assert rule.inputs["network"] == f"{network.name}-id" and rule.inputs["direction"] == "INGRESS"
    assert rule.inputs["sourceRanges"] == [IAP_RANGE]
    assert rule.inputs["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert rule.inputs["targetTags"] == source["tags"]  # only the Packer VM


def test_no_project_wide_actas_or_compute_admin(preview):
    roles = {r.name: r.inputs for r in preview.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")}
    members = preview.of_type(MEMBER)
    assert not FORBIDDEN_PROJECT_ROLES & {m.inputs["role"] for m in members}
    unconditioned = [m.inputs for m in members if "condition" not in m.inputs]
    for member in unconditioned:
        if member["role"] in roles:  # the custom read role: only reads (get), nothing that changes a resource
            assert all(p.endswith(".get") for p in roles[member["role"]]["permissions"])
        else:
            assert member["role"] == "roles/logging.logWriter"
    conditioned = [m.inputs for m in members if "condition" in m.inputs]
    assert len(conditioned) == 1 and "compute.instances.create" in roles[conditioned[0]["role"]]["permissions"]
    # actAs only on the account the Packer VM runs as, which is not the build's own
    [act_as] = preview.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    assert act_as.inputs["role"] == "roles/iam.serviceAccountUser"
    accounts = {
        r.name.rsplit("-", 1)[0].rsplit("-", 1)[1]: r for r in preview.of_type("gcp:serviceaccount/account:Account")
    }
    vm_email = f"{accounts['vm'].inputs['accountId']}@{PROJECT}.iam.gserviceaccount.com"
    assert act_as.inputs["serviceAccountId"] == accounts["vm"].inputs.get("name", accounts["vm"].name)
    assert _previewed_template(preview)["service_account_email"] == vm_email
    assert (
        act_as.inputs["member"]
        == f"serviceAccount:{accounts['build'].inputs['accountId']}@{PROJECT}.iam.gserviceaccount.com"
    )
    tunnel = _one(preview, "gcp:iap/tunnelIamMember:TunnelIamMember").inputs
    assert tunnel["role"] == "roles/iap.tunnelResourceAccessor"
    assert _iap_allows(tunnel["condition"]["expression"], 22)
    assert not any(_iap_allows(tunnel["condition"]["expression"], port) for port in (3389, 80, 443, 2222))
    subnet_user = _one(preview, "gcp:compute/subnetworkIAMMember:SubnetworkIAMMember").inputs
    assert subnet_user["role"] == "roles/compute.networkUser"


def _condition(preview) -> str:
    [member] = [m.inputs for m in preview.of_type(MEMBER) if "condition" in m.inputs]
    return member["condition"]["expression"]


INSTANCE, DISK, IMAGE = "compute.googleapis.com/Instance", "compute.googleapis.com/Disk", "compute.googleapis.com/Image"


def test_build_vm_condition_allows_its_own_vm_disk_and_images(preview, a3mega_bake):
    expression = _condition(preview)
    vm = f"gpuinfra-bake-{a3mega_bake.stack}"
    assert _previewed_template(preview)["instance_name"] == vm
    zone = f"projects/{PROJECT}/zones/{ZONE}"
    assert cel_true(expression, INSTANCE, f"{zone}/instances/{vm}")
    assert cel_true(expression, DISK, f"{zone}/disks/{vm}")
    image = f"projects/{PROJECT}/global/images/gpuinfra-{a3mega_bake.stack}--20261126t190000z"
    assert cel_true(expression, IMAGE, image)
    # Packer names the image <prefix><UTC time>: the prefix the condition grants
    [local] = _previewed_hcl(preview)["locals"]
    assert local["prefix"] == f"gpuinfra-{a3mega_bake.stack}--"
    assert local["image_name"].startswith("${local.prefix}${formatdate(")
    assert _previewed_template(preview)["image_name"] == "${local.image_name}"


@pytest.mark.parametrize(
    ("resource_type", "name"),
    [
        # another bake whose name starts with this one's, its VM and disk
        (INSTANCE, f"projects/{PROJECT}/zones/{ZONE}/instances/gpuinfra-bake-bake-a3-megagpu-8g-2"),
        (DISK, f"projects/{PROJECT}/zones/{ZONE}/disks/gpuinfra-bake-bake-a3-megagpu-8g-2"),
        # a cluster node, the same name in another zone or project
        (INSTANCE, f"projects/{PROJECT}/zones/{ZONE}/instances/exp--k3x9q2-node-abcd"),
        (INSTANCE, f"projects/{PROJECT}/zones/us-central1-b/instances/gpuinfra-bake-bake-a3-megagpu-8g"),
        (INSTANCE, f"projects/other-project/zones/{ZONE}/instances/gpuinfra-bake-bake-a3-megagpu-8g"),
        # other images, another project's image of the family, the project itself
        (IMAGE, f"projects/{PROJECT}/global/images/gpuinfra-exp-20261126t190000z"),
        # the images of a bake whose name starts with this one's, in either name form
        (IMAGE, f"projects/{PROJECT}/global/images/gpuinfra-bake-a3-megagpu-8g-2--20261126t190000z"),
        (IMAGE, f"projects/{PROJECT}/global/images/gpuinfra-bake-a3-megagpu-8g-x-20261126t190000z"),
        (IMAGE, "projects/other-project/global/images/gpuinfra-bake-a3-megagpu-8g-20261126t190000z"),
        (DISK, f"projects/{PROJECT}/zones/{ZONE}/disks/gpuinfra-bake-a3-megagpu-8g-20261126t190000z"),
        ("cloudresourcemanager.googleapis.com/Project", f"projects/{PROJECT}"),
    ],
)
def test_build_vm_condition_denies_everything_else(preview, resource_type, name):
    assert not cel_true(_condition(preview), resource_type, name)


def test_own_base_image_is_granted_by_exact_name():
    from blueprints.gcp.bake import build_vm_condition

    base = f"projects/{PROJECT}/global/images/my-tcpx-base-v1"
    expression = build_vm_condition(PROJECT, ZONE, "bake-a3", base)
    assert cel_true(expression, IMAGE, base)
    assert not cel_true(expression, IMAGE, base + "-2")
    assert "my-tcpx" not in build_vm_condition(PROJECT, ZONE, "bake-a3", GCP_BASE)  # a public base: nothing to grant


def test_trigger_runs_pinned_packer_next_to_gcloud(preview):
    build = _one(preview, "gcp:cloudbuild/trigger:Trigger").inputs["build"]
    steps = build["steps"]
    assert [s["id"] for s in steps] == ["fetch", "pull", "tag", "push", "packer", "init", "build"]
    assert steps[4]["name"] == PACKER_IMAGE == "hashicorp/packer:1.11.2"
    # use_iap shells out to gcloud: Packer runs in the Cloud SDK image
    assert steps[-1]["name"].startswith("gcr.io/google.com/cloudsdktool/cloud-sdk:")
    assert steps[-1]["entrypoint"] == steps[4]["args"][-1] == "/workspace/packer"


def test_packer_template_parses(build):
    doc = _plain(hcl2.loads(build.template))
    assert doc["packer"][0]["required_plugins"][0]["googlecompute"]["source"] == "github.com/hashicorp/googlecompute"
    source = doc["source"][0]["googlecompute"]["gpuinfra"]
    assert source["source_image"] == GCP_BASE.rsplit("/", 1)[1]
    assert source["source_image_project_id"] == ["deeplearning-platform-release"]
    assert source["machine_type"] == "n1-standard-8" and source["disk_size"] == 200
    assert source["on_host_maintenance"] == "MIGRATE"  # no GPU on the build VM (Cluster Toolkit's default)
    assert source["image_storage_locations"] == ["us-central1"]  # where prices.yaml prices it
    assert source["image_labels"]["gpuinfra-bake-fabric"] == "tcpxo"
    assert source["subnetwork"] == SUBNET and source["service_account_email"] == "gv-x@p.iam.gserviceaccount.com"
    scripts = [p["shell"]["script"] for p in doc["build"][0]["provisioner"] if "shell" in p]
    assert scripts == ["install-host.sh", "pull-container.sh", "write-manifest.sh", "check-image.sh"]
    assert f"{HOST_SCRIPT_PATH} --bake" in build.files["install-host.sh"]


@pytest.mark.parametrize(
    "hostile",
    ['a"b', 'x${file("/etc/passwd")}', "%{ if true }x%{ endif }", "line\nbreak = 1", "back\\slash", "ünï"],
)
def test_hcl_string_keeps_a_hostile_value_one_literal(hostile):
    doc = hcl2.loads(f"value = {hcl_string(hostile)}\nafter = 1\n")
    assert set(doc) == {"value", "after"}  # nothing escaped the literal
    literal = doc["value"]
    assert literal.startswith('"') and literal.endswith('"') and "${" not in literal.replace("$${", "")


@pytest.mark.parametrize("image", [f"{NGC} && touch /tmp/x", "nvcr.io/a:b\nbootcmd", "$(id)", "x;y"])
def test_hostile_image_references_are_refused(a3mega_bake, image):
    with pytest.raises(SpecError):
        packer_build(a3mega_bake, "gv@p.iam.gserviceaccount.com", image, HOST, SUBNET)
    with pytest.raises(SpecError):
        cloud_build_steps("b", "bake", image, f"{HOST}/p/r/train:abc")


def test_subnet_range_is_private():
    from gpuinfra.plan.gcp import SYSTEM_CIDR

    assert ipaddress.ip_network(SYSTEM_CIDR).is_private


@pytest.mark.tools
def test_every_script_passes_shellcheck(build, tmp_path):
    shellcheck = need_tool("shellcheck")
    for name, text in build.files.items():
        path = tmp_path / name
        path.write_text(text)
        result = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, name + result.stdout


def _nat_inputs(result, prefix):
    """Router and RouterNat inputs of a preview with the resource-name prefix blanked."""
    out = {}
    for r in result.resources:
        if r.type in ("gcp:compute/router:Router", "gcp:compute/routerNat:RouterNat"):
            inputs = {k: v for k, v in r.inputs.items() if k not in ("network", "project", "region")}
            out[r.type] = json.dumps(inputs, sort_keys=True).replace(prefix, "<name>")
    return out


def test_cloud_nat_is_the_clusters(preview, a3mega_bake):
    """The bake's Router + Cloud NAT is the cluster's (blueprints.gcp.network.cloud_nat): an
    a3-megagpu-8g cluster previews the same two resources with the same inputs, up to names,
    the network and the project; both on their own network in their region."""
    spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp")
    cluster = run_preview(spec)
    assert len(_nat_inputs(cluster, spec.stack)) == 2
    assert _nat_inputs(preview, a3mega_bake.stack) == _nat_inputs(cluster, spec.stack)
    nat = _one(preview, "gcp:compute/routerNat:RouterNat").inputs
    assert nat["natIpAllocateOption"] == "AUTO_ONLY" and nat["region"] == a3mega_bake.region
