"""The AWS bake stack under the offline preview: exact Image Builder resources, pinned values,
zero rule violations; the AWSTOE documents against their documented structure; every script
through shellcheck."""

from __future__ import annotations

import subprocess

import jsonschema
import pytest
import yaml

from gpuinfra.bake.preview import check_bake, run_bake_preview
from gpuinfra.bake.render import aws_host_phases, component_document, container_check_script, container_dockerfile
from gpuinfra.plan.fabric import efa_image_build
from tests.bake.awstoe_schema import SCHEMA
from tests.bake.conftest import AMI, NGC
from tests.blueprints.helpers import need_tool

IB = "aws:imagebuilder/"


@pytest.fixture(scope="module")
def preview(p5_bake):
    return run_bake_preview(p5_bake)


def test_exact_resources(preview):
    counts = {}
    for r in preview.resources:
        counts[r.type] = counts.get(r.type, 0) + 1
    assert counts == {
        "gpuinfra:aws:ImageBake": 1,
        "aws:iam/role:Role": 1,
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment": 2,
        "aws:iam/rolePolicy:RolePolicy": 1,
        "aws:iam/instanceProfile:InstanceProfile": 1,
        "aws:ecr/repository:Repository": 1,
        f"{IB}component:Component": 1,
        f"{IB}imageRecipe:ImageRecipe": 1,
        f"{IB}infrastructureConfiguration:InfrastructureConfiguration": 1,
        f"{IB}distributionConfiguration:DistributionConfiguration": 1,
        f"{IB}image:Image": 1,
        "aws:ec2/vpc:Vpc": 1,
        "aws:ec2/internetGateway:InternetGateway": 1,
        "aws:ec2/subnet:Subnet": 1,
        "aws:ec2/routeTable:RouteTable": 1,
        "aws:ec2/route:Route": 1,
        "aws:ec2/routeTableAssociation:RouteTableAssociation": 1,
        "aws:ec2/vpcEndpoint:VpcEndpoint": 1,
        "aws:ec2/securityGroup:SecurityGroup": 1,
        "aws:ec2/securityGroupRule:SecurityGroupRule": 2,
    }


def _one(preview, token):
    [record] = preview.of_type(token)
    return record


def test_build_runs_in_the_bakes_own_vpc(preview):
    """Image Builder without subnet_id/security_group_ids uses the default VPC (pulumi-aws
    InfrastructureConfiguration.subnet_id); the bake names its own."""
    vpc = _one(preview, "aws:ec2/vpc:Vpc")
    subnet = _one(preview, "aws:ec2/subnet:Subnet")
    group = _one(preview, "aws:ec2/securityGroup:SecurityGroup")
    infra = _one(preview, f"{IB}infrastructureConfiguration:InfrastructureConfiguration").inputs
    assert infra["subnetId"] == f"{subnet.name}-id" and infra["securityGroupIds"] == [f"{group.name}-id"]
    assert subnet.inputs["vpcId"] == group.inputs["vpcId"] == f"{vpc.name}-id"
    route = _one(preview, "aws:ec2/route:Route").inputs
    igw = _one(preview, "aws:ec2/internetGateway:InternetGateway")
    assert route["gatewayId"] == f"{igw.name}-id" and igw.inputs["vpcId"] == f"{vpc.name}-id"
    association = _one(preview, "aws:ec2/routeTableAssociation:RouteTableAssociation").inputs
    assert association["subnetId"] == f"{subnet.name}-id"


def test_build_instance_accepts_no_inbound_connection(preview):
    """The subnet gives the instance a public IPv4 for its downloads (blueprints/aws/bake.py
    build_network says why not a NAT gateway); nothing may connect to it: the security group has
    no inbound rule, inline or separate, and only TCP 443/80 out."""
    group = _one(preview, "aws:ec2/securityGroup:SecurityGroup")
    assert not group.inputs.get("ingress")
    rules = [r.inputs for r in preview.of_type("aws:ec2/securityGroupRule:SecurityGroupRule")]
    assert {r["type"] for r in rules} == {"egress"}
    assert sorted((r["protocol"], r["fromPort"], r["toPort"]) for r in rules) == [("tcp", 80, 80), ("tcp", 443, 443)]
    assert all(r["securityGroupId"] == f"{group.name}-id" for r in rules)


def test_zero_conformance_and_provider_value_violations(preview):
    assert check_bake(preview.resources) == []


def test_pinned_values(preview, p5_bake):
    recipe = preview.of_type(f"{IB}imageRecipe:ImageRecipe")[0].inputs
    assert recipe["parentImage"] == AMI
    assert recipe["blockDeviceMappings"][0]["ebs"]["volumeType"] == "gp3"
    # no container recipe: its parent may only be a managed, ECR or Docker Hub image, not nvcr.io
    assert not preview.of_type(f"{IB}containerRecipe:ContainerRecipe")
    parameter = recipe["components"][0]["parameters"][0]
    assert parameter == {
        "name": "ContainerImage",
        "value": f"123456789012.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/bake-p5:bake-{p5_bake.manifest.sha256[:12]}",
    }
    host = preview.of_type(f"{IB}component:Component")[0].inputs["data"]
    assert "ARG EFA_INSTALLER_VERSION=1.43.2" in host and f"FROM {NGC}" in host
    infra = preview.of_type(f"{IB}infrastructureConfiguration:InfrastructureConfiguration")[0].inputs
    assert infra["instanceTypes"] == ["m7i.large"]
    assert infra["instanceMetadataOptions"] == {"httpTokens": "required", "httpPutResponseHopLimit": 1}
    assert infra["terminateInstanceOnFailure"] is True
    repo = preview.of_type("aws:ecr/repository:Repository")[0].inputs
    assert repo["imageTagMutability"] == "IMMUTABLE" and repo["name"] == "gpuinfra/bake-p5"
    dist = preview.of_type(f"{IB}distributionConfiguration:DistributionConfiguration")[0].inputs
    ami_tags = dist["distributions"][0]["amiDistributionConfiguration"]["amiTags"]
    assert ami_tags["gpuinfra:bake:base_image"] == AMI and ami_tags["gpuinfra:bake:sha256"] == p5_bake.manifest.sha256
    attached = {r.inputs["policyArn"] for r in preview.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attached == {
        "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
    }


def test_container_dockerfile_is_the_boot_paths_plus_the_manifest(p5_bake):
    boot = efa_image_build(NGC).dockerfile
    baked = container_dockerfile(p5_bake)
    assert baked == boot.rstrip("\n") + "\nCOPY gpuinfra-manifest.json /etc/gpuinfra/bake-manifest.json\n"
    assert "{{" not in baked  # AWSTOE would substitute it


def _documents(spec):
    return [component_document("host", "h", aws_host_phases(spec), {"ContainerImage": "uri"})]


def test_component_documents_match_the_documented_schema(p5_bake, preview):
    for text in _documents(p5_bake) + [r.inputs["data"] for r in preview.of_type(f"{IB}component:Component")]:
        jsonschema.validate(yaml.safe_load(text), SCHEMA)
    host = yaml.safe_load(_documents(p5_bake)[0])
    assert [s["name"] for s in host["phases"][0]["steps"]] == ["BuildTrainingContainer", "WriteManifest"]
    assert [s["name"] for s in host["phases"][1]["steps"]] == ["CheckImage", "CheckContainer"]
    build = host["phases"][0]["steps"][0]
    assert (build["maxAttempts"], build["timeoutSeconds"]) == (3, 7200)
    check = host["phases"][1]["steps"][0]["inputs"]["commands"][0]
    assert "branch=580" in check and "/opt/amazon/efa_installed_packages" in check
    inside = host["phases"][1]["steps"][1]["inputs"]["commands"][0]
    assert "docker run --rm --entrypoint /bin/bash '{{ ContainerImage }}' -c" in inside
    assert "/opt/amazon/ofi-nccl" in inside and "/etc/gpuinfra/bake-manifest.json" in inside


@pytest.mark.tools
def test_every_script_passes_shellcheck(p5_bake, tmp_path):
    shellcheck = need_tool("shellcheck")
    scripts = [
        cmd
        for text in _documents(p5_bake)
        for phase in yaml.safe_load(text)["phases"]
        for step in phase["steps"]
        if step["action"] == "ExecuteBash"
        for cmd in step["inputs"]["commands"]
    ]
    assert len(scripts) == 4
    scripts.append(container_check_script(p5_bake, 1))  # run inside the container by CheckContainer
    for index, script in enumerate(scripts):
        path = tmp_path / f"s{index}.sh"
        path.write_text(
            script.replace("{{ ContainerImage }}", "1.dkr.ecr.us-east-1.amazonaws.com/gpuinfra/bake-p5:bake-0")
        )
        result = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, script + result.stdout


@pytest.mark.parametrize("family", ["p5", "p4d", "g5", "g6e"])
def test_every_component_fits_image_builders_inline_data_limit(family):
    """CreateComponent ``data``: "Length Constraints: Minimum length of 1. Maximum length of
    16000" (docs.aws.amazon.com/imagebuilder/latest/APIReference/API_CreateComponent.html)."""
    from gpuinfra.bake.plan import plan_bake
    from gpuinfra.catalog.store import load_catalog
    from tests.bake.conftest import DLVM_FAMILY, aws_request

    spec = plan_bake(aws_request(family=family), load_catalog().facts, DLVM_FAMILY)
    [component] = run_bake_preview(spec).of_type(f"{IB}component:Component")
    assert 0 < len(component.inputs["data"]) <= 16000
