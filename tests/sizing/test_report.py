"""gpuinfra.sizing.report: the `gpuinfra size` document and sizing for `gpuinfra new --model`."""

from __future__ import annotations

import pytest

from gpuinfra.errors import NoOfferError, SizingError
from gpuinfra.sizing.recommend import sizing_request
from gpuinfra.sizing.report import size_document, size_for_stack


def test_sizing_request_fills_the_methods_defaults():
    req = sizing_request(model="llama-3.1-8b", method="lora")
    # micro-batch None: the layout takes the largest that fits; inference runs one sequence;
    # no recompute (HF TrainingArguments gradient_checkpointing=False), full where that does not fit
    assert (req.shape.name, req.strategy, req.recompute, req.seq, req.batch, req.tokens) == (
        "llama-3.1-8b",
        "ddp",
        "none",
        2048,
        None,
        None,
    )
    assert req.recompute_fallback and not sizing_request(model="llama-3.1-8b", recompute="none").recompute_fallback
    assert sizing_request(model="llama-3.1-8b", method="inference").batch == 1
    assert sizing_request(params="7B", tokens="2T").tokens == 2e12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give exactly one of --model NAME or --params COUNT"),
        ({"model": "llama-3.1-8b", "params": "7B"}, "give exactly one of --model NAME or --params COUNT"),
        ({"params": "7X"}, "--params must look like 7B"),
        ({"params": "7B", "tokens": "lots"}, "--tokens must look like 7B"),
    ],
)
def test_sizing_request_refuses(kwargs, message):
    with pytest.raises(SizingError, match=message):
        sizing_request(**kwargs)


def test_size_document_prices_a_given_configuration():
    # 1.3B pretrain on 26B tokens on one p5.48xlarge: FSDP over NVLink hides behind compute, so
    # the predicted MFU is that of Llama 3's H100 runs (38-43%, arXiv:2407.21783 Table 4)
    doc = size_document(sizing_request(params="1.3B", method="pretrain", tokens="26B"), gpus="8xH100")
    assert (doc["gpus"], doc["nodes"], doc["fits"], doc["communication_hours"]) == ("8xH100", 1, True, 0.0)
    assert 0.38 <= doc["mfu"] <= 0.43 and doc["ranked_by"] == "run_cost_usd"
    assert "arXiv:2407.21783" in doc["mfu_source"]
    assert doc["price_per_hour_usd"] == "55.040000"
    assert abs(float(doc["run_cost_usd"]) / (55.04 * doc["training_hours"]) - 1) < 1e-3
    assert doc["recommendation"] == {
        "gpus": "8xH100",
        "nodes": 1,
        "cloud": "aws",
        "region": "us-east-1",
        "zone": "use1-az1",
        "instance_type": "p5.48xlarge",
        "market": "on-demand",
        "price_per_hour_usd": "55.040000",
    }
    names = {a["name"] for a in doc["assumptions"]}
    assert {"utilization", "nvlink_efficiency", "network_efficiency", "batch", "global_batch"} <= names
    costs = [float(c["run_cost_usd"]) for c in doc["candidates"]]
    assert costs == sorted(costs)  # ranked by cost to finish


def test_size_for_stack_picks_the_cheapest_fit_and_the_methods_profile():
    sized = size_for_stack("llama-3.1-8b", None, "qlora")
    assert (sized.gpus, sized.nodes, sized.profile) == ("1xL4", 1, "qlora-finetune")
    data = sized.to_json()
    # an L4 reports 22.03 GiB to PyTorch (gpus.json device_memory_gib), not EC2's 22.35
    assert (data["gpu_memory_gib"], data["method"], data["checkpoint_plan"]) == (22.03, "qlora", None)
    # NF4 + double quantization for the 6.98B block weights, bf16 for the 1.05B embedding + head,
    # fp32 LoRA adapters (their bf16 autocast copies live only in the forward pass; the peak is
    # the backward pass); the CUDA context measured on an H100 (memory.CUDA_CONTEXT_BYTES)
    assert data["breakdown"]["weights_gib"] == 5.361 and data["breakdown"]["cuda_context_gib"] == 1.26
    assert data["memory_per_gpu_gib"] * 1.1 <= 22.03
    assumed = {a["name"]: a["value"] for a in data["assumptions"]}
    # the largest micro-batch that fits the L4 (layout.MICRO_BATCHES) is 2
    assert (assumed["seq"], assumed["batch"], assumed["base_precision"]) == (2048, 2, "nf4-dq")
    assert size_for_stack(None, "7B").profile == "llm-finetune"  # method full by default


def test_precision_is_split_into_compute_and_base_storage():
    req = sizing_request(model="llama-3.1-8b", method="lora")
    assert (req.precision, req.base_precision, req.storage) == ("bf16", "bf16", "bf16")
    assert sizing_request(model="llama-3.1-8b", method="qlora").base_precision == "nf4-dq"
    assert sizing_request(model="llama-3.1-8b", method="lora", base_precision="int8").storage == "int8"
    with pytest.raises(
        SizingError,
        match="--precision for --method lora must be one of bf16, fp16, fp32 "
        r"\(the frozen base's storage is --base-precision\), got 'int8'",
    ):
        sizing_request(model="llama-3.1-8b", method="lora", precision="int8")
    with pytest.raises(SizingError, match="--base-precision applies to --method lora or qlora only"):
        sizing_request(model="llama-3.1-8b", method="full", base_precision="int8")


def test_sharded_multi_node_only_on_high_bandwidth_networks():
    # ZeRO-3 on 7.5B: without the flag, no multi-node candidate on a type without EFA/GPUDirect
    from gpuinfra.catalog.store import load_catalog
    from gpuinfra.sizing.supply import high_bandwidth_network

    catalog = load_catalog()
    for allow in (False, True):
        doc = size_document(
            sizing_request(params="7.5B", method="full", strategy="zero3", allow_slow_interconnect=allow),
            catalog=catalog,
        )
        multi = [c for c in doc["candidates"] if c["nodes"] > 1]
        slow = [c for c in multi if not high_bandwidth_network(catalog, c["cloud"], c["instance_type"])]
        assert bool(slow) == allow, (allow, multi)
    assert not high_bandwidth_network(catalog, "aws", "g6e.xlarge")  # EfaInfo absent
    assert high_bandwidth_network(catalog, "aws", "p5.48xlarge") and high_bandwidth_network(
        catalog, "gcp", "a3-megagpu-8g"
    )


def test_communication_time_over_the_node_network():
    # 70B ZeRO-3 on 2 x p5.48xlarge (3,200 Gbit/s of EFA per node): per micro-batch two
    # all-gathers of the 16-bit parameters and one reduce-scatter of the gradients, each 2P x 15/16
    # bytes (NCCL bus-bandwidth factor (n-1)/n, nccl-tests doc/PERFORMANCE.md) at 400 GB/s x the
    # 29.61/50 efficiency nccl-tests measured on 4 x p4dn (github.com/NVIDIA/nccl/issues/527)
    doc = size_document(
        sizing_request(params="70B", method="full", strategy="zero3", tokens="10B", tp=1, pp=1, batch=1),
        gpus="8xH100",
        nodes=2,
    )
    expected = 3 * 2 * 70e9 * 15 / 16 / (3200e9 / 8 * 29.61 / 50)
    assert abs(doc["time"]["data_parallel_seconds_per_step"] - expected) < 1e-3
    # the node's NICs, not a GPU's 1/8 share of them: the old model took 8 x as long
    assert expected < 3 * 2 * 70e9 * 15 / 16 / (3200e9 / 8 / 8) / 4
    exposed = doc["time"]["exposed_communication_seconds_per_step"]
    assert exposed == round(max(0.0, expected - doc["time"]["compute_seconds_per_step"]), 4)


def test_spot_checkpoint_plan():
    # 8B full fine-tune on one p5.48xlarge: 14 B x 8.03e9 per node; primary card 3200/32 = 100 Gbit/s
    doc = size_document(
        sizing_request(model="llama-3.1-8b", method="full", strategy="zero3"),
        gpus="8xH100",
        spot=True,
        interruptions_per_node_hour=0.1,
    )
    plan = doc["checkpoint_plan"]
    upload = 14 * 8.03e9 / (100e9 / 8)
    assert plan["checkpoint_gib_per_node"] == round(14 * 8.03e9 / 2**30, 2)
    assert plan["upload_seconds"] == round(upload, 1) and plan["notice_seconds"] == 120 and plan["fits_notice"] is True
    mtbi = 3600 / 0.1
    assert plan["interval_minutes"] == round(((2 * upload * mtbi) ** 0.5 - upload) / 60, 1)


def test_size_for_stack_when_nothing_fits():
    with pytest.raises(NoOfferError, match="no configuration in the catalog sold on-demand fits 900B params"):
        size_for_stack(None, "900B", "inference")
