"""gpuinfra.sizing.report: the `gpuinfra size` document and sizing for `gpuinfra new --model`."""

from __future__ import annotations

import pytest

from gpuinfra.errors import NoOfferError, SizingError
from gpuinfra.sizing.recommend import sizing_request
from gpuinfra.sizing.report import size_document, size_for_stack


def test_sizing_request_fills_the_methods_defaults():
    req = sizing_request(model="llama-3.1-8b", method="lora")
    assert (req.shape.name, req.strategy, req.recompute, req.seq, req.batch, req.tokens) == (
        "llama-3.1-8b", "ddp", "full", 2048, 1, None)
    assert sizing_request(params="7B", tokens="2T").tokens == 2e12


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "give exactly one of --model NAME or --params COUNT"),
    ({"model": "llama-3.1-8b", "params": "7B"}, "give exactly one of --model NAME or --params COUNT"),
    ({"params": "7X"}, "--params must look like 7B"),
    ({"params": "7B", "tokens": "lots"}, "--tokens must look like 7B"),
])
def test_sizing_request_refuses(kwargs, message):
    with pytest.raises(SizingError, match=message):
        sizing_request(**kwargs)


def test_size_document_prices_a_given_configuration():
    # 1.3B pretrain on 26B tokens: 6*P*D / (8 x 989 TFLOP/s x MFU 0.40) = 17.80 h on p5.48xlarge at $55.04/h
    doc = size_document(sizing_request(params="1.3B", method="pretrain", tokens="26B"), gpus="8xH100")
    assert (doc["gpus"], doc["nodes"], doc["fits"], doc["training_hours"]) == ("8xH100", 1, True, 17.8)
    assert (doc["price_per_hour_usd"], doc["run_cost_usd"]) == ("55.040000", "979.710145")
    assert doc["recommendation"] == {"gpus": "8xH100", "nodes": 1, "cloud": "aws", "region": "us-east-1",
                                     "zone": "use1-az1", "instance_type": "p5.48xlarge", "price_per_hour_usd": "55.040000"}
    cheapest = doc["candidates"][0]
    assert (cheapest["gpus"], cheapest["instance_type"], cheapest["price_per_hour_usd"], cheapest["run_cost_usd"]) == (
        "1xL40S", "g6e.xlarge", "1.861000", "724.007827")


def test_size_for_stack_picks_the_cheapest_fit_and_the_methods_profile():
    sized = size_for_stack("llama-3.1-8b", None, "qlora")
    assert (sized.gpus, sized.nodes, sized.profile) == ("1xL4", 1, "qlora-finetune")
    assert sized.to_json() == {"memory_per_gpu_gib": 7.07, "gpu_memory_gib": 22.35, "method": "qlora",
                               "breakdown": {"weights_gib": 3.909, "gradients_gib": 0.051, "optimizer_gib": 0.102,
                                             "activations_gib": 1.51, "kv_cache_gib": 0.0, "overhead_gib": 1.5}}
    assert size_for_stack(None, "7B").profile == "llm-finetune"  # method full by default


def test_size_for_stack_when_nothing_fits():
    with pytest.raises(NoOfferError, match="no configuration in the catalog fits 900B params"):
        size_for_stack(None, "900B", "inference")
