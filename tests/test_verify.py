"""gpuinfra.verify: preview as validation."""

from __future__ import annotations

import pytest
import yaml

from gpuinfra.errors import RuleViolationError, SpecError
from gpuinfra.verify import verify_spec, verify_stack_file
from tests.blueprints.helpers import make_spec


def test_verified_preview_of_a_two_node_p4d_spec():
    verified = verify_spec(make_spec("p4d.24xlarge", nodes=2))
    doc = verified.to_json()
    assert set(doc) == {"stack", "resources", "outputs", "notes", "cost", "violations"} and doc["violations"] == []
    assert doc["stack"] == "t-2" and len(doc["resources"]) == len(verified.preview.resources)
    # + noncurrent checkpoint versions, at most the 500 GB bucket once more: 500 x $0.023 / 730 = $0.015753/h
    # + NAT data of 2 container pulls (15 GB each) and the 20 GB egress (no public IP on training
    #   nodes): 50 GB x $0.045 / 24 h = $0.09375/h
    assert verified.cost["hourly_usd"] == "44.433963" and verified.cost["hours"] == "24"


def test_a_spec_that_breaks_a_rule_is_refused():
    spec = make_spec("p4d.24xlarge", zone="use1-az9")  # no p4d offer in that AZ
    with pytest.raises(RuleViolationError, match="offered-in-zone: p4d.24xlarge is not offered in use1-az9"):
        verify_spec(spec)


def test_stack_file_is_read_then_verified(run_cli, tmp_path):
    assert (
        run_cli("new", "--instance-type", "p4d.24xlarge", "--name", "v", "--project-dir", str(tmp_path)).exit_code == 0
    )
    assert verify_stack_file(tmp_path, "v").spec.instance_type == "p4d.24xlarge"
    path = tmp_path / "stacks" / "Pulumi.v.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["nodes"] = 0
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError):
        verify_stack_file(tmp_path, "v")
