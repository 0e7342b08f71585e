"""GPU request grammar: accepted forms, aliases, and one error type for everything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuinfra.errors import RequestError
from gpuinfra.requests import GpuRequest, parse_gpu_spec, resolve_gpu_name


@pytest.mark.parametrize(
    ("spec", "gpu", "count"),
    [
        ("4xA100", "A100", 4),
        ("A100:4", "A100", 4),
        ("8xH100", "H100", 8),
        ("A100-80GB:8", "A100-80GB", 8),
        ("1xL4", "L4", 1),
        ("4Xa100", "A100", 4),  # case-insensitive
        ("a100-40gb:2", "A100", 2),  # alias of the 40 GB A100
        ("h100-80gb:8", "H100", 8),
        (" 2 x l40s ", "L40S", 2),  # blanks around parts
        ("8*H200", "H200", 8),
        ("T4", "T4", 1),  # bare model = one GPU
        ("v100-32gb:8", "V100-32GB", 8),
    ],
)
def test_accepted_forms(spec, gpu, count):
    assert parse_gpu_spec(spec) == GpuRequest(gpu=gpu, gpu_count=count, nodes=1)


def test_nodes_multiply_total_gpus():
    request = parse_gpu_spec("8xA100-80GB", nodes=8)
    assert (request.gpu_count, request.nodes, request.total_gpus) == (8, 8, 64)
    assert str(request) == "8xA100-80GB on 8 nodes"


def test_memory_variant_is_never_an_alias():
    assert resolve_gpu_name("A100") == "A100"
    assert resolve_gpu_name("A100-80GB") == "A100-80GB"
    assert resolve_gpu_name("V100") != resolve_gpu_name("V100-32GB")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("4x", "malformed GPU spec '4x'"),
        ("x4", "malformed GPU spec 'x4'"),
        ("A100:-1", "must be from 1 to 64 per node, got -1"),
        ("0xA100", "must be from 1 to 64 per node, got 0"),
        ("65xA100", "got 65"),
        ("4xZ100", "unknown GPU 'Z100'. Did you mean V100?"),
        ("4xA10", "Did you mean A10G or A100?"),
        ("", "empty GPU spec"),
        ("4:A100", "malformed"),
        ("４xA100", "malformed"),  # full-width digit is not ASCII
    ],
)
def test_rejected_forms(spec, fragment):
    with pytest.raises(RequestError) as info:
        parse_gpu_spec(spec)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_gpu_lists_known_models():
    with pytest.raises(RequestError, match=r"Known GPUs: B200, H200, H100, A100-80GB, A100, .*T4, P100, P4\."):
        parse_gpu_spec("4xZ100")


@pytest.mark.parametrize("nodes", [0, -1, 1_000_001, True, 1.5])
def test_bad_node_counts(nodes):
    with pytest.raises(RequestError, match="--nodes must be a whole number from 1 to 1,000 \\(aws: 1,000 instances"):
        parse_gpu_spec("4xA100", nodes=nodes)


@settings(max_examples=600, deadline=None)
@given(spec=st.text(max_size=40), nodes=st.integers(min_value=-10, max_value=2_000_000))
def test_parser_raises_only_its_own_error(spec, nodes):
    try:
        request = parse_gpu_spec(spec, nodes)
    except RequestError:
        return
    assert 1 <= request.gpu_count <= 64 and 1 <= request.nodes <= 1_000_000


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(min_value=-5, max_value=200),
    model=st.sampled_from(["A100", "a100-80gb", "H100", "l4", "Z9", "T4", ""]),
    sep=st.sampled_from(["x", "X", "*", ":", " x ", "-"]),
)
def test_parser_on_near_valid_input(count, model, sep):
    spec = f"{model}{sep}{count}" if sep == ":" else f"{count}{sep}{model}"
    try:
        request = parse_gpu_spec(spec)
    except RequestError:
        return
    assert request.gpu_count == count
