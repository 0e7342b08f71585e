"""Two stacks with the same name, written by ``gpuinfra new`` in two project folders for the same
account and region (or GCP project and zone), preview with disjoint physical names and select
only their own nodes: peer discovery, ``run_command``, the ``private_ips`` lookup, the backstop's
TerminateInstances condition (AWS), the managed instance group and its IAM names (GCP).

Every assertion reads the resource inputs, invoke arguments, outputs and boot text the offline
preview registers (:func:`gpuinfra.preview.run_preview`), not gpuinfra's own name functions.
"""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import re
import threading
import urllib.parse
from datetime import UTC, datetime
from typing import ClassVar

import pytest

from gpuinfra.errors import FileExistsGpuinfraError
from gpuinfra.newstack import NewStackRequest, cloud_stack_warning, create_stack, gcp_stack_warning
from gpuinfra.planner import PlanRequest
from gpuinfra.preview import PreviewMocks
from gpuinfra.spec import NAME_SUFFIX_RE, SpecError
from gpuinfra.stackfile import read_stack_spec, stack_file_path
from gpuinfra.verify import verify_stack_file
from tests.blueprints.helpers import preview

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)

#: Inputs that are physical names: the cloud refuses a second resource with the same value in one
#: account/region or project (SSM parameter, dashboard, SNS topic, alarm; GCE group, service
#: account, custom role) or merges what it holds (CloudWatch namespace).
PHYSICAL_NAME_INPUTS = {
    "aws:ssm/parameter:Parameter": ("name",),
    "aws:cloudwatch/dashboard:Dashboard": ("dashboardName",),
    "aws:sns/topic:Topic": ("name",),
    "aws:cloudwatch/metricAlarm:MetricAlarm": ("name", "namespace"),
    "gcp:compute/instanceGroupManager:InstanceGroupManager": ("name", "baseInstanceName"),
    "gcp:serviceaccount/account:Account": ("accountId",),
    "gcp:projects/iAMCustomRole:IAMCustomRole": ("roleId",),
}


class RecordingMocks(PreviewMocks):
    """The offline preview's answers, recording every provider call's arguments."""

    def __init__(self, spec):
        super().__init__(spec)
        self.calls: list[tuple[str, dict]] = []

    def call_result(self, token, args):
        self.calls.append((token, dict(args)))
        return super().call_result(token, args)


def _two_stacks(tmp_path, request):
    """``gpuinfra new`` of the same request in two project folders: both stack files, read back."""
    specs = []
    for folder in ("alice", "bob"):
        create_stack(request, tmp_path / folder, now=NOW)
        specs.append(read_stack_spec(tmp_path / folder, request.plan.name))
    return specs


def _physical_names(result) -> set[str]:
    names = set()
    for token, keys in PHYSICAL_NAME_INPUTS.items():
        for record in result.of_type(token):
            names |= {str(record.inputs[k]) for k in keys if record.inputs.get(k)}
    return names


def _aws_selection(result, mocks) -> dict[str, object]:
    """Everything that selects nodes on AWS: the peer-discovery filter in the boot text, the
    ``private_ips`` lookup's tags, the SSM target of ``run_command``, the backstop's condition."""
    (template,) = result.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    boot = gzip.decompress(base64.b64decode(template.inputs["userData"])).decode()
    discovery = re.findall(r'--filters "(Name=tag:[^"]+)"', boot)
    (stack_line,) = re.findall(r'^\s*STACK="([^"]*)"$', boot, re.M)
    lookups = [args.get("instanceTags") for token, args in mocks.calls if token == "aws:ec2/getInstances:getInstances"]
    (policy,) = [r for r in result.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.endswith("-backstop-terminate")]
    (terminate,) = [
        s for s in json.loads(policy.inputs["policy"])["Statement"] if s["Action"] == "ec2:TerminateInstances"
    ]
    target = re.search(r"--targets (\S+)", result.outputs["run_command"]).group(1)
    return {
        "discovery": (tuple(discovery), stack_line),
        "private_ips": tuple(tuple(sorted(t.items())) for t in lookups),
        "run_command": target,
        "backstop": json.dumps(terminate["Condition"], sort_keys=True),
    }


def test_two_aws_stacks_named_alike_share_no_name_and_no_node_selection(tmp_path):
    alice, bob = _two_stacks(
        tmp_path, NewStackRequest(PlanRequest(None, instance_type="p5.48xlarge", nodes=2, cloud="aws", name="train"))
    )
    assert (alice.stack, alice.region) == (bob.stack, bob.region) == ("train", alice.region)
    assert NAME_SUFFIX_RE.match(alice.name_suffix) and NAME_SUFFIX_RE.match(bob.name_suffix)
    assert alice.name_suffix != bob.name_suffix
    seen = {}
    for spec in (alice, bob):
        mocks = RecordingMocks(spec)
        result = preview(spec, mocks)
        names = _physical_names(result)
        # the four fixed names of monitoring and the metric namespace, each carrying the suffix
        assert {f"/gpuinfra/train-{spec.name_suffix}/cloudwatch-agent", f"gpuinfra/train-{spec.name_suffix}"} <= names
        assert len(names) == 5 and all(f"train-{spec.name_suffix}" in n for n in names), names
        selection = _aws_selection(result, mocks)
        (filters, stack_line) = selection["discovery"]
        assert filters == ("Name=tag:gpuinfra:stack-id,Values=$STACK",)  # not the bare gpuinfra:stack tag
        assert stack_line == f"train-{spec.name_suffix}"
        assert selection["private_ips"] == ((("gpuinfra:stack-id", f"train-{spec.name_suffix}"),),)
        assert selection["run_command"] == f"Key=tag:gpuinfra:stack-id,Values=train-{spec.name_suffix}"
        assert selection["backstop"] == json.dumps(
            {"StringEquals": {"aws:ResourceTag/gpuinfra:stack-id": f"train-{spec.name_suffix}"}}
        )
        seen[spec.name_suffix] = (names, selection)
    (names_a, sel_a), (names_b, sel_b) = seen.values()
    assert not names_a & names_b
    for key in sel_a:
        assert sel_a[key] != sel_b[key], key


def test_aws_peer_discovery_filters_by_the_stack_id_and_the_deployment(tmp_path):
    """After `up` gave each stack a deployment, each node lists only its stack id and deployment."""
    alice, bob = _two_stacks(
        tmp_path, NewStackRequest(PlanRequest(None, instance_type="p5.48xlarge", nodes=2, cloud="aws", name="train"))
    )
    filters = []
    for spec, deployment in ((alice, "0123456789ab"), (bob, "ba9876543210")):
        spec = spec.model_copy(update={"deployment_id": deployment})
        mocks = RecordingMocks(spec)
        result = preview(spec, mocks)
        (template,) = result.of_type("aws:ec2/launchTemplate:LaunchTemplate")
        boot = gzip.decompress(base64.b64decode(template.inputs["userData"])).decode()
        (line,) = [ln for ln in boot.splitlines() if "--filters" in ln]
        assert '"Name=tag:gpuinfra:stack-id,Values=$STACK"' in line
        assert '"Name=tag:gpuinfra:deployment,Values=$DEPLOYMENT"' in line
        assert "tag:gpuinfra:stack," not in line  # never the bare name across the region
        assert f'STACK="train-{spec.name_suffix}"' in boot and f'DEPLOYMENT="{deployment}"' in boot
        (lookup,) = [a["instanceTags"] for t, a in mocks.calls if t == "aws:ec2/getInstances:getInstances"]
        assert lookup == {"gpuinfra:stack-id": f"train-{spec.name_suffix}", "gpuinfra:deployment": deployment}
        filters.append((f"train-{spec.name_suffix}", deployment))
    assert filters[0][0] != filters[1][0] and filters[0][1] != filters[1][1]


def test_two_gcp_stacks_named_alike_get_their_own_group_account_and_role(tmp_path):
    alice, bob = _two_stacks(
        tmp_path,
        NewStackRequest(
            PlanRequest(
                None, instance_type="a3-megagpu-8g", nodes=2, cloud="gcp", name="train", gcp_project="my-proj-1"
            ),
            profile="llm-pretrain",
        ),
    )
    assert alice.zone == bob.zone and alice.name_suffix != bob.name_suffix
    seen = []
    for spec in (alice, bob):
        result = preview(spec)
        names = _physical_names(result)
        (group,) = result.of_type("gcp:compute/instanceGroupManager:InstanceGroupManager")
        group_name = group.inputs["name"]
        assert group_name == group.inputs["baseInstanceName"] == f"train--{spec.name_suffix}-node"
        (account,) = result.of_type("gcp:serviceaccount/account:Account")
        assert 6 <= len(account.inputs["accountId"]) <= 30  # cloud.google.com/iam/docs/service-accounts-create
        (role,) = result.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
        assert re.fullmatch(r"[A-Za-z0-9_.]{3,64}", role.inputs["roleId"])
        assert all(spec.name_suffix in n for n in names) and len(names) == 3, names
        (template,) = result.of_type("gcp:compute/instanceTemplate:InstanceTemplate")
        script = template.inputs["metadata"]["startup-script"]
        # peer discovery lists the stack's own MIG; run_command and the dashboard select the same
        assert f"list-instances {group_name} --zone" in script
        assert f"list-instances {group_name} --zone" in result.outputs["run_command"]
        (dashboard,) = result.of_type("gcp:monitoring/dashboard:Dashboard")
        assert f'"gpuinfra-stack-id\\" = \\"train-{spec.name_suffix}\\"' in dashboard.inputs["dashboardJson"]
        seen.append((names, group_name))
    assert not seen[0][0] & seen[1][0]
    assert seen[0][1] != seen[1][1]


def test_new_refuses_a_name_the_folder_already_has_before_planning(tmp_path, monkeypatch):
    request = NewStackRequest(PlanRequest(None, instance_type="p5.48xlarge", nodes=2, cloud="aws", name="train"))
    create_stack(request, tmp_path, now=NOW)
    path = stack_file_path(tmp_path, "train")
    before = path.read_text()
    import gpuinfra.newstack as newstack

    monkeypatch.setattr(newstack, "load_catalog", lambda: pytest.fail("planned before refusing"))
    with pytest.raises(FileExistsGpuinfraError, match="already exists; pass --force") as refused:
        create_stack(request, tmp_path, now=NOW)
    assert refused.value.exit_code == 5
    assert path.read_text() == before


def test_new_force_keeps_the_name_suffix(tmp_path):
    request = NewStackRequest(PlanRequest(None, instance_type="p5.48xlarge", nodes=2, cloud="aws", name="train"))
    create_stack(request, tmp_path, now=NOW)
    first = read_stack_spec(tmp_path, "train").name_suffix
    create_stack(request, tmp_path, force=True, now=NOW)
    assert read_stack_spec(tmp_path, "train").name_suffix == first


def test_preview_refuses_a_stack_file_without_a_name_suffix(tmp_path):
    request = NewStackRequest(PlanRequest(None, instance_type="p5.48xlarge", nodes=2, cloud="aws", name="old"))
    create_stack(request, tmp_path, now=NOW)
    path = stack_file_path(tmp_path, "old")
    path.write_text(re.sub(r"\n +name_suffix: \S+", "", path.read_text()))
    assert read_stack_spec(tmp_path, "old").name_suffix is None  # still readable: `down` works
    with pytest.raises(SpecError, match=r"no gpuinfra:cluster.name_suffix .* add `name_suffix: [a-z0-9]{6}`"):
        verify_stack_file(tmp_path, "old")


def test_new_warns_when_the_region_already_has_a_stack_of_that_name(monkeypatch):
    """Against moto's Resource Groups Tagging API: an instance and a bucket tagged with another
    folder's stack ``train`` in the region give one warning; another stack's tags, another region,
    or a failing API give none."""
    moto = pytest.importorskip("moto")
    import boto3

    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(var, value)
    from tests.blueprints.helpers import make_spec

    spec = make_spec("p5.48xlarge", nodes=2, stack="train")
    with moto.mock_aws():
        ec2 = boto3.client("ec2", region_name=spec.region)
        image = ec2.describe_images()["Images"][0]["ImageId"]
        tags = [{"Key": "gpuinfra:stack", "Value": "train"}, {"Key": "gpuinfra:stack-id", "Value": "train-zz9zz9"}]
        assert cloud_stack_warning(spec) == ""  # nothing there yet: no warning
        ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )
        other = boto3.client("ec2", region_name="us-west-2")
        other_image = other.describe_images()["Images"][0]["ImageId"]
        other.run_instances(
            ImageId=other_image,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "gpuinfra:stack", "Value": "t-9"}]}],
        )
        warning = cloud_stack_warning(spec)
        assert warning.startswith(f"{spec.region} already has 1 resource(s) of a stack named 'train'")
        assert ":instance/i-" in warning and f"train-{spec.name_suffix}" in warning
        assert cloud_stack_warning(spec.model_copy(update={"stack": "t-9"})) == ""  # only in us-west-2
        # `new --force` of the stack whose resources these are: its own id, no warning
        assert cloud_stack_warning(spec.model_copy(update={"name_suffix": "zz9zz9"})) == ""

    class Failing:
        def get_resources(self, **_):
            raise RuntimeError("AccessDenied")

    assert cloud_stack_warning(spec, tagging=Failing()) == ""  # a warning only: never stops `new`
    gcp = make_spec("a3-megagpu-8g", cloud="gcp", profile="llm-pretrain")
    assert cloud_stack_warning(gcp, tagging=Failing()) == ""


def test_the_longest_new_stack_name_fits_every_gcp_name_and_keeps_its_suffix():
    """A 27-character name (the most `new` allows) with its suffix stays within GCE's 63-character
    names and the MIG's 58-character base instance name (cloud.google.com/compute/docs/reference/
    rest/v1/instanceGroupManagers), the service account id's 6-30 characters
    (cloud.google.com/iam/docs/service-accounts-create) and the custom role id's 64
    (cloud.google.com/iam/docs/reference/rest/v1/projects.roles/create); a cut name keeps the
    suffix, so two long names that differ only past the cut still differ."""
    from tests.blueprints.helpers import make_spec

    name = "a" * 26 + "b"
    specs = [
        make_spec("a3-megagpu-8g", nodes=2, cloud="gcp", profile="llm-pretrain", stack=name, name_suffix=suffix)
        for suffix in ("k3x9q2", "p0p0p0")
    ]
    seen = []
    for spec in specs:
        result = preview(spec)
        (group,) = result.of_type("gcp:compute/instanceGroupManager:InstanceGroupManager")
        (account,) = result.of_type("gcp:serviceaccount/account:Account")
        (role,) = result.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
        base, account_id, role_id = group.inputs["baseInstanceName"], account.inputs["accountId"], role.inputs["roleId"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", base) and len(base) <= 58
        assert len(base) + len("-abcd") <= 63  # the VMs' names
        assert re.fullmatch(r"[a-z][-a-z0-9]{4,28}[a-z0-9]", account_id)
        assert re.fullmatch(r"[A-Za-z0-9_.]{3,64}", role_id)
        assert all(spec.name_suffix in n for n in (base, account_id, role_id))
        seen.append({base, account_id, role_id})
    assert not seen[0] & seen[1]


def test_up_refuses_a_stack_file_without_a_name_suffix_before_pulumi_runs(tmp_path):
    from gpuinfra import lifecycle
    from tests.blueprints.helpers import make_spec

    class NoBackend:
        def __getattr__(self, name):
            pytest.fail(f"the backend was asked for {name} before the refusal")

    spec = make_spec("p5.48xlarge", nodes=2, name_suffix=None)
    with pytest.raises(SpecError, match="no gpuinfra:cluster.name_suffix") as refused:
        lifecycle.deploy(NoBackend(), tmp_path, spec, lambda event: None, now=NOW)
    assert refused.value.exit_code == 2


class _FakeCompute(http.server.BaseHTTPRequestHandler):
    """Compute ``instances.aggregatedList`` as documented
    (https://cloud.google.com/compute/docs/reference/rest/v1/instances/aggregatedList): ``items``
    maps ``zones/<zone>`` to ``{"instances": [...]}``, or to a ``warning`` for a zone without
    matches; the ``filter`` ``labels.gpuinfra-stack = "<value>"`` is applied to ``VMS``."""

    VMS: ClassVar[list[dict]] = []
    requests: ClassVar[list[str]] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/compute/v1/projects/my-proj-123/aggregated/instances":
            self.send_response(404)
            self.end_headers()
            return
        query = urllib.parse.parse_qs(url.query)
        match = re.fullmatch(r'labels\.gpuinfra-stack = "([a-z0-9_-]+)"', query["filter"][0])
        vms = [vm for vm in self.VMS if match and vm["labels"].get("gpuinfra-stack") == match.group(1)]
        items: dict = {"zones/us-east1-b": {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "none"}}}
        for vm in vms:
            items.setdefault(f"zones/{vm['zone']}", {"instances": []})["instances"].append(vm)
        body = json.dumps({"kind": "compute#instanceAggregatedList", "items": items}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_compute():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeCompute)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeCompute.VMS, _FakeCompute.requests = [], []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_new_warns_when_the_gcp_project_has_vms_of_a_stack_of_that_name(fake_compute):
    import requests

    from tests.blueprints.helpers import make_spec

    spec = make_spec("a3-megagpu-8g", cloud="gcp", profile="llm-pretrain", stack="train")
    spec = spec.model_copy(update={"gcp_project": "my-proj-123"})
    session = requests.Session()
    assert gcp_stack_warning(spec, session, fake_compute) == ""  # nothing there yet
    assert 'labels.gpuinfra-stack = "train"' in urllib.parse.unquote_plus(_FakeCompute.requests[-1])
    _FakeCompute.VMS = [
        {
            "name": "train-zz9zz9-node-ab12",
            "zone": "us-central1-a",
            "labels": {"gpuinfra-stack": "train", "gpuinfra-stack-id": "train-zz9zz9"},
        },
        {"name": "t-9-node-cd34", "zone": "europe-west4-a", "labels": {"gpuinfra-stack": "t-9"}},
    ]
    warning = gcp_stack_warning(spec, session, fake_compute)
    assert warning.startswith("project my-proj-123 already has 1 VM(s) of a stack named 'train'"), warning
    assert "train-zz9zz9-node-ab12" in warning and f"train-{spec.name_suffix}" in warning
    assert gcp_stack_warning(spec.model_copy(update={"stack": "other"}), session, fake_compute) == ""
    # `new --force` of the stack whose VMs these are: its own id, no warning
    assert gcp_stack_warning(spec.model_copy(update={"name_suffix": "zz9zz9"}), session, fake_compute) == ""
    # an error answer (another project: 404 here) or no server at all: no warning, `new` goes on
    assert gcp_stack_warning(spec.model_copy(update={"gcp_project": "other-proj-1"}), session, fake_compute) == ""
    assert gcp_stack_warning(spec, session, "http://127.0.0.1:9") == ""
