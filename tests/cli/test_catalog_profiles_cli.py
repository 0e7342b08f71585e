"""`gpuinfra catalog show` and `gpuinfra profiles`."""

from __future__ import annotations

import json

import pytest


def test_catalog_show_reports_source_and_date(run_cli):
    result = run_cli("catalog", "show", "--json")
    info = json.loads(result.stdout)
    assert info["catalog_date"] == "2026-11-22"
    assert info["path"].endswith("gpuinfra/catalog/data")
    # 5 GCP offers had only an undated spot price in a region the dated pricing.yml does not
    # price (a3-megagpu-8g us-central1 ...): no price left, no offer
    assert info["offers"]["aws"] == 1457 and info["offers"]["gcp"] == 2427
    assert "skypilot-catalog" in info["sources"]["aws"]["prices"]
    assert info["sources"]["gcp"]["date"].startswith("2026-08-20 (on-demand); 2026-07-30 (spot")
    assert "Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml" in info["sources"]["gcp"]["prices"]


def test_catalog_dir_env_with_missing_files_is_a_clear_error(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUINFRA_CATALOG_DIR", str(tmp_path))
    result = run_cli("offers", "--gpus", "4xA100")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: catalog folder {tmp_path} is incomplete: catalog.json is missing")


def test_profiles_lists_all_builtin_profiles(run_cli):
    data = json.loads(run_cli("profiles", "--json").stdout)
    names = [p["name"] for p in data]
    assert names == ["llm-pretrain", "llm-finetune", "lora-finetune", "qlora-finetune", "inference", "cv-train", "dev"]
    pretrain = data[0]
    assert pretrain["high_bandwidth_networking"] == "required" and pretrain["placement"] == "required"
    table = run_cli("profiles").stdout
    assert "qlora-finetune" in table and "forbidden" in table


def test_user_profiles_dir_overrides_and_validates(run_cli, tmp_path):
    (tmp_path / "team.yaml").write_text(
        "dev:\n  description: team dev box\n  placement: none\n  high_bandwidth_networking: 'off'\n"
        "  scratch: {required: false, min_gib: 0}\n"
        "  bucket: {versioning: true, scratch_prefix: scratch/, scratch_expiry_days: 1}\n"
        "  spot: {policy: allowed, checkpoint_interval_minutes: 0}\n  idle_timeout_minutes: 15\n"
        "  idle_gpu_utilization_percent: 1\n  ttl_hours: 4\n  root_disk_gib: 100\n"
        "  image: {aws_dlami_type: base-oss-nvidia-driver-gpu-ubuntu-22.04, gcp_image_family: common-cu128-ubuntu-2204-nvidia-570}\n"
        "  container_image: ''\n  default_run_hours: 2\n"
    )
    data = json.loads(run_cli("profiles", "--profiles-dir", str(tmp_path), "--json").stdout)
    dev = next(p for p in data if p["name"] == "dev")
    assert dev["idle_timeout_minutes"] == 15 and dev["ttl_hours"] == 4
    (tmp_path / "bad.yaml").write_text("broken:\n  placement: sometimes\n")
    result = run_cli("profiles", "--profiles-dir", str(tmp_path))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        f"error: profile 'broken' in {tmp_path / 'bad.yaml'}: field 'description': Field required;"
    )
    assert "field 'placement': Input should be 'required' or 'none'" in result.stderr


@pytest.mark.parametrize("args", [["--help"], ["offers", "--help"], ["new", "--help"], ["catalog", "--help"]])
def test_help_works(run_cli, args):
    result = run_cli(*args)
    assert result.exit_code == 0 and "Usage" in result.stdout
