"""Versioning wherever spot is allowed, with earlier versions expiring, in the bucket resources
of both clouds and in the cost preview (a spot node can be reclaimed mid-upload; the earlier
version of an object it overwrote must survive)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import ValidationError

from gpuinfra.catalog.prices import HOURS_PER_MONTH, price
from gpuinfra.catalog.store import load_catalog
from gpuinfra.cost.estimate import estimate
from gpuinfra.profiles import get_profile, load_profiles
from tests.blueprints.helpers import make_spec, preview

USAGE = {"bucket_storage_gb": Decimal(100), "internet_egress_gb": Decimal(0), "nat_processed_gb": Decimal(0)}
NONCURRENT = "Noncurrent object versions (versioning on; at most 100 GB)"


def test_every_profile_that_allows_spot_keeps_versions():
    for profile in load_profiles().values():
        assert profile.spot.policy == "forbidden" or profile.bucket.versioning, profile.name


def test_a_profile_allowing_spot_without_versioning_is_refused():
    data = get_profile("lora-finetune").model_dump()
    data["bucket"]["versioning"] = False
    with pytest.raises(ValidationError, match="spot.policy 'preferred' needs bucket.versioning: true"):
        type(get_profile("lora-finetune")).model_validate(data)


def _aws(profile):
    spec = make_spec("g5.xlarge", nodes=1, profile=profile)
    result = preview(spec)
    return spec, result


def test_aws_spot_profile_bucket_is_versioned_with_noncurrent_expiry():
    spec, result = _aws("lora-finetune")
    (versioning,) = result.of_type("aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["versioningConfiguration"] == {"status": "Enabled"}
    (lifecycle,) = result.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    assert lifecycle.inputs["rules"] == [
        {
            "id": "expire-scratch",
            "status": "Enabled",
            "filter": {"prefix": "scratch/"},
            "expiration": {"days": 3},
            "noncurrentVersionExpiration": {"noncurrentDays": 3},
        },
        {
            "id": "expire-noncurrent-versions",
            "status": "Enabled",
            "filter": {"prefix": ""},
            "noncurrentVersionExpiration": {"noncurrentDays": 7},
        },
        {
            "id": "abort-incomplete-uploads",
            "status": "Enabled",
            "filter": {"prefix": ""},
            "abortIncompleteMultipartUpload": {"daysAfterInitiation": 7},
        },
    ]
    est = estimate(result.resources, load_catalog(), spec.region, USAGE, Decimal(24))
    (line,) = [x for x in est.lines if x.component == NONCURRENT]
    assert line.unit_price_usd == price("aws", "s3_standard_per_gb_month", spec.region).usd
    assert line.hourly_quantity == Decimal(100) / HOURS_PER_MONTH


def test_aws_inference_bucket_has_no_versions_to_expire_or_price():
    spec, result = _aws("inference")
    (versioning,) = result.of_type("aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["versioningConfiguration"] == {"status": "Suspended"}
    (lifecycle,) = result.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    assert [r["id"] for r in lifecycle.inputs["rules"]] == ["expire-scratch", "abort-incomplete-uploads"]
    est = estimate(result.resources, load_catalog(), spec.region, USAGE, Decimal(24))
    assert not [x for x in est.lines if x.component == NONCURRENT]


def test_gcp_spot_profile_bucket_is_versioned_with_noncurrent_expiry_and_priced():
    spec = make_spec("g2-standard-8", nodes=1, profile="qlora-finetune", cloud="gcp")
    result = preview(spec)
    (bucket,) = result.of_type("gcp:storage/bucket:Bucket")
    assert bucket.inputs["versioning"] == {"enabled": True}
    assert bucket.inputs["lifecycleRules"] == [
        {"action": {"type": "Delete"}, "condition": {"age": 3, "matchesPrefixes": ["scratch/"]}},
        {"action": {"type": "Delete"}, "condition": {"daysSinceNoncurrentTime": 7}},
        {"action": {"type": "AbortIncompleteMultipartUpload"}, "condition": {"age": 7}},
    ]
    est = estimate(result.resources, load_catalog(), spec.region, USAGE, Decimal(24))
    (line,) = [x for x in est.lines if x.component == NONCURRENT]
    assert line.unit_price_usd == price("gcp", "gcs_standard_per_gb_month", spec.region).usd


def test_noncurrent_versions_fail_closed_without_a_price():
    spec, result = _aws("lora-finetune")
    est = estimate(result.resources, load_catalog(), "xx-nowhere-1", USAGE, Decimal(24))
    (line,) = [x for x in est.lines if x.component == NONCURRENT]
    assert line.unit_price_usd is None and line.source == "no storage price for xx-nowhere-1"
