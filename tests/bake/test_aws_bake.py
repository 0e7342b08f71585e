"""The AWS bake stack under the offline preview: exact Image Builder resources, pinned values,
zero rule violations; the AWSTOE documents against their documented structure; every script
through shellcheck."""

from __future__ import annotations

import subprocess

import jsonschema
import pytest
import yaml

from blueprints.common.fabric import efa_image_build
from gpuinfra.bake.preview import check_bake, run_bake_preview
from gpuinfra.bake.render import aws_host_phases, component_document, container_dockerfile, container_phases
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
        "gpuinfra:aws:ImageBake": 1, "aws:iam/role:Role": 1, "aws:iam/rolePolicyAttachment:RolePolicyAttachment": 2,
        "aws:iam/rolePolicy:RolePolicy": 1, "aws:iam/instanceProfile:InstanceProfile": 1,
        "aws:ecr/repository:Repository": 1, f"{IB}component:Component": 2,
        f"{IB}containerRecipe:ContainerRecipe": 1, f"{IB}imageRecipe:ImageRecipe": 1,
        f"{IB}infrastructureConfiguration:InfrastructureConfiguration": 1,
        f"{IB}distributionConfiguration:DistributionConfiguration": 1, f"{IB}image:Image": 2,
    }


def test_zero_conformance_and_provider_value_violations(preview):
    assert check_bake(preview.resources) == []


def test_pinned_values(preview, p5_bake):
    recipe = preview.of_type(f"{IB}imageRecipe:ImageRecipe")[0].inputs
    assert recipe["parentImage"] == AMI
    assert recipe["blockDeviceMappings"][0]["ebs"]["volumeType"] == "gp3"
    container = preview.of_type(f"{IB}containerRecipe:ContainerRecipe")[0].inputs
    assert (container["containerType"], container["parentImage"]) == ("DOCKER", NGC)
    assert container["targetRepository"]["service"] == "ECR"
    assert "ARG EFA_INSTALLER_VERSION=1.43.2" in container["dockerfileTemplateData"]
    infra = preview.of_type(f"{IB}infrastructureConfiguration:InfrastructureConfiguration")[0].inputs
    assert infra["instanceTypes"] == ["m7i.large"] and infra["instanceMetadataOptions"]["httpTokens"] == "required"
    assert infra["terminateInstanceOnFailure"] is True
    repo = preview.of_type("aws:ecr/repository:Repository")[0].inputs
    assert repo["imageTagMutability"] == "IMMUTABLE" and repo["name"] == "gpuinfra/bake-p5"
    dist = preview.of_type(f"{IB}distributionConfiguration:DistributionConfiguration")[0].inputs
    ami_tags = dist["distributions"][0]["amiDistributionConfiguration"]["amiTags"]
    assert ami_tags["gpuinfra:bake:base_image"] == AMI and ami_tags["gpuinfra:bake:sha256"] == p5_bake.manifest.sha256
    attached = {r.inputs["policyArn"] for r in preview.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attached == {"arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
                        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"}


def test_container_dockerfile_is_the_boot_paths(p5_bake):
    boot = efa_image_build(NGC).dockerfile
    baked = container_dockerfile(p5_bake)
    assert baked.count("{{{ imagebuilder:parentImage }}}") == 1 and f"FROM {NGC}" not in baked
    assert [line for line in boot.splitlines() if not line.startswith("FROM ")] == [
        line for line in baked.splitlines() if "imagebuilder:" not in line]
    assert baked.rstrip().endswith("{{{ imagebuilder:components }}}")  # checks run after the EFA user space


def _documents(spec):
    return [component_document("host", "h", aws_host_phases(spec), {"ContainerImage": "uri"}),
            component_document("container", "c", container_phases(spec))]


def test_component_documents_match_the_documented_schema(p5_bake, preview):
    for text in _documents(p5_bake) + [r.inputs["data"] for r in preview.of_type(f"{IB}component:Component")]:
        jsonschema.validate(yaml.safe_load(text), SCHEMA)
    host = yaml.safe_load(_documents(p5_bake)[0])
    assert [s["name"] for s in host["phases"][0]["steps"]] == ["PullTrainingContainer", "WriteManifest"]
    assert [s["name"] for s in host["phases"][1]["steps"]] == ["CheckImage"]
    check = host["phases"][1]["steps"][0]["inputs"]["commands"][0]
    assert "branch=580" in check and "/opt/amazon/efa_installed_packages" in check


@pytest.mark.tools
def test_every_script_passes_shellcheck(p5_bake, tmp_path):
    shellcheck = need_tool("shellcheck")
    scripts = [cmd for text in _documents(p5_bake) for phase in yaml.safe_load(text)["phases"]
               for step in phase["steps"] if step["action"] == "ExecuteBash" for cmd in step["inputs"]["commands"]]
    assert len(scripts) == 5
    for index, script in enumerate(scripts):
        path = tmp_path / f"s{index}.sh"
        path.write_text(script.replace("{{ ContainerImage }}", "registry/repo@sha256:" + "c" * 64))
        result = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, script + result.stdout
