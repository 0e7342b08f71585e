"""`gpuinfra up` / `down` of a bake (gpuinfra.bake.deploy): the ECR digest looked up in moto on
127.0.0.1, the Pub/Sub publish and Compute images.list answered by a local server
speaking their documented REST API through google-auth's AuthorizedSession, what `down` leaves."""

from __future__ import annotations

import base64
import contextlib
import json

import boto3
import hcl2
import pytest
import yaml

from gpuinfra.bake import deploy
from gpuinfra.bake.deploy import deploy_bake, destroy_bake, record_from_outputs
from gpuinfra.bake.gcp_api import GcpApis
from gpuinfra.bake.render import packer_build
from gpuinfra.bake.stack import read_bake, write_bake_stack
from gpuinfra.errors import MissingDependencyError, OperationError
from tests.bake.test_gcp_bake import _plain
from tests.replay_server import ReplayServer

AMI = "ami-0fedcba9876543210"
PROJECT = "gpuinfra-test-1"


class Backend:
    """The Automation API boundary: records calls, answers with fixed outputs."""

    def __init__(self, outputs, changes=None):
        self.calls = []
        self._outputs = outputs
        self.changes = changes or {"create": 9}

    def up(self, project_dir, stack, on_event):
        self.calls.append(("up", stack))
        return self.changes

    def outputs(self, project_dir, stack):
        self.calls.append(("outputs", stack))
        return self._outputs

    def destroy(self, project_dir, stack, on_event):
        self.calls.append(("destroy", stack))
        return {"delete": 9}


@pytest.fixture
def ecr(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    client = boto3.client("ecr", region_name="us-east-1", endpoint_url=moto_url)
    with contextlib.suppress(client.exceptions.RepositoryNotFoundException):  # the moto server lives for the session
        client.delete_repository(repositoryName="gpuinfra/bake-p5", force=True)  # start from no repository
    return client


def _push(ecr, repository: str, tag: str, layer: str) -> str:
    """Put one image (one layer) under ``tag``; return the digest ECR reports for it."""
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
                "digest": "sha256:" + layer * 64,
            }
        ],
    }
    ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=tag)
    return ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])["imageDetails"][0][
        "imageDigest"
    ]


def test_aws_up_records_the_ami_and_the_container_by_digest(p5_bake, tmp_path, ecr):
    repository = f"gpuinfra/{p5_bake.stack}"
    uri = ecr.create_repository(repositoryName=repository)["repository"]["repositoryUri"]
    tag = f"bake-{p5_bake.manifest.sha256[:12]}"
    digest = _push(ecr, repository, tag, "d")
    other = _push(ecr, repository, "bake-000000000000", "e")  # an earlier bake's container
    assert digest != other and digest.startswith("sha256:") and len(digest) == 71
    write_bake_stack(p5_bake, tmp_path)
    backend = Backend({"image_id": AMI, "container_image": f"{uri}:{tag}", "record_command": "..."})

    done = deploy_bake(backend, tmp_path, p5_bake, lambda event: None)

    assert backend.calls == [("up", "bake-p5"), ("outputs", "bake-p5")]  # no TTL / node guards on a bake
    assert done.recorded and done.build_message_id is None
    assert uri == "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/bake-p5"
    stored = read_bake(tmp_path, "bake-p5").result
    assert (stored.image_id, stored.container_image) == (AMI, f"{uri}@{digest}")
    assert stored.root_snapshot_gib == p5_bake.build_volume_size_gib == 200  # the recipe's root volume
    assert done.lines == (
        f"recorded image {AMI}, container {uri}@{digest} in {tmp_path}/stacks/Pulumi.bake-p5.yaml",
        "use: gpuinfra new ... --image baked:bake-p5",
        "then: gpuinfra down bake-p5   (the bake's NAT gateway bills every hour its stack exists; "
        "the AMI and the ECR repository stay)",
    )


def test_aws_up_with_no_such_container_is_exit_7_and_records_nothing(p5_bake, tmp_path, ecr):
    repository = f"gpuinfra/{p5_bake.stack}"
    uri = ecr.create_repository(repositoryName=repository)["repository"]["repositoryUri"]
    write_bake_stack(p5_bake, tmp_path)
    before = (tmp_path / "stacks" / "Pulumi.bake-p5.yaml").read_text()
    backend = Backend({"image_id": AMI, "container_image": f"{uri}:bake-ffffffffffff"})
    with pytest.raises(OperationError) as raised:
        deploy_bake(backend, tmp_path, p5_bake, lambda event: None)
    assert raised.value.exit_code == 7
    assert str(raised.value) == (
        f"bake 'bake-p5' is built (image {AMI}), but recording it failed: looking up the digest of "
        f"{uri}:bake-ffffffffffff failed: ImageNotFoundException; fix that, then run "
        "`gpuinfra image record bake-p5 --from-outputs`"
    )
    assert (tmp_path / "stacks" / "Pulumi.bake-p5.yaml").read_text() == before


def test_ecr_lookup_errors_name_the_image(ecr):
    with pytest.raises(OperationError, match="RepositoryNotFoundException"):
        deploy.ecr_digest_reference(ecr, "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/none:bake-1")
    with pytest.raises(OperationError, match="is not an ECR URI with a tag"):
        deploy.ecr_digest_reference(ecr, "nvcr.io/nvidia/pytorch:25.01-py3")


def test_ecr_access_denied_is_exit_6():
    from botocore.exceptions import ClientError

    class Denied:
        def describe_images(self, **kwargs):
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "DescribeImages")

    with pytest.raises(MissingDependencyError, match="need ecr:DescribeImages") as raised:
        deploy.ecr_digest_reference(Denied(), "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/b:bake-1")
    assert raised.value.exit_code == 6


def test_an_unpinned_container_is_recorded_as_built_without_a_lookup(tmp_path):
    from gpuinfra.bake.plan import plan_bake
    from gpuinfra.catalog.store import load_catalog
    from tests.bake.conftest import DLVM_FAMILY, aws_request

    spec = plan_bake(
        aws_request(container_base="nvcr.io/nvidia/pytorch:25.01-py3", require_digest=False),
        load_catalog().facts,
        DLVM_FAMILY,
    )
    assert spec.manifest.container_pinned is False
    write_bake_stack(spec, tmp_path)
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/bake-p5:bake-0123456789ab"
    recorded = record_from_outputs(tmp_path, spec, {"image_id": AMI, "container_image": uri}, ecr=object())
    assert recorded.result.container_image == uri


# ----------------------------------------------------------------------------------- GCP
def _image_labels(spec) -> dict:
    """The labels the bake's Packer template puts on the image (what the build writes)."""
    build = packer_build(
        spec,
        "gb@p.iam.gserviceaccount.com",
        "us-central1-docker.pkg.dev/p/r/train:x",
        "us-central1-docker.pkg.dev",
        "projects/p/regions/us-central1/subnetworks/s",
    )
    return _plain(hcl2.loads(build.template))["source"][0]["googlecompute"]["gpuinfra"]["image_labels"]


def _apis(server) -> GcpApis:
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession

    return GcpApis(AuthorizedSession(AnonymousCredentials()), server.url, server.url)


GCP_OUTPUTS = {
    "image_family": f"projects/{PROJECT}/global/images/family/gpuinfra-bake-a3-megagpu-8g",
    "container_image": "us-central1-docker.pkg.dev/gpuinfra-test-1/gpuinfra-bake-a3-megagpu-8g/train:abc",
    "run_command": "gcloud pubsub topics publish gpuinfra-bake-a3-megagpu-8g-run --message=bake",
}
TOPIC_PATH = f"/v1/projects/{PROJECT}/topics/gpuinfra-bake-a3-megagpu-8g-run:publish"
IMAGES_PATH = f"/compute/v1/projects/{PROJECT}/global/images"
OWN = "gpuinfra-bake-a3-megagpu-8g--"  # this bake's image name prefix


def test_gcp_up_starts_one_build_through_pubsub(a3mega_bake, tmp_path):
    write_bake_stack(a3mega_bake, tmp_path)
    backend = Backend(GCP_OUTPUTS)
    with ReplayServer([("POST", TOPIC_PATH, None, {"messageIds": ["4242"]})]) as server:
        done = deploy_bake(backend, tmp_path, a3mega_bake, lambda event: None, gcp=_apis(server))
    assert backend.calls == [("up", "bake-a3-megagpu-8g"), ("outputs", "bake-a3-megagpu-8g")]
    assert [(m, path) for m, path, _, _ in server.requests] == [("POST", TOPIC_PATH)]
    body = json.loads(server.requests[0][3])
    assert body == {"messages": [{"data": "YmFrZQ=="}]} and base64.b64decode(body["messages"][0]["data"]) == b"bake"
    assert done.build_message_id == "4242" and not done.recorded
    assert done.lines == (
        f"started the Cloud Build bake (Pub/Sub message 4242 on projects/{PROJECT}/topics/gpuinfra-bake-a3-megagpu-8g-run); "
        f"follow it: gcloud builds list --project {PROJECT} --limit 3",
        "when it has finished: gpuinfra image record bake-a3-megagpu-8g --from-outputs",
    )


def test_gcp_up_of_an_unchanged_recorded_bake_starts_no_build(a3mega_bake, tmp_path):
    from gpuinfra.bake.model import BakeResult

    image = f"projects/{PROJECT}/global/images/gpuinfra-bake-a3-megagpu-8g-20261123t000000z"
    spec = a3mega_bake.model_copy(update={"result": BakeResult(image_id=image)})
    with ReplayServer([]) as server:
        done = deploy_bake(Backend(GCP_OUTPUTS, {"same": 17}), tmp_path, spec, lambda event: None, gcp=_apis(server))
    assert server.requests == [] and done.build_message_id is None
    assert done.lines[1] == (
        "to bake again: gcloud pubsub topics publish gpuinfra-bake-a3-megagpu-8g-run --project "
        f"{PROJECT} --message=bake, then when it has finished: gpuinfra image record "
        "bake-a3-megagpu-8g --from-outputs"
    )


def test_gcp_record_takes_the_newest_ready_image_of_this_manifest(a3mega_bake, tmp_path):
    write_bake_stack(a3mega_bake, tmp_path)
    name = OWN + "20261123t101500z"
    answer = {
        "kind": "compute#image",
        "name": name,
        "status": "READY",
        "family": "gpuinfra-bake-a3-megagpu-8g",
        "labels": _image_labels(a3mega_bake),
        "selfLink": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/images/{name}",
    }
    older = {**answer, "name": OWN + "20261122t101500z", "labels": {}}
    with ReplayServer([("GET", IMAGES_PATH, None, {"items": [older, answer]})]) as server:
        recorded = record_from_outputs(tmp_path, a3mega_bake, GCP_OUTPUTS, gcp=_apis(server))
    [(method, path, _, _)] = server.requests
    assert path.startswith(IMAGES_PATH + "?") and "filter=family+%3D+%22gpuinfra-bake-a3-megagpu-8g%22" in path
    assert recorded.result.image_id == f"projects/{PROJECT}/global/images/{name}"
    assert read_bake(tmp_path, "bake-a3-megagpu-8g").result.image_id == recorded.result.image_id
    assert recorded.result.container_image == ""
    assert recorded.result.root_snapshot_gib is None  # the answer carried no diskSizeGb


def test_gcp_record_keeps_the_images_disk_size(a3mega_bake, tmp_path):
    # Compute REST Image.diskSizeGb is an int64, which JSON carries as a string
    write_bake_stack(a3mega_bake, tmp_path)
    name = OWN + "20261123t101500z"
    answer = {
        "name": name,
        "status": "READY",
        "diskSizeGb": "250",
        "labels": _image_labels(a3mega_bake),
    }
    with ReplayServer([("GET", IMAGES_PATH, None, {"items": [answer]})]) as server:
        recorded = record_from_outputs(tmp_path, a3mega_bake, GCP_OUTPUTS, gcp=_apis(server))
    assert (
        read_bake(tmp_path, "bake-a3-megagpu-8g").result.root_snapshot_gib == recorded.result.root_snapshot_gib == 250
    )


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"status": "PENDING"}, OperationError, "is PENDING, not READY"),
        ({"labels": {"gpuinfra-bake-sha256": "0" * 32}}, OperationError, "was baked from another manifest"),
        # an image another account put into the family, named for another bake (or no bake)
        ({"name": "gpuinfra-bake-a3-megagpu-8g-2--20261124t000000z"}, OperationError, "has no image of family"),
        ({"name": "gpuinfra-bake-a3-megagpu-8g-20261124t000000z"}, OperationError, "has no image of family"),
        ({"deprecated": {"state": "DEPRECATED"}}, OperationError, "has no image of family"),
        (
            (
                404,
                {
                    "error": {
                        "code": 404,
                        "message": "The resource 'projects/gpuinfra-test-1' was not found",
                        "status": "NOT_FOUND",
                    }
                },
            ),
            OperationError,
            "failed (404 NOT_FOUND: The resource",
        ),
        (
            (
                403,
                {
                    "error": {
                        "code": 403,
                        "message": "Required 'compute.images.list' permission",
                        "status": "PERMISSION_DENIED",
                    }
                },
            ),
            MissingDependencyError,
            "was refused (403 PERMISSION_DENIED",
        ),
    ],
)
def test_gcp_record_refuses_what_is_not_this_bakes_finished_image(a3mega_bake, tmp_path, change, error, message):
    write_bake_stack(a3mega_bake, tmp_path)
    before = (tmp_path / "stacks" / "Pulumi.bake-a3-megagpu-8g.yaml").read_text()
    answer = {"name": OWN + "20261123t101500z", "status": "READY", "labels": _image_labels(a3mega_bake)}
    # (status, JSON body), or the list answer with the one image changed
    response = change if isinstance(change, tuple) else {"items": [{**answer, **change}]}
    with (
        ReplayServer([("GET", IMAGES_PATH, None, response)]) as server,
        pytest.raises(error, match=message.replace("(", r"\(")),
    ):
        record_from_outputs(tmp_path, a3mega_bake, GCP_OUTPUTS, gcp=_apis(server))
    assert (tmp_path / "stacks" / "Pulumi.bake-a3-megagpu-8g.yaml").read_text() == before


# ----------------------------------------------------------------------------------- down
def test_aws_down_keeps_the_ami_and_the_repository_and_names_the_clusters(p5_bake, tmp_path):
    write_bake_stack(p5_bake, tmp_path)
    cluster = tmp_path / "stacks" / "Pulumi.c1.yaml"
    cluster.write_text(
        yaml.safe_dump({"config": {"gpuinfra:cluster": {"ami_id": AMI}, "gpuinfra:image": {"image_id": AMI}}})
    )
    (tmp_path / "stacks" / "Pulumi.c2.yaml").write_text(
        yaml.safe_dump({"config": {"gpuinfra:cluster": {"ami_id": "ami-1"}}})
    )
    backend = Backend({"image_id": AMI, "container_image": "x"})
    done = destroy_bake(backend, tmp_path, p5_bake, lambda event: None)
    assert backend.calls == [("outputs", "bake-p5"), ("destroy", "bake-p5")]
    assert done.lines == [
        "kept (gpuinfra deletes no image; delete by hand once no cluster boots it):",
        f"  AMI {AMI} and its EBS snapshot(s) in us-east-1: deleting an Image Builder image does not deregister "
        "the AMI it made",
        f"    aws ec2 deregister-image --image-id {AMI} --delete-associated-snapshots --region us-east-1",
        "  ECR repository gpuinfra/bake-p5 and its container image(s): kept by the stack (retain on delete): "
        "cluster stacks made from the bake record the container by its digest there. A later `gpuinfra up` of this "
        "bake fails while it exists (ECR RepositoryAlreadyExistsException): delete it first, once no cluster needs it",
        "    aws ecr delete-repository --repository-name gpuinfra/bake-p5 --force --region us-east-1",
        "cluster stacks that boot this image: c1 (keep the image until `gpuinfra down` of each)",
        # 100 GB of EBS snapshot at $0.05/GB-month and 15 GB in ECR at $0.10/GB-month
        # (aws.amazon.com/ebs/pricing, aws.amazon.com/ecr/pricing; sizes estimated: README "What a bake costs")
        "left after down, per month: $6.50/month (AMI snapshot $5.00; ECR container $1.50; estimated sizes)",
    ]


def test_gcp_down_keeps_the_family_images(a3mega_bake, tmp_path):
    done = destroy_bake(Backend({}), tmp_path, a3mega_bake, lambda event: None)
    assert [item.commands for item in done.leftovers] == [
        (
            f"gcloud compute images list --project {PROJECT} --no-standard-images --filter=family=gpuinfra-bake-a3-megagpu-8g",
        )
    ]
    assert done.deleted == [
        "Artifact Registry repository gpuinfra-bake-a3-megagpu-8g in us-central1 with the container "
        "mirrored into it (clusters made from the bake do not use it: they run the profile's container)"
    ]
    assert done.clusters == []


def test_the_aws_bake_stack_retains_its_repository_on_destroy(p5_bake):
    """`down` says the repository stays, and it must: Image Builder's DeleteImage leaves the ECR
    image, so destroying a repository without force_delete fails (RepositoryNotEmptyException),
    and with force_delete the clusters' container would go."""
    from gpuinfra.bake.preview import run_bake_preview

    [repository] = run_bake_preview(p5_bake).of_type("aws:ecr/repository:Repository")
    assert repository.retain_on_delete is True and not repository.inputs.get("forceDelete")


def test_is_bake_stack(p5_bake, tmp_path):
    write_bake_stack(p5_bake, tmp_path)
    (tmp_path / "stacks" / "Pulumi.c.yaml").write_text("config:\n  gpuinfra:cluster: {}\n")
    (tmp_path / "stacks" / "Pulumi.bad.yaml").write_text("config: [\n")
    assert [deploy.is_bake_stack(tmp_path, n) for n in ("bake-p5", "c", "bad", "missing")] == [
        True,
        False,
        False,
        False,
    ]


def test_gcp_up_whose_publish_fails_says_the_trigger_is_there_and_how_to_start(a3mega_bake, tmp_path):
    write_bake_stack(a3mega_bake, tmp_path)
    missing = (
        404,
        {
            "error": {
                "code": 404,
                "message": "Resource not found (resource=gpuinfra-bake-a3-megagpu-8g-run).",
                "status": "NOT_FOUND",
            }
        },
    )
    with ReplayServer([("POST", TOPIC_PATH, None, missing)]) as server, pytest.raises(OperationError) as raised:
        deploy_bake(Backend(GCP_OUTPUTS), tmp_path, a3mega_bake, lambda event: None, gcp=_apis(server))
    assert str(raised.value) == (
        f"bake 'bake-a3-megagpu-8g' is deployed, but starting its build failed: publishing to projects/{PROJECT}/topics/"
        "gpuinfra-bake-a3-megagpu-8g-run failed (404 NOT_FOUND: Resource not found "
        "(resource=gpuinfra-bake-a3-megagpu-8g-run).); start it with `gcloud pubsub topics publish "
        f"gpuinfra-bake-a3-megagpu-8g-run --project {PROJECT} --message=bake`"
    )


def test_gcp_record_never_takes_an_image_planted_in_the_family(a3mega_bake, tmp_path):
    # Another bake's account (or anyone who may create images in the project) can put an image
    # into this bake's family and give it this manifest's label; only the name prefix, which the
    # build account's IAM condition keeps to this bake, tells this bake's images apart.
    write_bake_stack(a3mega_bake, tmp_path)
    labels = _image_labels(a3mega_bake)
    family = "gpuinfra-bake-a3-megagpu-8g"
    own = {"name": OWN + "20261123t101500z", "status": "READY", "family": family, "labels": labels}
    planted = {"name": "gpuinfra-bake-a3-megagpu-8g-2--20261125t000000z", "status": "READY", "family": family}
    planted |= {"labels": labels}
    newer_planted = {**planted, "name": "zz-" + OWN + "20261126t000000z"}  # sorts after OWN, not a prefix match
    pages = [
        # page 2 first: the replay server answers with the first route whose prefix matches
        ("GET", IMAGES_PATH + "?pageToken=p2", None, {"items": [newer_planted]}),
        ("GET", IMAGES_PATH, None, {"items": [planted, own], "nextPageToken": "p2"}),
    ]
    with ReplayServer(pages) as server:
        recorded = record_from_outputs(tmp_path, a3mega_bake, GCP_OUTPUTS, gcp=_apis(server))
    assert len(server.requests) == 2  # both pages read
    assert recorded.result.image_id == f"projects/{PROJECT}/global/images/{own['name']}"
