"""`gpuinfra size` and `gpuinfra new --model`."""

from __future__ import annotations

import json
from decimal import Decimal


def _size(run_cli, *args):
    result = run_cli("size", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_params_7b_full_fsdp_recommends_a_fitting_configuration(run_cli):
    doc = _size(run_cli, "--params", "7B", "--method", "full", "--strategy", "fsdp")
    assert doc["fits"] is True and doc["strategy"] == "fsdp"
    assert set(doc["breakdown"]) == {"weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "kv_cache_gib", "overhead_gib"}
    assert doc["memory_per_gpu_gib"] * 1.1 <= doc["gpu_memory_gib"]
    assert abs(sum(doc["breakdown"].values()) - doc["memory_per_gpu_gib"]) < 0.02
    rec = doc["recommendation"]
    assert rec["gpus"] == doc["gpus"] and rec["nodes"] == doc["nodes"]
    prices = [Decimal(c["price_per_hour_usd"]) for c in doc["candidates"]]
    assert prices == sorted(prices) and all(c["fits"] for c in doc["candidates"])
    new = run_cli("offers", "--gpus", rec["gpus"], "--nodes", str(rec["nodes"]), "--json")
    assert new.exit_code == 0  # the recommendation is a valid --gpus request


def test_checking_a_given_configuration_with_margin(run_cli):
    doc = _size(run_cli, "--model", "llama-3.1-70b", "--method", "full", "--gpus", "8xA100-80GB", "--nodes", "8")
    assert doc["total_gpus"] == 64 and doc["fits"] is True and doc["margin_gib"] > 0
    small = _size(run_cli, "--model", "llama-3.1-70b", "--method", "full", "--gpus", "1xA100-80GB")
    assert small["fits"] is False and small["margin_gib"] < 0
    assert small["recommendation"]["gpus"] != "1xA100-80GB"


def test_tokens_give_hours_and_cost(run_cli):
    doc = _size(run_cli, "--params", "1.3B", "--method", "pretrain", "--tokens", "26B", "--gpus", "8xH100")
    # 6*P*D with selective recompute, MFU 0.40, 989 TFLOP/s: 6*1.3e9*26e9 / (8*989e12*0.4*3600)
    expected = 6 * 1.3e9 * 26e9 / (8 * 989e12 * 0.40 * 3600)
    assert abs(doc["training_hours"] - round(expected, 2)) < 0.011 and doc["mfu"] == 0.4
    assert abs(Decimal(doc["run_cost_usd"]) - Decimal(doc["price_per_hour_usd"]) * Decimal(expected)) < Decimal("0.01")


def test_inference_has_kv_cache_and_no_gradients(run_cli):
    doc = _size(run_cli, "--model", "llama-3.1-8b", "--method", "inference", "--seq", "16384", "--batch", "4", "--gpus", "1xH100")
    assert doc["breakdown"]["gradients_gib"] == 0 and doc["breakdown"]["optimizer_gib"] == 0
    assert abs(doc["breakdown"]["kv_cache_gib"] - 4 * 2.0) < 0.01  # 2 GiB per 16k-token sequence (HF llama31 table)


def test_bad_sizing_input(run_cli):
    for args, message in [
        (["--method", "full"], "give exactly one of --model NAME or --params COUNT"),
        (["--params", "7B", "--method", "train"], "--method must be one of pretrain, full, lora, qlora, inference"),
        (["--params", "7B", "--strategy", "zero4"], "--strategy must be one of ddp, fsdp, zero1, zero2, zero3"),
        (["--params", "7X"], "--params must look like 7B"),
        (["--model", "gpt5"], "unknown model 'gpt5'"),
    ]:
        result = run_cli("size", *args)
        assert result.exit_code == 2 and result.stderr.startswith("error: ") and message in result.stderr


def test_new_with_model_and_method(run_cli, tmp_path):
    result = run_cli("new", "--model", "llama-3.1-8b", "--method", "qlora", "--project-dir", str(tmp_path), "--json")
    data = json.loads(result.stdout)
    assert data["profile"] == "qlora-finetune" and data["sizing"]["method"] == "qlora"
    assert data["sizing"]["memory_per_gpu_gib"] * 1.1 <= data["sizing"]["gpu_memory_gib"]
