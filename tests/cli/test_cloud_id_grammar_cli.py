"""The cloud resource ids a stack file may name (``ami_id``, ``network.vpc_id`` /
``network.subnet_id``, ``gcp_image``) follow the clouds' documented id forms; a hand-edited one
that does not is refused with one line naming the field, exit 2 (``gpuinfra preview``).

* EC2 ids: prefix, ``-``, 8 or 17 lowercase hex digits
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html);
* GCE images: ``projects/PROJECT/global/images/NAME`` or ``.../images/family/FAMILY``
  (https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert, ``sourceImage``),
  NAME / FAMILY GCE names (https://cloud.google.com/compute/docs/naming-resources).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from gpuinfra.errors import SpecError
from gpuinfra.spec import ClusterSpec
from gpuinfra.stackfile import read_stack_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"aws": "example-p5-2nodes", "gcp": "example-a3mega-2nodes"}

GOOD = [
    ("aws", ("ami_id",), "ami-0123abcd"),
    ("aws", ("ami_id",), "ami-0123456789abcdef0"),
    ("aws", ("network", "vpc_id"), "vpc-0123abcd"),
    ("aws", ("network", "subnet_id"), "subnet-0123456789abcdef0"),
    ("gcp", ("gcp_image",), "projects/my-proj-123/global/images/gpuinfra-bake-a3-1"),
    (
        "gcp",
        ("gcp_image",),
        "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570",
    ),
]
BAD = [
    ("aws", ("ami_id",), "ami-1", "is not an AMI id"),
    ("aws", ("ami_id",), "ami-0123456789ABCDEF0", "is not an AMI id"),  # upper case
    ("aws", ("ami_id",), "ami-0123456789abcdef01", "is not an AMI id"),  # 18 digits
    ("aws", ("ami_id",), "ami-0123abcd; reboot", "is not an AMI id"),
    ("aws", ("ami_id",), "subnet-0123abcd", "is not an AMI id"),
    ("aws", ("network", "vpc_id"), "vpc-0abc", "is not a vpc id"),
    ("aws", ("network", "vpc_id"), "subnet-0123abcd", "is not a vpc id"),
    ("aws", ("network", "subnet_id"), "subnet-xyz12345", "is not a subnet id"),
    ("aws", ("network", "subnet_id"), "subnet-0123abcd\n", "is not a subnet id"),
    ("gcp", ("gcp_image",), "my-image", "is not a GCE image"),
    ("gcp", ("gcp_image",), "projects/p/global/images/x", "is not a GCE image"),  # project too short
    ("gcp", ("gcp_image",), "projects/my-proj-123/global/images/Upper", "is not a GCE image"),
    ("gcp", ("gcp_image",), "projects/my-proj-123/global/images/family/", "is not a GCE image"),
    ("gcp", ("gcp_image",), "projects/my-proj-123/global/images/a/b", "is not a GCE image"),
    ("gcp", ("gcp_image",), "https://example.com/x.tar.gz", "is not a GCE image"),
]


def _config(cloud: str, path: tuple[str, ...], value: str) -> dict:
    config = copy.deepcopy(read_stack_spec(ROOT, EXAMPLES[cloud]).to_config())
    if path == ("network", "vpc_id") or path == ("network", "subnet_id"):  # they go together
        config.setdefault("network", {}).update(vpc_id="vpc-0123abcd", subnet_id="subnet-0123abcd")
    target = config
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return config


@pytest.mark.parametrize(("cloud", "path", "value"), GOOD)
def test_a_documented_id_is_taken(cloud, path, value):
    spec = ClusterSpec.from_config(_config(cloud, path, value))
    target = spec
    for key in path:
        target = getattr(target, key)
    assert target == value


@pytest.mark.parametrize(("cloud", "path", "value", "message"), BAD)
def test_another_id_is_refused_with_one_line_naming_the_field(cloud, path, value, message):
    with pytest.raises(SpecError) as refused:
        ClusterSpec.from_config(_config(cloud, path, value))
    text = str(refused.value)
    assert "\n" not in text and message in text and f"gpuinfra:cluster.{'.'.join(path)}" in text, text


@pytest.mark.parametrize(("cloud", "path", "value", "message"), [BAD[0], BAD[5], BAD[9]])
def test_preview_of_a_hand_edited_id_exits_2(run_cli, tmp_path, cloud, path, value, message):
    new = ("new", "--instance-type", "g5.xlarge", "--profile", "dev", "--name", "s1")
    if cloud == "gcp":
        new = ("new", "--gpus", "1xL4", "--cloud", "gcp", "--name", "s1")
    assert run_cli(*new, "--project-dir", str(tmp_path)).exit_code == 0
    stack_file = tmp_path / "stacks" / "Pulumi.s1.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    cluster = doc["config"]["gpuinfra:cluster"]
    if path[0] == "network":
        cluster["network"].update(vpc_id="vpc-0123abcd", subnet_id="subnet-0123abcd")
        cluster["network"][path[1]] = value
    else:
        cluster[path[0]] = value
    stack_file.write_text(yaml.safe_dump(doc))
    refused = run_cli("preview", "s1", "--project-dir", str(tmp_path))
    assert refused.exit_code == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith("error: gpuinfra:cluster.") and message in refused.stderr
