"""Clusters booted from a baked image (``gpuinfra new --image baked:<name>``): the node identity
may pull from the bake's own repository only (exact IAM documents and bindings), Docker is
logged in to it on the node, and the scratch unit leaves Docker's image store where the bake
put it. The bake's recipe maps its root volume on the base AMI's own root device."""

from __future__ import annotations

import json

import pytest

from gpuinfra.bake.preview import run_bake_preview
from gpuinfra.plan.aws import plan_aws_cluster
from gpuinfra.plan.boot import REGISTRY_LOGIN_UNIT
from gpuinfra.plan.boot_aws import aws_node_boot
from gpuinfra.plan.boot_gcp import gcp_node_boot
from gpuinfra.plan.gcp import plan_gcp_cluster
from gpuinfra.preview import PreviewMocks, run_program
from gpuinfra.spec import BakedImageRef
from tests.blueprints.helpers import make_spec, preview

ECR_ARN = "arn:aws:ecr:us-east-1:123456789012:repository/gpuinfra/bake-p4d"
ECR_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/bake-p4d@sha256:" + "b" * 64
AR_REPO = "projects/my-proj-123/locations/us-central1/repositories/gpuinfra-bake-a3"
AMI = "ami-0fedcba9876543210"


def aws_baked(**profile_updates):
    ref = BakedImageRef(bake="bake-p4d", region="us-east-1", root_snapshot_gib=200, container_repository=ECR_ARN)
    return make_spec(
        "p4d.24xlarge",
        nodes=2,
        ami_id=AMI,
        baked_image=ref,
        profile_updates={"container_image": ECR_IMAGE, **profile_updates},
    )


def gcp_baked():
    spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp", gcp_project="my-proj-123")
    ref = BakedImageRef(bake="bake-a3", region=spec.region, root_snapshot_gib=200, container_repository=AR_REPO)
    return type(spec).model_validate(
        {
            **spec.model_dump(),
            "gcp_image": "projects/my-proj-123/global/images/gpuinfra-bake-a3-1",
            "baked_image": ref.model_copy(
                update={
                    "container_repository": f"projects/my-proj-123/locations/{spec.region}/repositories/gpuinfra-bake-a3"
                }
            ),
        }
    )


def test_the_aws_node_role_pulls_from_the_bakes_repository_only():
    result = preview(aws_baked())
    policies = {r.name: json.loads(r.inputs["policy"]) for r in result.of_type("aws:iam/rolePolicy:RolePolicy")}
    assert policies["t-2-node-ecr"] == {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "EcrToken", "Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
            {
                "Sid": "PullBakeRepository",
                "Effect": "Allow",
                "Action": ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                "Resource": [ECR_ARN],
            },
        ],
    }
    # no ECR action anywhere else (no push, no other repository)
    others = [s for name, p in policies.items() if name != "t-2-node-ecr" for s in p["Statement"]]
    assert not [s for s in others if any(a.startswith("ecr:") for a in s["Action"])]


def test_a_stock_aws_cluster_gets_no_registry_permission_and_no_login():
    spec = make_spec("p4d.24xlarge", nodes=2)
    names = {r.name for r in preview(spec).of_type("aws:iam/rolePolicy:RolePolicy")}
    assert "t-2-node-ecr" not in names
    boot = aws_node_boot(spec, plan_aws_cluster(spec), "bucket")
    assert REGISTRY_LOGIN_UNIT not in {u.name for u in boot.units}
    scratch = next(f for f in boot.files if f.path.endswith("gpuinfra-scratch-raid0")).content
    assert 'DOCKER_CONFIG="$SYSROOT/etc/docker/daemon.json"' in scratch and "systemctl restart docker" in scratch


def test_the_aws_baked_node_logs_docker_in_to_ecr_and_keeps_its_image_store():
    spec = aws_baked()
    boot = aws_node_boot(spec, plan_aws_cluster(spec), "bucket")
    login = next(u for u in boot.units if u.name == REGISTRY_LOGIN_UNIT)
    text = login.render()
    assert (
        'ExecStart=/bin/sh -c \'p="$$(aws ecr get-login-password --region "$$1")" && printf %%s "$$p" | '
        '/usr/bin/docker login --username AWS --password-stdin "$$2"\' sh us-east-1 '
        "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    ) in text
    assert "Before=gpuinfra-prepull.service gpuinfra-image.service" in text
    assert "After=docker.service network-online.target gpuinfra-scratch.service" in text
    scratch = next(f for f in boot.files if f.path.endswith("gpuinfra-scratch-raid0")).content
    assert "daemon.json" not in scratch and "systemctl restart docker" not in scratch
    steps = [s.unit for s in boot.steps if s.unit]
    assert steps.index(REGISTRY_LOGIN_UNIT) > steps.index("gpuinfra-scratch.service")


def test_the_gcp_node_account_reads_the_bakes_repository_only_and_docker_uses_gcloud():
    spec = gcp_baked()
    result = preview(spec)
    bindings = result.of_type("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert [(b.name, {k: v for k, v in b.inputs.items() if k != "member"}) for b in bindings] == [
        (
            "t-2-nodes-registry-read",
            {
                "project": "my-proj-123",
                "location": spec.region,
                "repository": "gpuinfra-bake-a3",
                "role": "roles/artifactregistry.reader",
            },
        )
    ]
    assert bindings[0].inputs["member"].startswith("serviceAccount:")
    boot = gcp_node_boot(spec, plan_gcp_cluster(spec), "bucket")
    login = next(u for u in boot.units if u.name == REGISTRY_LOGIN_UNIT).render()
    assert (
        f"ExecStart=/bin/sh -c 'gcloud auth configure-docker \"$$1\" --quiet' sh {spec.region}-docker.pkg.dev"
    ) in login
    stock = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp", gcp_project="my-proj-123")
    assert not preview(stock).of_type("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember")


class _Al2023Base(PreviewMocks):
    """EC2 describing a base AMI whose root is /dev/xvda (Amazon Linux 2023 DLAMIs)."""

    asked: list = []

    def call_result(self, token, args):
        if token == "aws:ec2/getAmi:getAmi":
            self.asked.append(args)
            return {**super().call_result(token, args), "rootDeviceName": "/dev/xvda"}
        return super().call_result(token, args)


def test_the_bake_maps_its_root_volume_on_the_base_amis_own_root_device(p5_bake):
    from gpuinfra.bake.preview import bake_provider_config

    def program():
        from blueprints.program import build_bake

        return build_bake(p5_bake)

    mocks = _Al2023Base(p5_bake)
    config = {"gpuinfra:bake": json.dumps(p5_bake.to_config()), **bake_provider_config(p5_bake)}
    result = run_program(p5_bake.stack, mocks, config, program)
    recipe = result.of_type("aws:imagebuilder/imageRecipe:ImageRecipe")[0].inputs
    assert [(m["deviceName"], m["ebs"]["volumeSize"]) for m in recipe["blockDeviceMappings"]] == [("/dev/xvda", 200)]
    assert mocks.asked[-1]["filters"] == [{"name": "image-id", "values": [p5_bake.manifest.base_image]}]
    # the stock answer (the profiles' Ubuntu DLAMI)
    stock = run_bake_preview(p5_bake).of_type("aws:imagebuilder/imageRecipe:ImageRecipe")[0].inputs
    assert stock["blockDeviceMappings"][0]["deviceName"] == "/dev/sda1"


@pytest.mark.parametrize(
    "repository, host",
    [
        (ECR_ARN, "123456789012.dkr.ecr.us-east-1.amazonaws.com"),
        (AR_REPO, "us-central1-docker.pkg.dev"),
        (
            "arn:aws-cn:ecr:cn-north-1:123456789012:repository/gpuinfra/b",
            "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn",
        ),
        ("", ""),
    ],
)
def test_registry_host_of_a_repository(repository, host):
    ref = BakedImageRef(bake="b", region="us-east-1", root_snapshot_gib=200, container_repository=repository)
    assert ref.registry_host == host


@pytest.mark.parametrize(
    "repository",
    ["arn:aws:ecr:us-east-1:123:repository/x", "docker.io/library/x", "projects/p/locations/r/repositories/x; rm"],
)
def test_a_repository_that_is_neither_an_ecr_arn_nor_an_ar_path_is_refused(repository):
    with pytest.raises(ValueError):
        BakedImageRef(bake="b", region="us-east-1", root_snapshot_gib=200, container_repository=repository)


class _MotoEc2(PreviewMocks):
    """``getAmi`` answered from EC2 DescribeImages (moto), as the provider reads it."""

    def __init__(self, spec, ec2):
        super().__init__(spec)
        self.ec2 = ec2

    def call_result(self, token, args):
        if token == "aws:ec2/getAmi:getAmi":
            (wanted,) = args["filters"]
            (image,) = self.ec2.describe_images(Filters=[{"Name": wanted["name"], "Values": wanted["values"]}])[
                "Images"
            ]
            return {**super().call_result(token, args), "rootDeviceName": image["RootDeviceName"]}
        return super().call_result(token, args)


@pytest.mark.parametrize("root", ["/dev/xvda", "/dev/sda1"])  # Amazon Linux / Ubuntu DLAMIs
def test_the_bake_reads_its_root_device_from_ec2s_description_of_the_base(p5_bake, moto_url, monkeypatch, root):
    import boto3

    from gpuinfra.bake.preview import bake_provider_config

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_url)
    # one of the Deep Learning AMIs moto bundles (its copy of EC2's public images) with that root
    # (moto's RegisterImage keeps no RootDeviceName of its own)
    found = ec2.describe_images(
        Filters=[{"Name": "name", "Values": ["Deep Learning AMI*"]}, {"Name": "root-device-name", "Values": [root]}]
    )["Images"]
    base = sorted(i["ImageId"] for i in found)[0]
    spec = p5_bake.model_copy(update={"manifest": p5_bake.manifest.model_copy(update={"base_image": base})})

    def program():
        from blueprints.program import build_bake

        return build_bake(spec)

    config = {"gpuinfra:bake": json.dumps(spec.to_config()), **bake_provider_config(spec)}
    result = run_program(spec.stack, _MotoEc2(spec, ec2), config, program)
    recipe = result.of_type("aws:imagebuilder/imageRecipe:ImageRecipe")[0].inputs
    assert recipe["parentImage"] == base
    assert [(m["deviceName"], m["ebs"]["volumeSize"]) for m in recipe["blockDeviceMappings"]] == [(root, 200)]
