"""The AWS bake stack under the offline preview: exact Image Builder resources, pinned values,
zero rule violations; the AWSTOE documents against their documented structure; every script
through shellcheck."""

from __future__ import annotations

import json
import subprocess

import jsonschema
import pytest
import yaml

from gpuinfra.bake.preview import check_bake, run_bake_preview
from gpuinfra.bake.render import aws_host_phases, component_document, container_check_script, container_dockerfile
from gpuinfra.plan.fabric import efa_image_build
from tests.bake.awstoe_schema import SCHEMA
from tests.bake.conftest import AMI, NGC
from tests.blueprints.helpers import make_spec, need_tool
from tests.blueprints.helpers import preview as run_preview

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
        # the build subnet (private) and the NAT gateway's /28 (public), each with its route table
        "aws:ec2/subnet:Subnet": 2,
        "aws:ec2/routeTable:RouteTable": 2,
        "aws:ec2/route:Route": 2,
        "aws:ec2/routeTableAssociation:RouteTableAssociation": 2,
        "aws:ec2/eip:Eip": 1,
        "aws:ec2/natGateway:NatGateway": 1,
        "aws:ec2/vpcEndpoint:VpcEndpoint": 1,
        "aws:ec2/securityGroup:SecurityGroup": 1,
        "aws:ec2/securityGroupRule:SecurityGroupRule": 2,
    }


def _one(preview, token):
    [record] = preview.of_type(token)
    return record


def _by_name(preview, token):
    return {r.name: r.inputs for r in preview.of_type(token)}


def _build_subnet(preview):
    """The subnet the infrastructure configuration launches the build instance in."""
    infra = _one(preview, f"{IB}infrastructureConfiguration:InfrastructureConfiguration").inputs
    [subnet] = [r for r in preview.of_type("aws:ec2/subnet:Subnet") if f"{r.name}-id" == infra["subnetId"]]
    return subnet


def _default_route(preview, subnet_name):
    """The 0.0.0.0/0 route of the route table associated with ``subnet_name``."""
    [table_id] = [
        a["routeTableId"]
        for a in _by_name(preview, "aws:ec2/routeTableAssociation:RouteTableAssociation").values()
        if a["subnetId"] == f"{subnet_name}-id"
    ]
    [route] = [
        r
        for r in _by_name(preview, "aws:ec2/route:Route").values()
        if r["routeTableId"] == table_id and r["destinationCidrBlock"] == "0.0.0.0/0"
    ]
    return route


def test_build_runs_in_the_bakes_own_vpc(preview):
    """Image Builder without subnet_id/security_group_ids uses the default VPC (pulumi-aws
    InfrastructureConfiguration.subnet_id); the bake names its own subnet and group, in its own VPC."""
    vpc = _one(preview, "aws:ec2/vpc:Vpc")
    group = _one(preview, "aws:ec2/securityGroup:SecurityGroup")
    infra = _one(preview, f"{IB}infrastructureConfiguration:InfrastructureConfiguration").inputs
    subnet = _build_subnet(preview)
    assert infra["securityGroupIds"] == [f"{group.name}-id"]
    assert subnet.inputs["vpcId"] == group.inputs["vpcId"] == f"{vpc.name}-id"
    assert all(s.inputs["vpcId"] == f"{vpc.name}-id" for s in preview.of_type("aws:ec2/subnet:Subnet"))


def test_build_instance_gets_no_public_ip_and_egresses_through_the_nat_gateway(preview):
    """A private subnet (a public IPv4 only where a subnet maps one on launch, or an EIP /
    interface asks for one: docs.aws.amazon.com/vpc/latest/userguide/vpc-ip-addressing.html);
    its default route goes to a NAT gateway that sits in a subnet routed to the internet gateway,
    with the only Elastic IP of the stack (docs.aws.amazon.com/vpc/latest/userguide/vpc-nat-gateway.html)."""
    subnets = preview.of_type("aws:ec2/subnet:Subnet")
    assert subnets and not any(s.inputs.get("mapPublicIpOnLaunch") for s in subnets)
    assert not any(
        r.inputs.get("associatePublicIpAddress") for r in preview.resources
    )  # neither on the infrastructure configuration nor elsewhere
    assert not preview.of_type("aws:ec2/eipAssociation:EipAssociation")
    assert not preview.of_type("aws:ec2/instance:Instance")

    build = _build_subnet(preview)
    route = _default_route(preview, build.name)
    assert "gatewayId" not in route, "the build subnet must not route straight to the internet gateway"
    [nat] = [r for r in preview.of_type("aws:ec2/natGateway:NatGateway") if f"{r.name}-id" == route["natGatewayId"]]
    assert nat.inputs.get("connectivityType", "public") == "public"
    assert nat.inputs["subnetId"] != f"{build.name}-id"
    [eip] = preview.of_type("aws:ec2/eip:Eip")
    assert nat.inputs["allocationId"] == f"{eip.name}-id" and eip.inputs["domain"] == "vpc"
    igw = _one(preview, "aws:ec2/internetGateway:InternetGateway")
    nat_subnet = nat.inputs["subnetId"][: -len("-id")]
    assert _default_route(preview, nat_subnet)["gatewayId"] == f"{igw.name}-id"
    # the NAT subnet follows the build subnet's zone (one NAT gateway serves one zone)
    [nat_subnet_inputs] = [s.inputs for s in subnets if s.name == nat_subnet]
    assert nat_subnet_inputs["availabilityZoneId"] == f"<zone EC2 picks for {build.name}>"
    # S3 (AWSTOE, the AMI's snapshots) stays off the NAT: the gateway endpoint is on the build route table
    endpoint = _one(preview, "aws:ec2/vpcEndpoint:VpcEndpoint").inputs
    assert route["routeTableId"] in endpoint["routeTableIds"] and endpoint["vpcEndpointType"] == "Gateway"


def _nat_children(result, prefix):
    """The NAT egress children of a preview, by role, inputs without names and tags."""
    roles = ("nat", "nat-rt", "nat-default", "nat-rta", "nat-eip", "nat-gw")
    out = {}
    for r in result.resources:
        role = r.name[len(prefix) + 1 :] if r.name.startswith(prefix + "-") else None
        if role in roles:
            inputs = {k: v for k, v in r.inputs.items() if k not in ("tags", "tagsAll", "availabilityZoneId")}
            out[role] = (r.type, json.dumps(inputs, sort_keys=True).replace(prefix, "<name>"))
    return out


def test_nat_egress_is_the_clusters(preview):
    """The bake's NAT egress is the cluster's (blueprints.aws.network.nat_egress): a p5 cluster
    (multi-card nodes, egress ``nat``) previews the same children with the same inputs, up to
    names, tags and the zone."""
    spec = make_spec("p5.48xlarge", nodes=2)
    cluster = run_preview(spec)
    cluster_nat = _nat_children(cluster, spec.stack)
    assert len(cluster_nat) == 6
    assert _nat_children(preview, "bake-p5") == cluster_nat


def test_build_instance_accepts_no_inbound_connection(preview):
    """Nothing may connect to the build instance: the security group has no inbound rule,
    inline or separate, and only TCP 443/80 out (through the NAT gateway)."""
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


def test_image_waits_for_the_nat_route(p5_bake, monkeypatch):
    """Image Builder launches the build instance when the Image is created; without the NAT
    route in place the SSM agent cannot register and the build fails, so the Image depends on
    the NAT gateway, the build subnet's default route and its route table association, the NAT
    subnet's own route to the internet gateway and its association, and the S3 endpoint."""
    import pulumi_aws as aws

    seen = {}
    real = aws.imagebuilder.Image

    def spy(name, *args, opts=None, **kwargs):
        seen["depends_on"] = list(opts.depends_on or [])
        return real(name, *args, opts=opts, **kwargs)

    monkeypatch.setattr(aws.imagebuilder, "Image", spy)
    run_bake_preview(p5_bake)
    kinds = sorted(type(r).__name__ for r in seen["depends_on"])
    assert kinds == ["NatGateway", "Route", "Route", "RouteTableAssociation", "RouteTableAssociation", "VpcEndpoint"]
    routes = sorted(r._name for r in seen["depends_on"] if isinstance(r, aws.ec2.Route))
    assert routes == ["bake-p5-build-default", "bake-p5-nat-default"]  # the private way out and the NAT's own


def test_nat_gateway_and_its_address_wait_for_the_internet_gateway(p5_bake, monkeypatch):
    """A NAT gateway created before the VPC has an internet gateway attached fails
    (``Gateway.NotAttached``: EC2 API reference, NatGateway ``failureCode``): the Elastic IP and
    the gateway depend on the internet gateway, which no input of theirs references."""
    import pulumi_aws as aws

    seen = {}
    for kind in ("Eip", "NatGateway"):
        real = getattr(aws.ec2, kind)

        def spy(name, *args, opts=None, _real=real, _kind=kind, **kwargs):
            seen[_kind] = [type(r).__name__ for r in (opts.depends_on or [])]
            return _real(name, *args, opts=opts, **kwargs)

        monkeypatch.setattr(aws.ec2, kind, spy)
    run_bake_preview(p5_bake)
    assert seen == {"Eip": ["InternetGateway"], "NatGateway": ["InternetGateway"]}
