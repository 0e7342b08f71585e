"""Rule ``node-values-grammar`` (gpuinfra/rules/node_values.py): a stack whose rendered user data
or startup script carries a value outside its grammar is refused by ``gpuinfra preview``'s rule
check and by the CrossGuard policy, whatever produced the text (faults are injected into the
real previews' resources)."""

from __future__ import annotations

import base64
import copy
import gzip

import pytest

from gpuinfra.plan.boot_aws import encode_user_data
from gpuinfra.rules import check_graph
from gpuinfra.rules.model import UNKNOWN, ResourceGraph
from gpuinfra.rules.node_values import RULE, aws_user_data_files, gcp_startup_files
from tests.blueprints.helpers import make_spec, preview

LT = "aws:ec2/launchTemplate:LaunchTemplate"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
IMAGE = "nvcr.io/nvidia/pytorch:24.07-py3"


@pytest.fixture(scope="module")
def aws_records():
    return preview(
        make_spec(
            "g5.12xlarge", nodes=2, profile_updates={"container_image": IMAGE, "high_bandwidth_networking": "off"}
        )
    ).resources


@pytest.fixture(scope="module")
def gcp_records():
    return preview(
        make_spec("a2-highgpu-4g", nodes=2, cloud="gcp", profile_updates={"container_image": IMAGE})
    ).resources


def _ours(records) -> list[str]:
    return [v.message for v in check_graph(ResourceGraph.from_records(records), {}) if v.rule == RULE]


def _user_data_text(records) -> str:
    lt = next(r for r in records if r.type == LT)
    return gzip.decompress(base64.b64decode(lt.inputs["userData"])).decode()


def _with_user_data(records, change):
    broken = copy.deepcopy(records)
    lt = next(r for r in broken if r.type == LT)
    lt.inputs["userData"] = encode_user_data(change(_user_data_text(records)))
    return broken


def _with_startup_script(records, change):
    broken = copy.deepcopy(records)
    template = next(r for r in broken if r.type == TEMPLATE)
    template.inputs["metadata"]["startup-script"] = change(template.inputs["metadata"]["startup-script"])
    return broken


def test_the_previews_conform_and_their_text_is_read(aws_records, gcp_records):
    assert _ours(aws_records) == [] and _ours(gcp_records) == []
    files, problems = aws_user_data_files(next(r for r in aws_records if r.type == LT).inputs["userData"])
    assert problems == [] and "GPUINFRA_STACK=t-2" in files["/etc/gpuinfra/node.env"]
    assert any(f"docker pull {IMAGE}" in text for text in files.values())
    script = next(r for r in gcp_records if r.type == TEMPLATE).inputs["metadata"]["startup-script"]
    assert "GPUINFRA_STACK=t-2" in gcp_startup_files(script)["/etc/gpuinfra/node.env"]


def test_a_cloud_config_key_gpuinfra_never_writes(aws_records):
    broken = _with_user_data(aws_records, lambda text: text + "bootcmd:\n- [touch, /tmp/PWNED]\n")
    assert _ours(broken) == ["cloud-config key 'bootcmd' is not one gpuinfra writes"]


def test_a_node_env_value_that_is_not_one_word(aws_records, gcp_records):
    evil = "GPUINFRA_STACK=t-2;touch /tmp/x"
    aws = _with_user_data(aws_records, lambda text: text.replace("GPUINFRA_STACK=t-2", evil))
    assert _ours(aws) == ["/etc/gpuinfra/node.env: GPUINFRA_STACK 't-2;touch /tmp/x' is not one plain word"]
    gcp = _with_startup_script(gcp_records, lambda text: text.replace("GPUINFRA_STACK=t-2", evil))
    assert _ours(gcp) == ["/etc/gpuinfra/node.env: GPUINFRA_STACK 't-2;touch /tmp/x' is not one plain word"]


def test_a_pull_of_something_that_is_not_an_image_reference(aws_records, gcp_records):
    evil = f"{IMAGE} && touch /tmp/x"
    for records, edit in ((aws_records, _with_user_data), (gcp_records, _with_startup_script)):
        found = _ours(edit(records, lambda text: text.replace(f"docker pull {IMAGE}", f"docker pull {evil}")))
        assert len(found) == 1 and "docker pull" in found[0] and "touch" in found[0], found


def test_a_stack_tag_outside_the_grammar(aws_records):
    broken = copy.deepcopy(aws_records)
    tagged = next(r for r in broken if isinstance(r.inputs.get("tags"), dict) and "gpuinfra:stack" in r.inputs["tags"])
    tagged.inputs["tags"]["gpuinfra:stack"] = "t-2 $(id)"
    assert _ours(broken) == ["tag gpuinfra:stack 't-2 $(id)' is not a stack name"]


def test_user_data_not_known_yet_is_skipped(aws_records):
    broken = copy.deepcopy(aws_records)
    next(r for r in broken if r.type == LT).inputs["userData"] = UNKNOWN
    assert _ours(broken) == []


def test_user_data_that_is_not_a_cloud_config(aws_records):
    broken = copy.deepcopy(aws_records)
    next(r for r in broken if r.type == LT).inputs["userData"] = "not base64!"
    assert _ours(broken) == ["user data is not a gzip/base64 cloud-config (Error)"]


def test_the_crossguard_policy_refuses_it(aws_records):
    pytest.importorskip("pulumi_policy")
    from tests.rules.test_policy_pack import _as_policy_resources, _run

    broken = _with_user_data(aws_records, lambda text: text + "bootcmd:\n- [touch, /tmp/PWNED]\n")
    found = _run("gpuinfra-cloud-rules", _as_policy_resources(broken, unknown_ids=False))
    assert [m for m, _ in found if m.startswith(RULE)] == [
        f"{RULE}: t-2-lt: cloud-config key 'bootcmd' is not one gpuinfra writes (source: "
        + next(m for m, _ in found if m.startswith(RULE)).split("(source: ", 1)[1]
    ]
    assert any(urn and urn.endswith("::t-2-lt") for _, urn in found)
