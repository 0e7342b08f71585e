"""`up` / `down` / `ls` / `reap` with the Automation API replaced at its boundary (recording fake),
buckets checked against moto S3 on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import boto3
import pytest
import yaml

from gpuinfra import lifecycle
from gpuinfra.errors import MissingDependencyError, OperationError
from gpuinfra.lifecycle import StackStatus
from tests.bake.conftest import GCP_BASE, NGC
from tests.conftest import without_aws_credentials


class FakeBackend:
    """Records every call; answers like a Pulumi backend would."""

    def __init__(self, deployed=(), outputs=None, fail=None, replaced=(), pending=()):
        self.calls = []
        self.deployed = set(deployed)
        self._outputs = outputs or {}
        self.fail = fail
        self.replaced = list(replaced)  # what a preview would replace: (type token, name)
        self.pending = list(pending)  # creates an interrupted update left pending: (type token, name)

    def pending_creates(self, project_dir, stack):
        self.calls.append(("pending_creates", stack))
        return self.pending

    def list_stacks(self, project_dir):
        self.calls.append(("list_stacks", Path(project_dir).name))
        return [StackStatus(n, False, datetime.now(UTC) - timedelta(hours=2), 30) for n in sorted(self.deployed)]

    def up(self, project_dir, stack, on_event):
        self.calls.append(("up", stack))
        if self.fail:
            raise self.fail
        self.deployed.add(stack)
        return {"create": 30}

    def replacements(self, project_dir, stack):
        self.calls.append(("replacements", stack))
        return self.replaced

    def destroy(self, project_dir, stack, on_event):
        self.calls.append(("destroy", stack))
        self.deployed.discard(stack)
        return {"delete": 30}

    def outputs(self, project_dir, stack):
        self.calls.append(("outputs", stack))
        return self._outputs


@pytest.fixture
def project(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert (
        run_cli(
            "new", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "train", "--project-dir", str(tmp_path)
        ).exit_code
        == 0
    )
    return tmp_path


def _use(monkeypatch, backend, ec2=None):
    """Replace the Automation API with ``backend`` and EC2 (the orphan sweep of ``down``) with
    ``ec2`` (default: an account where no instance of the stack runs)."""
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)
    monkeypatch.setattr(lifecycle, "make_ec2_client", lambda region: ec2 or _EmptyEc2())


class _EmptyEc2:
    """``describe_instances`` pages with no instance; anything else is a test failure."""

    def get_paginator(self, name):
        assert name == "describe_instances"
        return self

    def paginate(self, **kwargs):
        return [{"Reservations": []}]


def test_without_pulumi_cli_every_command_says_what_to_install(run_cli, project, monkeypatch):
    monkeypatch.setenv("PATH", str(project))  # no `pulumi` anywhere
    for args in (["down", "train"], ["up", "train"], ["reap", "--expired"]):
        result = run_cli(*args, "--project-dir", str(project))
        assert result.exit_code == 6
        assert result.stderr == f"error: {lifecycle.PULUMI_INSTALL_HINT}\n"
    listing = run_cli("ls", "--project-dir", str(project), "--json")
    assert listing.exit_code == 0 and json.loads(listing.stdout)[0]["deployed"] is None


def test_up_calls_the_backend_once(run_cli, project, monkeypatch):
    backend = FakeBackend()
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert backend.calls == [("list_stacks", project.name), ("up", "train")]  # not deployed: no preview needed


def test_down_keeps_data_by_default(run_cli, project, monkeypatch):
    backend = FakeBackend(deployed={"train"})
    _use(monkeypatch, backend)
    result = run_cli("down", "train", "--project-dir", str(project))
    assert result.exit_code == 0 and backend.calls == [
        ("list_stacks", project.name),
        ("outputs", "train"),
        ("destroy", "train"),
    ]
    assert "the bucket and its data are kept" in result.stdout
    # llm-finetune keeps 500 GB at S3's $0.023/GB-month (aws.amazon.com/s3/pricing, us-east-1) and
    # at most 500 GB of earlier versions for 7 of the month's 730 / 24 days
    assert "left after down, per month: $14.15/month" in result.stdout
    assert "S3 Standard storage, bucket kept (500 GB): $11.50/month" in result.stdout
    spec = yaml.safe_load((project / "stacks" / "Pulumi.train.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert spec["delete_bucket_on_destroy"] is False


@pytest.fixture
def moto_s3(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    return boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)


def test_delete_data_refuses_a_non_empty_bucket_without_yes(run_cli, project, monkeypatch, moto_s3):
    moto_s3.create_bucket(Bucket="gpuinfra-train-abc")
    moto_s3.put_object(Bucket="gpuinfra-train-abc", Key="checkpoints/step-1.pt", Body=b"w")
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": "gpuinfra-train-abc"})
    _use(monkeypatch, backend)
    result = run_cli("down", "train", "--delete-data", "--project-dir", str(project))
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: bucket(s) gpuinfra-train-abc are not empty (1 object versions); nothing was destroyed."
    )
    assert backend.calls == [("list_stacks", project.name), ("outputs", "train")]  # nothing destroyed by surprise
    result = run_cli("down", "train", "--delete-data", "--yes", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert [c for c in backend.calls[2:] if c[0] != "list_stacks"] == [("outputs", "train"), ("destroy", "train")]
    assert "deleted bucket gpuinfra-train-abc and its 1 object version(s)" in result.stdout
    assert "gpuinfra-train-abc" not in [b["Name"] for b in moto_s3.list_buckets()["Buckets"]]
    spec = yaml.safe_load((project / "stacks" / "Pulumi.train.yaml").read_text())["config"]["gpuinfra:cluster"]
    assert spec["delete_bucket_on_destroy"] is False  # the stack file is never changed


def test_delete_data_with_an_empty_bucket_needs_no_confirmation(run_cli, project, monkeypatch, moto_s3):
    moto_s3.create_bucket(Bucket="gpuinfra-train-empty")
    backend = FakeBackend(deployed={"train"}, outputs={"bucket_name": "gpuinfra-train-empty"})
    _use(monkeypatch, backend)
    assert run_cli("down", "train", "--delete-data", "--project-dir", str(project)).exit_code == 0
    assert ("up", "train") not in backend.calls and backend.calls[-1] == ("destroy", "train")


def test_unknown_stack(run_cli, project, monkeypatch):
    backend = FakeBackend()
    _use(monkeypatch, backend)
    result = run_cli("down", "nope", "--project-dir", str(project))
    assert result.exit_code == 2 and result.stderr.startswith("error: no stack 'nope':") and backend.calls == []


def test_locked_stack_and_expired_credentials_map_to_clear_errors():
    from pulumi import automation as auto
    from pulumi.automation._cmd import CommandResult

    locked = auto.ConcurrentUpdateError(CommandResult("", "error: the stack is currently locked by 1 lock(s)", 255))
    with pytest.raises(OperationError, match="stack 'train' is locked by another update in progress"):
        lifecycle._run(lambda: (_ for _ in ()).throw(locked), "train")
    expired = auto.CommandError(
        CommandResult("", "error: ExpiredToken: The security token included in the request is expired", 255)
    )
    with pytest.raises(MissingDependencyError, match="cloud credentials for stack 'train' are expired"):
        lifecycle._run(lambda: (_ for _ in ()).throw(expired), "train")


def test_locked_stack_through_the_cli(run_cli, project, monkeypatch):
    backend = FakeBackend(fail=OperationError("stack 'train' is locked by another update in progress"))
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 7 and "locked" in result.stderr


def test_missing_credentials(run_cli, project, monkeypatch):
    without_aws_credentials(monkeypatch, project)
    backend = FakeBackend()
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 6 and result.stderr.startswith("error: no AWS credentials found") and backend.calls == []


def test_ls_and_reap_expired(run_cli, project, monkeypatch):
    assert (
        run_cli(
            "new", "--instance-type", "g5.xlarge", "--profile", "dev", "--name", "old", "--project-dir", str(project)
        ).exit_code
        == 0
    )
    path = project / "stacks" / "Pulumi.old.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["created_at"] = "2026-01-01T00:00:00Z"  # TTL 12 h: long expired
    path.write_text(yaml.safe_dump(doc))
    backend = FakeBackend(deployed={"old", "train"})
    _use(monkeypatch, backend)
    rows = {r["stack"]: r for r in json.loads(run_cli("ls", "--project-dir", str(project), "--json").stdout)}
    assert rows["old"]["expired"] is True and rows["train"]["expired"] is False
    assert rows["train"]["deployed"] is True and rows["train"]["compute_price_per_hour_usd"] == "43.915280"
    assert 87 < Decimal(rows["train"]["compute_cost_so_far_usd"]) < 88  # 2 h x $43.92/h
    assert rows["train"]["catalog_date"] == "undated (imported 2026-11-22); spot ranges 2025-11-30"
    dry = run_cli("reap", "--expired", "--dry-run", "--project-dir", str(project))
    assert "would destroy old" in dry.stdout and not [c for c in backend.calls if c[0] == "destroy"]
    assert run_cli("reap", "--expired", "--project-dir", str(project)).exit_code == 0
    assert [c for c in backend.calls if c[0] == "destroy"] == [("destroy", "old")]
    assert run_cli("reap", "--project-dir", str(project)).exit_code == 2


# What `pulumi up` prints when the program raises (the engine's report of an unhandled exception).
_CAPACITY_STDERR = """error: Program failed with an unhandled exception:
Traceback (most recent call last):
  File "/project/program/__main__.py", line 4, in <module>
    build(spec)
gpuinfra.errors.CapacityError: gpuinfra-capacity: the EC2 Fleet launched 0 of 2 p4d.24xlarge instances in use1-az1 (launched: none); EC2 had no capacity for all of them at once.
error: update failed
"""


def test_the_automation_boundary_turns_a_capacity_failure_into_its_own_error():
    from pulumi.automation._cmd import CommandResult
    from pulumi.automation.errors import CommandError

    from gpuinfra.errors import CapacityError

    def failing():
        raise CommandError(CommandResult("Updating (train)", _CAPACITY_STDERR, 255))

    with pytest.raises(CapacityError) as raised:
        lifecycle._run(failing, "train")
    assert str(raised.value) == (
        "the EC2 Fleet launched 0 of 2 p4d.24xlarge instances in use1-az1 (launched: none); "
        "EC2 had no capacity for all of them at once."
    )
    assert raised.value.exit_code == 7


def test_up_without_capacity_destroys_what_it_created_and_keeps_the_bucket(run_cli, project, monkeypatch):
    from gpuinfra.errors import CapacityError

    backend = FakeBackend(fail=CapacityError("the EC2 Fleet launched 0 of 2 p4d.24xlarge instances in use1-az1"))
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 7
    assert backend.calls == [("list_stacks", project.name), ("up", "train"), ("destroy", "train")]
    assert result.stderr == (
        "error: the EC2 Fleet launched 0 of 2 p4d.24xlarge instances in use1-az1. Everything `up` created was destroyed "
        "again, so nothing bills (its new bucket is empty and kept); run `gpuinfra up train` to try again\n"
    )


def test_up_says_to_run_down_when_the_clean_up_fails_too(run_cli, project, monkeypatch):
    from gpuinfra.errors import CapacityError

    class Stuck(FakeBackend):
        def destroy(self, project_dir, stack, on_event):
            self.calls.append(("destroy", stack))
            raise OperationError("pulumi failed on stack 'train': DependencyViolation")

    backend = Stuck(fail=CapacityError("launched 0 of 2"))
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 7 and backend.calls == [
        ("list_stacks", project.name),
        ("up", "train"),
        ("destroy", "train"),
    ]
    assert "run `gpuinfra down train` so nothing keeps billing" in result.stderr and result.stderr.count("\n") == 1


def test_a_deployed_stack_is_never_destroyed_after_a_capacity_failure(run_cli, project, monkeypatch):
    from gpuinfra.errors import CapacityError

    backend = FakeBackend(
        deployed=["train"], fail=CapacityError("the EC2 Fleet launched 0 of 2 p4d.24xlarge instances")
    )
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 7 and ("destroy", "train") not in backend.calls  # its bucket and data stay in the stack
    assert result.stderr == (
        "error: the EC2 Fleet launched 0 of 2 p4d.24xlarge instances. The stack's other resources "
        "are unchanged; run `gpuinfra up train` to try again, or `gpuinfra down train` so nothing "
        "keeps billing\n"
    )


def test_up_refuses_to_replace_running_nodes_unless_asked(run_cli, project, monkeypatch):
    backend = FakeBackend(
        deployed=["train"],
        replaced=[("aws:ec2/launchTemplate:LaunchTemplate", "train-lt"), ("aws:ec2/fleet:Fleet", "train-fleet")],
    )
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 2 and ("up", "train") not in backend.calls
    assert result.stderr == (
        "error: this update of stack 'train' would replace its running nodes (train-fleet: the change reaches the "
        "fleet / group, which cannot be updated in place), ending any training on them; run `gpuinfra up train "
        "--replace-nodes` to do it, or undo the change in the stack file\n"
    )
    again = run_cli("up", "train", "--replace-nodes", "--project-dir", str(project))
    assert again.exit_code == 0 and backend.calls[-1] == ("up", "train")


def test_up_refuses_a_stack_whose_ttl_is_over(run_cli, project, monkeypatch):
    backend = FakeBackend()
    _use(monkeypatch, backend)
    path = project / "stacks" / "Pulumi.train.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["created_at"] = "2026-01-01T00:00:00Z"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_cli("up", "train", "--project-dir", str(project))
    assert result.exit_code == 2 and backend.calls == [] and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: stack 'train' ends at 2026-01-0")
    assert "raise gpuinfra:cluster.profile.ttl_hours in the stack file" in result.stderr


# ------------------------------------------------------------------------- image bakes
BASE_AMI = "ami-0123456789abcdef0"
BUILT_AMI = "ami-0fedcba9876543210"


@pytest.fixture
def bake_project(run_cli, project, moto_url, monkeypatch):
    """The `train` cluster project plus the p5 bake, and moto ECR holding the bake's container."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    assert (
        run_cli(
            "image",
            "bake",
            "--cloud",
            "aws",
            "--family",
            "p5",
            "--base-image",
            BASE_AMI,
            "--container-base",
            NGC,
            "--project-dir",
            str(project),
        ).exit_code
        == 0
    )
    ecr = boto3.client("ecr", region_name="us-east-1", endpoint_url=moto_url)
    with contextlib.suppress(ecr.exceptions.RepositoryNotFoundException):
        ecr.delete_repository(repositoryName="gpuinfra/bake-p5", force=True)
    uri = ecr.create_repository(repositoryName="gpuinfra/bake-p5")["repository"]["repositoryUri"]
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": 10,
            "digest": "sha256:" + "c" * 64,
        },
        "layers": [
            {
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "size": 20,
                "digest": "sha256:" + "d" * 64,
            }
        ],
    }
    ecr.put_image(repositoryName="gpuinfra/bake-p5", imageManifest=json.dumps(manifest), imageTag="bake-0123456789ab")
    digest = ecr.describe_images(repositoryName="gpuinfra/bake-p5", imageIds=[{"imageTag": "bake-0123456789ab"}])[
        "imageDetails"
    ][0]["imageDigest"]
    return project, uri, digest


def _bake_file(project: Path) -> dict:
    return yaml.safe_load((project / "stacks" / "Pulumi.bake-p5.yaml").read_text())["config"]["gpuinfra:bake"]


def test_up_of_an_aws_bake_builds_records_and_new_uses_it(run_cli, bake_project, monkeypatch):
    project, uri, digest = bake_project
    backend = FakeBackend(outputs={"image_id": BUILT_AMI, "container_image": f"{uri}:bake-0123456789ab"})
    _use(monkeypatch, backend)
    result = run_cli("up", "bake-p5", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert backend.calls == [("up", "bake-p5"), ("outputs", "bake-p5")]  # no TTL, no node-replacement preview
    assert _bake_file(project)["result"] == {
        "image_id": BUILT_AMI,
        "container_image": f"{uri}@{digest}",
        "root_snapshot_gib": 200,  # the recipe's root volume (build_volume_size_gib)
    }
    assert result.stdout.splitlines()[0] == (
        "up bake-p5: image bake of aws p5 (efa) in us-east-1; Image Builder's build "
        "instance builds the container, then the AMI; this waits for both"
    )
    assert "use: gpuinfra new ... --image baked:bake-p5" in result.stdout
    made = run_cli(
        "new",
        "--instance-type",
        "p5.48xlarge",
        "--image",
        "baked:bake-p5",
        "--name",
        "c1",
        "--project-dir",
        str(project),
    )
    assert made.exit_code == 0, made.stderr
    config = yaml.safe_load((project / "stacks" / "Pulumi.c1.yaml").read_text())["config"]
    assert config["gpuinfra:cluster"]["ami_id"] == BUILT_AMI
    assert config["gpuinfra:cluster"]["profile"]["container_image"] == f"{uri}@{digest}"


def test_up_of_a_bake_without_credentials_is_exit_6(run_cli, bake_project, monkeypatch):
    project, _, _ = bake_project
    without_aws_credentials(monkeypatch, project)
    backend = FakeBackend()
    _use(monkeypatch, backend)
    result = run_cli("up", "bake-p5", "--project-dir", str(project))
    assert result.exit_code == 6 and result.stderr.startswith("error: no AWS credentials found") and backend.calls == []


def test_up_of_a_bake_whose_container_ecr_lacks_is_exit_7_and_records_nothing(run_cli, bake_project, monkeypatch):
    project, uri, _ = bake_project
    backend = FakeBackend(outputs={"image_id": BUILT_AMI, "container_image": f"{uri}:bake-ffffffffffff"})
    _use(monkeypatch, backend)
    result = run_cli("up", "bake-p5", "--project-dir", str(project))
    assert result.exit_code == 7 and result.stderr.count("\n") == 1
    assert result.stderr == (
        f"error: bake 'bake-p5' is built (image {BUILT_AMI}), but recording it failed: looking up "
        f"the digest of {uri}:bake-ffffffffffff failed: ImageNotFoundException; fix that, then run "
        "`gpuinfra image record bake-p5 --from-outputs`\n"
    )
    assert "result" not in _bake_file(project)


def test_record_from_outputs_and_its_either_or(run_cli, bake_project, monkeypatch):
    project, uri, digest = bake_project
    _use(monkeypatch, FakeBackend(outputs={"image_id": BUILT_AMI, "container_image": f"{uri}:bake-0123456789ab"}))
    both = run_cli(
        "image", "record", "bake-p5", "--from-outputs", "--image-id", BUILT_AMI, "--project-dir", str(project)
    )
    neither = run_cli("image", "record", "bake-p5", "--project-dir", str(project))
    assert both.exit_code == neither.exit_code == 2 and "give either --from-outputs, or --image-id" in neither.stderr
    result = run_cli("image", "record", "bake-p5", "--from-outputs", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        f"bake-p5: image {BUILT_AMI}, container {uri}@{digest} recorded; use: gpuinfra new ... --image baked:bake-p5\n"
    )


def test_down_of_a_bake_destroys_it_keeps_the_image_and_says_what_stays(run_cli, bake_project, monkeypatch):
    project, uri, digest = bake_project
    assert (
        run_cli(
            "image",
            "record",
            "bake-p5",
            "--image-id",
            BUILT_AMI,
            "--container-image",
            f"{uri}@{digest}",
            "--project-dir",
            str(project),
        ).exit_code
        == 0
    )
    assert (
        run_cli(
            "new",
            "--instance-type",
            "p5.48xlarge",
            "--image",
            "baked:bake-p5",
            "--name",
            "c1",
            "--project-dir",
            str(project),
        ).exit_code
        == 0
    )
    backend = FakeBackend(deployed={"bake-p5"}, outputs={"image_id": BUILT_AMI, "container_image": "x"})
    _use(monkeypatch, backend)
    result = run_cli("down", "bake-p5", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert backend.calls == [("outputs", "bake-p5"), ("destroy", "bake-p5")]
    assert result.stdout.splitlines() == [
        "down bake-p5: destroying the bake's build resources; its image is kept",
        "done: {'delete': 30}",
        "kept (gpuinfra deletes no image; delete by hand once no cluster boots it):",
        f"  AMI {BUILT_AMI} and its EBS snapshot(s) in us-east-1: deleting an Image Builder image does not deregister "
        "the AMI it made",
        f"    aws ec2 deregister-image --image-id {BUILT_AMI} --delete-associated-snapshots --region us-east-1",
        "  ECR repository gpuinfra/bake-p5 and its container image(s): kept by the stack (retain on delete): cluster "
        "stacks made from the bake record the container by its digest there. A later `gpuinfra up` of this bake fails "
        "while it exists (ECR RepositoryAlreadyExistsException): delete it first, once no cluster needs it",
        "    aws ecr delete-repository --repository-name gpuinfra/bake-p5 --force --region us-east-1",
        "cluster stacks that boot this image: c1 (keep the image until `gpuinfra down` of each)",
        # 100 GB of EBS snapshot at $0.05/GB-month and 15 GB in ECR at $0.10/GB-month
        # (aws.amazon.com/ebs/pricing, aws.amazon.com/ecr/pricing; sizes estimated: README "What a bake costs")
        "left after down, per month: $6.50/month (AMI snapshot $5.00; ECR container $1.50; estimated sizes)",
    ]
    assert _bake_file(project)["result"]["image_id"] == BUILT_AMI  # the record stays: c1 and new clusters use it


def test_cluster_flags_on_a_bake_are_exit_2_and_touch_nothing(run_cli, bake_project, monkeypatch):
    project, _, _ = bake_project
    backend = FakeBackend(deployed={"bake-p5"})
    _use(monkeypatch, backend)
    down = run_cli("down", "bake-p5", "--delete-data", "--yes", "--project-dir", str(project))
    assert down.exit_code == 2 and backend.calls == [] and down.stderr.count("\n") == 1
    assert down.stderr == (
        "error: --delete-data is for cluster stacks (their data bucket); 'bake-p5' is an image bake, "
        "which has none; nothing was destroyed: run `gpuinfra down bake-p5`\n"
    )
    up = run_cli("up", "bake-p5", "--replace-nodes", "--project-dir", str(project))
    assert up.exit_code == 2 and backend.calls == [] and "--replace-nodes is for cluster stacks" in up.stderr


def test_reap_and_ls_never_touch_a_bake(run_cli, bake_project, monkeypatch):
    project, _, _ = bake_project
    path = project / "stacks" / "Pulumi.train.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["created_at"] = "2026-01-01T00:00:00Z"  # expired long ago
    path.write_text(yaml.safe_dump(doc))
    backend = FakeBackend(deployed={"bake-p5", "train"})
    _use(monkeypatch, backend)
    assert [r["stack"] for r in json.loads(run_cli("ls", "--json", "--project-dir", str(project)).stdout)] == ["train"]
    result = run_cli("reap", "--expired", "--project-dir", str(project))
    assert result.exit_code == 0, result.stderr
    assert [c for c in backend.calls if c[0] == "destroy"] == [("destroy", "train")]


GCP_BAKE = (
    "image",
    "bake",
    "--cloud",
    "gcp",
    "--family",
    "a3-megagpu-8g",
    "--gcp-project",
    "my-proj-123",
    "--base-image",
    GCP_BASE,
    "--container-base",
    NGC,
)


def test_up_of_a_gcp_bake_starts_its_build_and_says_how_to_record(run_cli, tmp_path, monkeypatch):
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession

    from gpuinfra.bake import gcp_api
    from tests.replay_server import ReplayServer

    assert run_cli(*GCP_BAKE, "--project-dir", str(tmp_path)).exit_code == 0
    backend = FakeBackend(
        outputs={"run_command": "gcloud pubsub topics publish gpuinfra-bake-a3-megagpu-8g-run --message=bake"}
    )
    _use(monkeypatch, backend)
    without = run_cli("up", "bake-a3-megagpu-8g", "--project-dir", str(tmp_path))
    assert (
        without.exit_code == 6 and without.stderr.startswith("error: no GCP credentials found") and backend.calls == []
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "adc.json"))
    path = "/v1/projects/my-proj-123/topics/gpuinfra-bake-a3-megagpu-8g-run:publish"
    with ReplayServer([("POST", path, None, {"messageIds": ["17"]})]) as server:
        monkeypatch.setattr(
            gcp_api,
            "make_gcp_apis",
            lambda: gcp_api.GcpApis(AuthorizedSession(AnonymousCredentials()), server.url, server.url),
        )
        result = run_cli("up", "bake-a3-megagpu-8g", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert backend.calls == [("up", "bake-a3-megagpu-8g"), ("outputs", "bake-a3-megagpu-8g")]
    assert [(method, p) for method, p, _, _ in server.requests] == [("POST", path)]
    assert result.stdout.splitlines()[-2:] == [
        "started the Cloud Build bake (Pub/Sub message 17 on projects/my-proj-123/topics/gpuinfra-bake-a3-megagpu-8g-run); "
        "follow it: gcloud builds list --project my-proj-123 --limit 3",
        "when it has finished: gpuinfra image record bake-a3-megagpu-8g --from-outputs",
    ]


def test_the_first_up_creates_the_pulumi_stack_and_down_only_selects(monkeypatch, tmp_path):
    """`select_stack` "returns an error if the given Stack does not exist" (pulumi.automation
    Stack.select), so the first `up` must create the stack's state; destroy and outputs must not."""
    import shutil

    from pulumi import automation as auto

    from gpuinfra.lifecycle import PulumiAutomation

    calls = []

    class _Stack:
        def up(self, **kwargs):
            calls.append("up")

        def destroy(self, **kwargs):
            calls.append("destroy")

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/pulumi")
    monkeypatch.setattr(auto, "create_or_select_stack", lambda **kw: calls.append(("create_or_select", kw)) or _Stack())
    monkeypatch.setattr(auto, "select_stack", lambda **kw: calls.append(("select", kw)) or _Stack())
    backend = PulumiAutomation()
    backend.up(tmp_path, "s1", lambda event: None)
    backend.destroy(tmp_path, "s1", lambda event: None)
    assert calls == [
        ("create_or_select", {"stack_name": "s1", "work_dir": str(tmp_path)}),
        "up",
        ("select", {"stack_name": "s1", "work_dir": str(tmp_path)}),
        "destroy",
    ]
