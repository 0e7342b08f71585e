"""The pattern of a group's bulk-insert VM names, which ``down``'s sweep selects by (the nodes read
their peers by name, they list no VMs): every name :func:`gcp_bulk_instance_names` can give the group, at
any node count, and no other VM's name (a MIG member, another stack's VM that starts alike)."""

from __future__ import annotations

import re

import pytest

from gpuinfra.plan.naming import gcp_bulk_instance_names, gcp_bulk_name_pattern, gcp_group_name
from tests.blueprints.helpers import make_spec


def test_the_pattern_matches_every_bulk_name_and_nothing_else():
    spec = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp")
    group = gcp_group_name(spec)
    other = gcp_group_name(spec.model_copy(update={"name_suffix": "zz9zz9"}))
    pattern = re.compile(gcp_bulk_name_pattern(group))
    assert all(pattern.fullmatch(name) for name in gcp_bulk_instance_names(group, 1000))
    strangers = [
        f"{group}-x7q2",  # a MIG member: base name, '-', 4 random characters
        f"{group}-n0a1",
        f"{group}-n0001",
        f"{group}-n00",
        f"{group}x-n000",
        f"{group}-n000-2",
        f"{other}-n000",
        group,
    ]
    assert [name for name in strangers if pattern.fullmatch(name)] == []


def test_a_group_name_that_is_no_gce_name_is_refused():
    with pytest.raises(ValueError, match="only a-z 0-9"):
        gcp_bulk_name_pattern("g.*")
