"""What a stack keeps costing after `down`: the kept bucket, its noncurrent versions until the
planned expiry, nothing when the bucket goes with the stack, and no total without a price."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from gpuinfra.catalog.store import load_catalog
from gpuinfra.cli.cost import left_after_down_text
from gpuinfra.cost.estimate import estimate
from gpuinfra.cost.report import to_json
from tests.blueprints.helpers import make_spec, preview

#: S3 Standard, us-east-1, first 50 TB: $0.023 per GB-month (aws.amazon.com/s3/pricing).
S3_US_EAST_1 = Decimal("0.023")
#: Cloud Storage Standard, us-central1: $0.020 per GB-month (cloud.google.com/storage/pricing).
GCS_US_CENTRAL1 = Decimal("0.020")
USAGE = {"bucket_storage_gb": Decimal(5000), "internet_egress_gb": Decimal(0), "nat_processed_gb": Decimal(0)}


def _doc(spec, resources=None, region=None):
    resources = resources if resources is not None else preview(spec).resources
    est = estimate(resources, load_catalog(), region or spec.region, USAGE, Decimal(24))
    return to_json(est, spec.stack, Decimal(24), "", est.facts.market)["left_after_down"]


def test_aws_kept_bucket_costs_its_storage_and_noncurrent_versions_until_they_expire():
    block = _doc(make_spec("p5.48xlarge", nodes=2, profile="llm-pretrain"))
    storage, noncurrent = block["lines"]
    assert Decimal(storage["monthly_usd"]) == Decimal(115)  # 5,000 GB x $0.023
    assert storage["note"] == "every month until deleted"
    # after down nothing replaces objects: the versions left are gone 7 days (168 of 730 h) later
    assert Decimal(noncurrent["monthly_usd"]) == (5000 * S3_US_EAST_1 * 168 / 730).quantize(Decimal("0.000001"))
    assert "7 days" in noncurrent["component"] and "first month only" in noncurrent["note"]
    assert block["lines_without_price"] == 0
    assert Decimal(block["monthly_usd"]) == Decimal(storage["monthly_usd"]) + Decimal(noncurrent["monthly_usd"])


def test_the_expiry_comes_from_the_planned_rule_so_a_longer_one_costs_more():
    spec = make_spec("p5.48xlarge", profile="llm-pretrain", profile_updates=None)
    data = spec.profile.model_dump()
    data["bucket"]["noncurrent_version_days"] = 60  # longer than a month: the whole bound, first month
    long = spec.model_copy(update={"profile": type(spec.profile).model_validate(data)})
    (_, noncurrent) = _doc(long)["lines"]
    assert Decimal(noncurrent["monthly_usd"]) == 5000 * S3_US_EAST_1


def test_versions_without_an_expiry_rule_stay_every_month():
    spec = make_spec("p5.48xlarge", profile="llm-pretrain")
    resources = []
    for r in preview(spec).resources:
        if r.type == "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration":
            rules = [x for x in r.inputs["rules"] if x["id"] != "expire-noncurrent-versions"]
            r = replace(r, inputs={**r.inputs, "rules": rules})
        resources.append(r)
    (_, noncurrent) = _doc(spec, resources)["lines"]
    assert Decimal(noncurrent["monthly_usd"]) == 5000 * S3_US_EAST_1
    assert "no noncurrent-version expiry" in noncurrent["note"]


def test_gcp_kept_bucket_is_priced_at_the_gcs_rate():
    spec = make_spec("a2-highgpu-8g", cloud="gcp", region="us-central1", zone="us-central1-a")
    storage, noncurrent = _doc(spec)["lines"]
    assert Decimal(storage["monthly_usd"]) == 5000 * GCS_US_CENTRAL1 == Decimal(100)
    # deleted by the 7-day rule, then soft-deleted and still billed for GCS's default 7 days
    # (cloud.google.com/storage/docs/soft-delete)
    assert "7 days + 7 days soft-deleted" in noncurrent["component"]
    assert Decimal(noncurrent["monthly_usd"]) == (5000 * GCS_US_CENTRAL1 * 14 * 24 / 730).quantize(Decimal("0.000001"))


def test_a_bucket_deleted_with_the_stack_leaves_nothing():
    spec = make_spec("p5.48xlarge", profile="llm-pretrain", delete_bucket_on_destroy=True)
    block = _doc(spec)
    assert block == {"monthly_usd": "0.000000", "lines_without_price": 0, "lines": []}
    assert left_after_down_text(block) == ["left after down: nothing (the bucket is deleted with the stack)"]


def test_the_text_names_each_line_with_its_unit_price():
    text = left_after_down_text(_doc(make_spec("p5.48xlarge", profile="llm-pretrain")))
    assert text[0] == "left after down, per month: $141.47/month"
    assert text[1].startswith(
        "  t-1-bucket: S3 Standard storage, bucket kept (5000 GB): $115.00/month at $0.023/GB-months ("
    )


def test_unversioned_bucket_has_no_noncurrent_line():
    (storage,) = _doc(make_spec("g5.xlarge", profile="inference"))["lines"]
    assert "bucket kept" in storage["component"]


def test_no_storage_price_leaves_the_block_incomplete_never_zero():
    spec = make_spec("p5.48xlarge", profile="llm-pretrain")
    block = _doc(spec, region="xx-nowhere-1")
    assert block["monthly_usd"] is None and block["lines_without_price"] == 2
    text = left_after_down_text(block)
    assert text[0] == "left after down, per month: incomplete: 2 lines without a price"
    assert all("not found" in row for row in text[1:])


def test_a_stack_that_cannot_be_priced_does_not_stop_down(tmp_path):
    from gpuinfra.services.cost_document import left_after_down_block

    block = left_after_down_block("nosuch", tmp_path)
    assert block["monthly_usd"] is None and block["lines_without_price"] == 1
    (text,) = left_after_down_text(block)
    assert text.startswith("left after down, per month: unknown (")
    assert left_after_down_block("nosuch", tmp_path, delete_data=True)["lines"] == []


def test_a_gcs_bucket_deleted_with_the_stack_still_bills_its_soft_deleted_objects():
    spec = make_spec(
        "a2-highgpu-8g", cloud="gcp", region="us-central1", zone="us-central1-a", delete_bucket_on_destroy=True
    )
    (soft,) = _doc(spec)["lines"]
    # the data and at most as much in versions, soft-deleted for GCS's default 7 days
    assert "Soft-deleted" in soft["component"] and "10000 GB for 7 days" in soft["component"]
    assert Decimal(soft["monthly_usd"]) == (10000 * GCS_US_CENTRAL1 * 7 * 24 / 730).quantize(Decimal("0.000001"))
    text = left_after_down_text(_doc(spec))
    assert text[0].endswith("(the bucket is deleted with the stack)") and "$" in text[0]
