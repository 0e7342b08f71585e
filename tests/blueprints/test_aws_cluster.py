"""AwsGpuCluster under Pulumi mocks: exact resources and inputs per instance type."""

from __future__ import annotations

import base64
import gzip
import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest

from gpuinfra.errors import SpecError
from gpuinfra.preview import PreviewMocks
from tests.blueprints.helpers import make_spec, preview, shellcheck_cloud_config

LT = "aws:ec2/launchTemplate:LaunchTemplate"
FLEET = "aws:ec2/fleet:Fleet"
SUBNET = "aws:ec2/subnet:Subnet"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
PG = "aws:ec2/placementGroup:PlacementGroup"
GPUINFRA_TAGS = {"gpuinfra:stack", "gpuinfra:profile", "gpuinfra:expires-at"}


def _one(result, token):
    found = result.of_type(token)
    assert len(found) == 1, f"{token}: {len(found)}"
    return found[0].inputs


@pytest.mark.parametrize(
    ("itype", "nics", "types", "public_ip"),
    [
        ("g5.xlarge", 1, ["interface"], "true"),
        ("g6e.48xlarge", 4, ["efa"] + ["efa-only"] * 3, None),
        ("p4d.24xlarge", 4, ["efa"] + ["efa-only"] * 3, None),
        ("p5.48xlarge", 32, ["efa"] + ["efa-only"] * 31, None),
        ("p5en.48xlarge", 16, ["efa"] + ["efa-only"] * 15, None),
    ],
)
def test_network_interfaces_follow_the_efa_rules(itype, nics, types, public_ip):
    profile = "dev" if itype == "g5.xlarge" else "llm-finetune"
    result = preview(make_spec(itype, nodes=2, profile=profile))
    interfaces = _one(result, LT)["networkInterfaces"]
    assert len(interfaces) == nics
    assert [i["networkCardIndex"] for i in interfaces] == list(range(nics))  # each card once, 0..N-1
    assert [i["deviceIndex"] for i in interfaces] == [0] * nics
    assert [i["interfaceType"] for i in interfaces] == types
    assert interfaces[0]["interfaceType"] != "efa-only"  # never EFA-only as the primary
    assert [i.get("associatePublicIpAddress") for i in interfaces] == [public_ip] + [None] * (nics - 1)
    node_subnet = next(r for r in result.of_type(SUBNET) if r.name.endswith("-nodes"))
    assert {i["subnetId"] for i in interfaces} == {f"{node_subnet.name}-id"}


def test_two_node_p5_must_show():
    spec = make_spec("p5.48xlarge", nodes=2, profile="llm-pretrain")
    result = preview(spec)
    interfaces = _one(result, LT)["networkInterfaces"]
    efa = [i for i in interfaces if i["interfaceType"] in ("efa", "efa-only")]
    assert len(efa) == 32 and sorted(i["networkCardIndex"] for i in efa) == list(range(32))
    assert _one(result, PG)["strategy"] == "cluster"
    assert _one(result, LT)["placement"]["groupName"] == result.of_type(PG)[0].name
    rules = {(r.inputs["type"], r.inputs["protocol"], r.inputs.get("self", False)) for r in result.of_type(SG_RULE)}
    assert ("ingress", "-1", True) in rules and ("egress", "-1", True) in rules
    node_subnets = [r for r in result.of_type(SUBNET) if r.name.endswith("-nodes")]
    assert len(node_subnets) == 1 and node_subnets[0].inputs["availabilityZoneId"] == spec.zone
    assert all(r.inputs["availabilityZoneId"] == spec.zone for r in result.of_type(SUBNET))
    pab = _one(result, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(
        pab[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )


def test_security_group_rules_exactly():
    result = preview(make_spec("p4d.24xlarge", nodes=2))
    rules = sorted(
        (
            r.inputs["type"],
            r.inputs["protocol"],
            r.inputs["fromPort"],
            r.inputs["toPort"],
            r.inputs.get("self", False),
            tuple(r.inputs.get("cidrBlocks", [])),
        )
        for r in result.of_type(SG_RULE)
    )
    assert rules == [
        ("egress", "-1", 0, 0, False, ("0.0.0.0/0",)),
        ("egress", "-1", 0, 0, True, ()),
        ("ingress", "-1", 0, 0, True, ()),
    ]  # no SSH by default
    with_ssh = preview(make_spec("p4d.24xlarge", nodes=2, network={"ssh_cidr": "203.0.113.7/32"}))
    ssh = [r.inputs for r in with_ssh.of_type(SG_RULE) if r.inputs.get("fromPort") == 22]
    assert ssh == [{**ssh[0], "cidrBlocks": ["203.0.113.7/32"], "protocol": "tcp", "type": "ingress"}]


def test_single_interface_types_use_one_public_subnet_multi_card_types_a_nat():
    g5 = preview(make_spec("g5.xlarge", profile="dev"))
    assert [r.name for r in g5.of_type(SUBNET)] == ["t-1-nodes"]
    assert g5.of_type("aws:ec2/natGateway:NatGateway") == []
    p5 = preview(make_spec("p5.48xlarge", nodes=2))
    assert sorted(r.name for r in p5.of_type(SUBNET)) == ["t-2-nat", "t-2-nodes"]
    assert len(p5.of_type("aws:ec2/natGateway:NatGateway")) == 1
    default_routes = {r.name: r.inputs for r in p5.of_type("aws:ec2/route:Route")}
    assert default_routes["t-2-nodes-default"]["natGatewayId"] == "t-2-nat-gw-id"
    endpoint = _one(p5, "aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint["serviceName"] == "com.amazonaws.us-east-1.s3" and endpoint["vpcEndpointType"] == "Gateway"


def test_launch_template_imdsv2_root_disk_shutdown_and_tags():
    spec = make_spec("p4d.24xlarge", nodes=2)
    lt = _one(preview(spec), LT)
    assert lt["metadataOptions"]["httpTokens"] == "required"
    assert lt["metadataOptions"]["instanceMetadataTags"] == "enabled"
    assert lt["blockDeviceMappings"] == [
        {
            "deviceName": "/dev/sda1",
            "ebs": {
                "deleteOnTermination": "true",
                "encrypted": "true",
                "iops": 3000,
                "throughput": 125,
                "volumeSize": spec.profile.root_disk_gib,
                "volumeType": "gp3",
            },
        }
    ]
    assert lt["instanceInitiatedShutdownBehavior"] == "terminate"
    assert lt["imageId"] == "ami-0000000000preview"
    assert {t["resourceType"] for t in lt["tagSpecifications"]} == {"instance", "volume", "network-interface"}
    assert all(set(t["tags"]) >= GPUINFRA_TAGS for t in lt["tagSpecifications"])
    assert "instanceMarketOptions" not in lt  # the fleet chooses the market


def test_every_taggable_resource_carries_the_gpuinfra_tags():
    spec = make_spec("p5.48xlarge", nodes=2)
    result = preview(spec)
    taggable = {
        "aws:ec2/vpc:Vpc",
        "aws:ec2/subnet:Subnet",
        "aws:ec2/internetGateway:InternetGateway",
        "aws:ec2/routeTable:RouteTable",
        "aws:ec2/securityGroup:SecurityGroup",
        PG,
        LT,
        FLEET,
        "aws:s3/bucket:Bucket",
        "aws:iam/role:Role",
        "aws:iam/instanceProfile:InstanceProfile",
        "aws:ec2/eip:Eip",
        "aws:ec2/natGateway:NatGateway",
        "aws:ec2/vpcEndpoint:VpcEndpoint",
    }
    seen = set()
    for record in result.resources:
        if record.type in taggable:
            seen.add(record.type)
            tags = record.inputs["tags"]
            assert tags["gpuinfra:stack"] == spec.stack and tags["gpuinfra:profile"] == "llm-finetune"
            assert tags["gpuinfra:expires-at"] == "2026-11-25T01:00:00Z"  # created 2026-11-22T01:00Z + 72 h TTL
    assert seen == taggable


def test_bucket_settings():
    spec = make_spec("p4d.24xlarge", nodes=1)
    result = preview(spec)
    bucket = result.of_type("aws:s3/bucket:Bucket")[0]
    assert bucket.retain_on_delete is True and bucket.inputs["forceDestroy"] is False
    assert bucket.inputs["bucketPrefix"] == "gpuinfra-t-1-"
    sse = _one(result, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert sse["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    lifecycle = _one(result, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")["rules"]
    scratch = next(r for r in lifecycle if r["id"] == "expire-scratch")
    assert scratch["filter"]["prefix"] == "scratch/" and scratch["expiration"]["days"] == 7
    assert _one(result, "aws:s3/bucketVersioning:BucketVersioning")["versioningConfiguration"]["status"] == "Enabled"
    node_policy = next(r for r in result.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == "t-1-node-bucket")
    policy = json.loads(node_policy.inputs["policy"])
    resources = [
        r
        for s in policy["Statement"]
        if s["Effect"] == "Allow" and s["Action"][0].startswith("s3:")
        for r in s["Resource"]
    ]
    assert resources == [
        f"arn:aws:s3:::{bucket.inputs['bucketPrefix']}0000preview",
        f"arn:aws:s3:::{bucket.inputs['bucketPrefix']}0000preview/*",
    ]
    # Deny s3:* without TLS (docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html)
    tls = json.loads(_one(result, "aws:s3/bucketPolicy:BucketPolicy")["policy"])
    arn = f"arn:aws:s3:::{bucket.inputs['bucketPrefix']}0000preview"
    assert tls["Statement"] == [
        {
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [arn, f"{arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }
    ]
    deleting = preview(make_spec("p4d.24xlarge", delete_bucket_on_destroy=True)).of_type("aws:s3/bucket:Bucket")[0]
    assert deleting.retain_on_delete is False and deleting.inputs["forceDestroy"] is True


def test_spot_and_on_demand_fleets():
    spot = _one(preview(make_spec("p4d.24xlarge", nodes=4, spot=True)), FLEET)
    assert spot["type"] == "instant" and spot["terminateInstances"] is True
    assert spot["targetCapacitySpecification"] == {"defaultTargetCapacityType": "spot", "totalTargetCapacity": 4}
    assert spot["spotOptions"] == {
        "allocationStrategy": "price-capacity-optimized",
        "instanceInterruptionBehavior": "terminate",
        "minTargetCapacity": 4,
        "singleAvailabilityZone": True,
        "singleInstanceType": True,
    }
    assert "onDemandOptions" not in spot
    assert "overrides" not in spot["launchTemplateConfigs"][0]  # no max price set: none sent
    # a max price: MaxPrice per instance-hour on the override, MaxTotalPrice for all nodes
    # (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_SpotOptionsRequest.html)
    capped = _one(
        preview(make_spec("p4d.24xlarge", nodes=4, spot=True, spot_max_price_per_hour_usd=Decimal("9.1506"))), FLEET
    )
    assert capped["launchTemplateConfigs"][0]["overrides"] == [{"maxPrice": "9.1506"}]
    assert capped["spotOptions"]["maxTotalPrice"] == "36.6024"
    on_demand = _one(preview(make_spec("p4d.24xlarge", nodes=4)), FLEET)
    assert on_demand["targetCapacitySpecification"]["defaultTargetCapacityType"] == "on-demand"
    # the provider's spelling (pulumi_aws FleetOnDemandOptionsArgs: "Valid values: `lowestPrice`,
    # `prioritized`"); the EC2 API's "lowest-price" fails provider validation
    assert on_demand["onDemandOptions"] == {
        "allocationStrategy": "lowestPrice",
        "minTargetCapacity": 4,
        "singleAvailabilityZone": True,
        "singleInstanceType": True,
    }


def test_capacity_block_has_no_placement_group():
    spec = make_spec(
        "p5.48xlarge",
        nodes=2,
        capacity_reservation_id="cr-0123456789abcdef0",
        capacity_reservation_instance_count=2,
        capacity_block=True,
    )
    result = preview(spec)
    assert result.of_type(PG) == []
    lt = _one(result, LT)
    assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert (
        lt["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"]
        == "cr-0123456789abcdef0"
    )
    assert _one(result, FLEET)["targetCapacitySpecification"]["defaultTargetCapacityType"] == "capacity-block"


def test_targeted_reservation_uses_its_own_group():
    spec = make_spec(
        "p4d.24xlarge",
        nodes=2,
        capacity_reservation_id="cr-0123456789abcdef0",
        capacity_reservation_placement_group="odcr-pg",
    )
    result = preview(spec)
    assert result.of_type(PG) == []
    assert _one(result, LT)["placement"] == {"groupName": "odcr-pg"}


@pytest.mark.parametrize("itype", ["g5.xlarge", "g6e.48xlarge", "p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge"])
def test_resource_count_does_not_grow_with_nodes(itype):
    # placement required, so 1 node gets the placement group too; g5.xlarge has 232 GiB NVMe only
    updates = {"scratch": {"required": True, "min_gib": 200}}
    results = {n: preview(make_spec(itype, nodes=n, profile_updates=updates)) for n in (1, 8, 64)}
    counts = {n: len(r.resources) for n, r in results.items()}
    assert len(set(counts.values())) == 1, counts
    assert [
        r.of_type(FLEET)[0].inputs["targetCapacitySpecification"]["totalTargetCapacity"] for r in results.values()
    ] == [1, 8, 64]


def test_single_node_without_placement_requirement_has_no_group():
    assert preview(make_spec("g5.xlarge", profile="dev")).of_type(PG) == []
    assert len(preview(make_spec("g5.xlarge", nodes=2, profile="dev")).of_type(PG)) == 1


class _Recording(PreviewMocks):
    def __init__(self, spec, subnet_zone=None):
        super().__init__(spec)
        self.subnet_zone = subnet_zone

    def call_result(self, token, args):
        if token == "aws:ec2/getSubnet:getSubnet":
            return {"id": args["id"], "availabilityZoneId": self.subnet_zone, "vpcId": "vpc-0abc1234"}
        return super().call_result(token, args)


@pytest.mark.parametrize(
    ("spec_kwargs", "mocks", "message"),
    [
        (
            dict(itype="g5.xlarge", profile="dev", hbn="required"),
            None,
            "high-bandwidth-nics: profile 'dev' requires EFA, but g5.xlarge has no EFA",
        ),
        (
            dict(
                itype="p4d.24xlarge",
                nodes=4,
                capacity_reservation_id="cr-0123456789abcdef0",
                capacity_reservation_instance_count=2,
            ),
            None,
            "aws-capacity-reservation: nodes=4 but cr-0123456789abcdef0 holds 2 instances",
        ),
        (
            dict(
                itype="p4d.24xlarge",
                nodes=2,
                capacity_reservation_id="cr-0123456789abcdef0",
                capacity_reservation_instance_type="p5.48xlarge",
            ),
            None,
            "aws-capacity-reservation: cr-0123456789abcdef0 reserves p5.48xlarge, but the nodes are p4d.24xlarge",
        ),
        (
            dict(itype="g5.xlarge", profile="dev", capacity_reservation_id="cr-0123456789abcdef0", capacity_block=True),
            None,
            "provisioning-model-offered: g5.xlarge is not sold as capacity-block",
        ),
        (
            dict(itype="p4d.24xlarge", network={"vpc_id": "vpc-0abc1234", "subnet_id": "subnet-0abc1234"}),
            "use1-az9",
            "subnet subnet-0abc1234 is in use1-az9, but the cluster's zone is",
        ),
        (dict(itype="p4d.24xlarge", ami_type="no-such-dlami"), None, "does not resolve in us-east-1"),
    ],
)
def test_bad_input_fails_before_any_resource(spec_kwargs, mocks, message):
    kwargs = dict(spec_kwargs)
    itype = kwargs.pop("itype")
    nodes = kwargs.pop("nodes", 1)
    profile = kwargs.pop("profile", "llm-finetune")
    ami_type = kwargs.pop("ami_type", None)
    hbn = kwargs.pop("hbn", None)
    spec = make_spec(itype, nodes=nodes, profile=profile, **kwargs)
    if hbn:  # hand-edited stack file
        spec = type(spec).model_validate(
            {**spec.model_dump(), "profile": {**spec.profile.model_dump(), "high_bandwidth_networking": hbn}}
        )
    if ami_type:
        profile_obj = spec.profile.model_copy(
            update={"image": spec.profile.image.model_copy(update={"aws_dlami_type": ami_type})}
        )
        spec = spec.model_copy(update={"profile": profile_obj})
    recorder = _Recording(spec, subnet_zone=mocks) if mocks else PreviewMocks(spec)
    with pytest.raises(SpecError) as info:
        preview(spec, recorder)
    assert message in str(info.value)


class _AmiMocks(PreviewMocks):
    """EC2 describing an Amazon Linux AMI, whose root device is /dev/xvda."""

    asked: list = []

    def call_result(self, token, args):
        if token == "aws:ec2/getAmi:getAmi":
            self.asked.append(args)
            return {**super().call_result(token, args), "rootDeviceName": "/dev/xvda"}
        return super().call_result(token, args)


def test_root_volume_uses_the_amis_own_root_device():
    # an ami_id override whose root is /dev/xvda must not get a /dev/sda1 mapping
    spec = make_spec("p4d.24xlarge", nodes=2, ami_id="ami-0123456789abcdef0")
    mocks = _AmiMocks(spec)
    lt = _one(preview(spec, mocks), LT)
    assert lt["imageId"] == "ami-0123456789abcdef0"
    assert [m["deviceName"] for m in lt["blockDeviceMappings"]] == ["/dev/xvda"]
    assert mocks.asked[-1]["filters"] == [{"name": "image-id", "values": ["ami-0123456789abcdef0"]}]


def test_bad_input_registers_nothing(monkeypatch):
    from gpuinfra import preview as preview_module

    seen = []
    original = preview_module._make_monitor

    def spy(mocks, records, outputs):
        seen.append(records)
        return original(mocks, records, outputs)

    monkeypatch.setattr(preview_module, "_make_monitor", spy)
    spec = make_spec("g5.xlarge", nodes=2, profile="dev")
    spec = spec.model_copy(
        update={"profile": spec.profile.model_copy(update={"high_bandwidth_networking": "required"})}
    )
    with pytest.raises(SpecError):
        preview(spec)
    assert seen and seen[0] == []


def test_user_data_passes_cloud_init_schema_and_shellcheck(tmp_path):
    result = preview(make_spec("p5.48xlarge", nodes=2, profile="llm-pretrain"))
    text = gzip.decompress(base64.b64decode(_one(result, LT)["userData"])).decode()
    assert text.startswith("#cloud-config\n") and len(base64.b64decode(_one(result, LT)["userData"])) < 16 * 1024
    assert "DEVICE_GLOB='*NVMe_Instance_Storage*'" in text
    assert '/dev/disk/by-id/" -maxdepth 1 -name "$DEVICE_GLOB"' in text
    assert (
        "After=local-fs.target systemd-udev-settle.service dlami-nvme.service" in text
    )  # scratch after udev, reboot-safe
    assert "Before=docker.service containerd.service" in text
    assert 'bind_existing "/opt/dlami/nvme"' in text  # reuse the DLAMI's own instance-store mount
    assert (
        "EXPECTED_DISKS=8" in text
    )  # p5.48xlarge: 8 x 3840 GB instance-store NVMe (docs/sources/cluster-facts.md 3.6)
    assert "* hard memlock unlimited" in text and "FI_EFA_USE_HUGE_PAGE=0" in text
    # an EFA node builds its training image from the profile's image (node bundle): no plain pre-pull
    assert "docker pull" not in text and "gpuinfra-run" not in text.split("write_files:", 1)[1].split("runcmd:")[0]
    assert 'aws s3 cp --only-show-errors --region "$REGION" "$URL"' in text
    assert re.search(r"^ *URL=s3://gpuinfra-t-2-0000preview/gpuinfra/node-bundle-[0-9a-f]{64}\.json$", text, re.M)
    assert "NNODES=2" in text and "GPUINFRA_BUCKET=gpuinfra-t-2-0000preview" in text
    assert "GPUINFRA_HEALTH_GATE=enforce" in text
    shellcheck_cloud_config(text, tmp_path)


def test_user_data_pre_pulls_the_image_on_nodes_without_efa(tmp_path):
    text = gzip.decompress(
        base64.b64decode(_one(preview(make_spec("g5.xlarge", profile="dev")), LT)["userData"])
    ).decode()
    image = "nvcr.io/nvidia/pytorch:25.01-py3@sha256:96990c82825613c3bdeebb66675c7c91b0123f64a5895623316dc5b824e0d7a9"
    assert f"ExecStart=/usr/bin/docker pull {image}" in text
    # an image already in Docker's store (a baked AMI) is not pulled: the unit is skipped, not
    # failed (systemd.service ExecCondition: exit 1-254 skips the remaining commands)
    assert f"ExecCondition=/bin/sh -c '! /usr/bin/docker image inspect \"$$1\" >/dev/null 2>&1' sh {image}\n" in text


def test_user_data_without_container_image_or_efa(tmp_path):
    spec = make_spec("g5.xlarge", profile="dev")
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"container_image": ""})})
    text = gzip.decompress(base64.b64decode(_one(preview(spec), LT)["userData"])).decode()
    assert "docker pull" not in text and "FI_EFA" not in text
    shellcheck_cloud_config(text, tmp_path)


class _Peers(PreviewMocks):
    def call_result(self, token, args):
        if token == "aws:ec2/getInstances:getInstances":
            return {
                "ids": ["i-1", "i-2", "i-3"],
                "privateIps": ["10.0.0.100", "10.0.0.20", "10.0.1.5"],
                "publicIps": [],
                "ipv6Addresses": [],
                "id": "peers",
            }
        return super().call_result(token, args)


def test_rendezvous_endpoint_is_the_numerically_lowest_ip():
    # the nodes sort IPs numerically (sort -t . -k1,1n ...), so must the output
    spec = make_spec("p4d.24xlarge", nodes=3)
    result = preview(spec, _Peers(spec))
    assert result.outputs["private_ips"] == ["10.0.0.20", "10.0.0.100", "10.0.1.5"]
    assert result.outputs["torchrun_rendezvous_endpoint"] == "10.0.0.20:29500"


SCHEDULE = "aws:scheduler/schedule:Schedule"


def test_ttl_backstop_deletes_the_fleet_after_the_agent_had_its_turn():
    spec = make_spec("p5.48xlarge", nodes=2)
    result = preview(spec)
    schedule = _one(result, SCHEDULE)
    # TTL + 600 s: the agent's 300 s checkpoint-sync bound + a 300 s margin (gpuinfra/plan/backstop.py)
    at = (spec.expires_at + timedelta(seconds=600)).strftime("%Y-%m-%dT%H:%M:%S")
    assert schedule["scheduleExpression"] == f"at({at})" and schedule["scheduleExpressionTimezone"] == "UTC"
    assert schedule["flexibleTimeWindow"] == {"mode": "OFF"} and schedule["actionAfterCompletion"] == "NONE"
    target = schedule["target"]
    # universal target (docs.aws.amazon.com/scheduler/latest/UserGuide/managing-targets-universal.html);
    # DeleteFleets on an instant fleet terminates whatever instances it still has (EC2 API DeleteFleets)
    assert target["arn"] == "arn:aws:scheduler:::aws-sdk:ec2:deleteFleets"
    fleet_id = f"fleet-{spec.stack}-fleet-preview"
    assert json.loads(target["input"]) == {"FleetIds": [fleet_id], "TerminateInstances": True}
    assert target["retryPolicy"] == {"maximumEventAgeInSeconds": 86400, "maximumRetryAttempts": 185}
    role = next(r for r in result.of_type("aws:iam/role:Role") if r.name == f"{spec.stack}-backstop-role")
    assert target["roleArn"] == f"arn:aws:iam::123456789012:role/{spec.stack}-backstop-role"
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"] == [
        {
            "Effect": "Allow",
            "Principal": {"Service": "scheduler.amazonaws.com"},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"}},
        }
    ]
    policy = next(
        r for r in result.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == f"{spec.stack}-backstop-terminate"
    )
    assert json.loads(policy.inputs["policy"])["Statement"] == [
        {
            "Sid": "DeleteThisStacksFleet",
            "Effect": "Allow",
            "Action": "ec2:DeleteFleets",
            "Resource": f"arn:aws:ec2:{spec.region}:123456789012:fleet/{fleet_id}",
        },
        {
            "Sid": "TerminateThisStacksNodes",
            "Effect": "Allow",
            "Action": "ec2:TerminateInstances",
            "Resource": f"arn:aws:ec2:{spec.region}:123456789012:instance/*",
            # this stack's own id (name + suffix): a stack of the same name elsewhere is not terminated
            "Condition": {"StringEquals": {"aws:ResourceTag/gpuinfra:stack-id": f"{spec.stack}-{spec.name_suffix}"}},
        },
    ]
    assert result.outputs["instance_ids"] == ["i-preview0000", "i-preview0001"]
    assert result.outputs["ttl_backstop_at"] == f"at({at})"


def test_fleet_is_replaced_delete_first_and_a_resolved_ami_does_not_drift():
    result = preview(make_spec("p4d.24xlarge", nodes=2))
    fleet = result.of_type(FLEET)[0]
    # every input the provider would send to ModifyFleet (EC2 takes it only for `maintain` fleets:
    # docs.aws.amazon.com/AWSEC2/latest/APIReference/API_ModifyFleet.html) replaces the fleet, old one first;
    # the names must be real Fleet inputs as the engine sees them (camelCase), or the option does nothing
    from pulumi import _types
    from pulumi_aws.ec2 import FleetArgs

    assert set(fleet.replace_on_changes) <= set(_types.input_type_py_to_pulumi_names(FleetArgs).values())
    assert set(fleet.replace_on_changes) == {
        "launchTemplateConfigs",
        "targetCapacitySpecification",
        "terminateInstances",
        "excessCapacityTerminationPolicy",
        "context",
    }
    assert fleet.delete_before_replace is True
    assert result.of_type(LT)[0].ignore_changes == ("imageId",)
    pinned = preview(make_spec("p4d.24xlarge", nodes=2, ami_id="ami-0123456789abcdef0")).of_type(LT)[0]
    assert pinned.ignore_changes == () and pinned.inputs["imageId"] == "ami-0123456789abcdef0"


class _ShortFleet(PreviewMocks):
    """The provider's answer when EC2 found no capacity: an instant fleet with no instances."""

    def new_resource_state(self, typ, name, inputs):
        rid, state = super().new_resource_state(typ, name, inputs)
        if typ == FLEET:
            state["fleetInstanceSets"] = [{"instanceIds": ["i-0aaa"], "lifecycle": "on-demand"}] if self.one else []
        return rid, state


@pytest.mark.parametrize("launched", [0, 1])
def test_update_fails_when_the_fleet_launched_fewer_than_the_nodes(launched):
    from gpuinfra.errors import CapacityError
    from gpuinfra.preview import run_preview
    from gpuinfra.stackfile import provider_config

    spec = make_spec("p5.48xlarge", nodes=2)
    mocks = _ShortFleet(spec)
    mocks.one = bool(launched)
    with pytest.raises(
        CapacityError,
        match=rf"gpuinfra-capacity: the EC2 Fleet launched {launched} of 2 "
        r"p5.48xlarge instances in use1-az1",
    ):
        run_preview(spec, provider_config(spec), mocks)
