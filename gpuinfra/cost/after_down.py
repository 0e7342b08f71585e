"""What a stack keeps costing each month after ``gpuinfra down`` ("left after down").

``down`` destroys the cluster but keeps the stack bucket unless the stack sets
``delete_bucket_on_destroy`` (the bucket resource then has ``forceDestroy`` true; otherwise it is
retained on delete: :mod:`blueprints.aws.storage`, :mod:`blueprints.gcp.storage`). What stays and
is billed:

* the bucket's objects: the usage's ``bucket_storage_gb`` at the Standard rate, every month until
  someone deletes them (S3: aws.amazon.com/s3/pricing, GCS: cloud.google.com/storage/pricing);
* the bucket's noncurrent object versions (versioning on): billed like stored objects (same
  pages). Bound: at most once more the stored GB (every object replaced once). After ``down``
  nothing replaces objects any more, so they are gone once the bucket's noncurrent-version
  expiry has passed (the profile's ``bucket.noncurrent_version_days``; S3 lifecycle
  ``NoncurrentVersionExpiration``,
  docs.aws.amazon.com/AmazonS3/latest/userguide/lifecycle-configuration-examples.html; GCS
  lifecycle ``daysSinceNoncurrentTime``,
  cloud.google.com/storage/docs/lifecycle#dayssincenoncurrenttime): the line is the first month
  after ``down``, ``GB x min(days, month) / month`` GB-months (on GCS plus the bucket's
  soft-delete retention, :func:`soft_delete_days`); without an expiry rule on the whole bucket the
  full bound stays every month.

Nothing else of a cluster stack survives ``down``: the NAT gateway, its Elastic IP, Cloud NAT,
disks and nodes are destroyed with it; images and registries belong to bake stacks (``gpuinfra
image``), which the cluster stack only reads. A line without a price leaves the block's total
null ("incomplete"), never $0.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import partial

from gpuinfra.catalog.prices import HOURS_PER_MONTH, Price, price
from gpuinfra.money import Total, usd_json

AWS_BUCKET = "aws:s3/bucket:Bucket"
GCP_BUCKET = "gcp:storage/bucket:Bucket"
_STANDARD_KEY = {AWS_BUCKET: ("aws", "s3_standard_per_gb_month"), GCP_BUCKET: ("gcp", "gcs_standard_per_gb_month")}
HOURS_PER_DAY = 24


@dataclass(frozen=True)
class KeptLine:
    """One monthly charge of what ``down`` leaves behind.

    Attributes:
        resource: logical name of the kept resource; component: what is charged.
        unit: unit of ``monthly_quantity`` (``GB-months``).
        monthly_quantity: units billed per month after ``down``.
        unit_price_usd: USD per unit; None = no price (the block is incomplete).
        source, price_date: the unit price's source and date (or why it is missing).
        note: a remark (how long the charge lasts).
    """

    resource: str
    component: str
    unit: str
    monthly_quantity: Decimal
    unit_price_usd: Decimal | None
    source: str
    price_date: str
    note: str = ""

    @property
    def monthly_usd(self) -> Decimal | None:
        """USD per month (None when the price was not found)."""
        return None if self.unit_price_usd is None else self.monthly_quantity * self.unit_price_usd

    def to_json(self) -> dict:
        """``{"resource", "component", "unit", "monthly_quantity", "unit_price_usd", "monthly_usd",
        "price_source", "price_date", "note"}`` (money as :func:`gpuinfra.money.usd_json`)."""
        return {
            "resource": self.resource,
            "component": self.component,
            "unit": self.unit,
            "monthly_quantity": str(self.monthly_quantity.quantize(Decimal("0.000001"))),
            "unit_price_usd": usd_json(self.unit_price_usd),
            "monthly_usd": usd_json(self.monthly_usd),
            "price_source": self.source,
            "price_date": self.price_date,
            "note": self.note,
        }


def _versioned(bucket, resources: list) -> bool:
    if bucket.type == GCP_BUCKET:
        return bool((bucket.inputs.get("versioning") or {}).get("enabled"))
    return any(
        (r.inputs.get("versioningConfiguration") or {}).get("status") == "Enabled"
        for r in resources
        if r.type == "aws:s3/bucketVersioning:BucketVersioning"
    )


def noncurrent_expiry_days(bucket, resources: list) -> int | None:
    """Days after which a noncurrent version of any object of ``bucket`` is deleted, read from
    the planned lifecycle rules (S3: a ``BucketLifecycleConfiguration`` rule with an empty prefix
    filter and ``noncurrentVersionExpiration.noncurrentDays``; GCS: a ``Delete`` rule whose only
    condition is ``daysSinceNoncurrentTime``); None when no rule covers the whole bucket."""
    days: list[int] = []
    if bucket.type == GCP_BUCKET:
        for rule in bucket.inputs.get("lifecycleRules") or []:
            condition = rule.get("condition") or {}
            if (rule.get("action") or {}).get("type") == "Delete" and set(condition) == {"daysSinceNoncurrentTime"}:
                days.append(int(condition["daysSinceNoncurrentTime"]))
    else:
        for r in resources:
            if r.type != "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration":
                continue
            for rule in r.inputs.get("rules") or []:
                whole = (rule.get("filter") or {}).get("prefix", "") == ""
                expiry = rule.get("noncurrentVersionExpiration") or {}
                if rule.get("status") == "Enabled" and whole and expiry.get("noncurrentDays"):
                    days.append(int(expiry["noncurrentDays"]))
    return min(days) if days else None


#: Cloud Storage keeps a deleted object (a noncurrent version a lifecycle rule deletes included)
#: soft-deleted, and billed, for the bucket's soft-delete retention: 7 days unless the bucket
#: sets another (cloud.google.com/storage/docs/soft-delete: "Soft delete is enabled by default on
#: all buckets and has a retention duration of seven days"; soft-deleted objects are billed as
#: stored, cloud.google.com/storage/pricing). S3 has no such state.
GCS_DEFAULT_SOFT_DELETE_DAYS = 7
SECONDS_PER_DAY = 86400


def soft_delete_days(bucket) -> int:
    """Days a deleted object of ``bucket`` stays billed after its delete: the planned
    ``softDeletePolicy.retentionDurationSeconds`` (rounded up to days) of a GCS bucket, else
    :data:`GCS_DEFAULT_SOFT_DELETE_DAYS`; 0 for S3."""
    if bucket.type != GCP_BUCKET:
        return 0
    seconds = (bucket.inputs.get("softDeletePolicy") or {}).get("retentionDurationSeconds")
    if seconds is None:
        return GCS_DEFAULT_SOFT_DELETE_DAYS
    return -(-int(seconds) // SECONDS_PER_DAY)


def left_after_down(resources: list, region: str, stored_gb: Decimal, delete_data: bool = False) -> list[KeptLine]:
    """The monthly lines of what ``down`` keeps (module docstring).

    Args:
        resources: the plan's resources (``type``, ``name``, ``inputs``).
        region: the stack's region (prices are per region).
        stored_gb: GB the bucket holds (usage ``bucket_storage_gb``).
        delete_data: ``down --delete-data`` deletes the bucket too.

    Returns:
        One storage line per kept bucket, plus a noncurrent-versions line when it is versioned.
        A bucket ``down`` deletes (``forceDestroy``, or ``delete_data``) has none on S3; on GCS
        its objects (and versions) stay soft-deleted, and billed, for :func:`soft_delete_days`:
        one line for that, in the first month.
    """
    lines: list[KeptLine] = []
    for bucket in resources:
        if bucket.type not in _STANDARD_KEY:
            continue
        cloud, key = _STANDARD_KEY[bucket.type]
        label = "S3 Standard" if cloud == "aws" else "GCS Standard"
        line = partial(_kept_line, bucket.name, price(cloud, key, region), f"no storage price for {region}")
        if delete_data or bucket.inputs.get("forceDestroy") in (True, "true"):
            soft = soft_delete_days(bucket)
            if soft:
                held = stored_gb * (2 if _versioned(bucket, resources) else 1)
                share = min(Decimal(soft * HOURS_PER_DAY), HOURS_PER_MONTH) / HOURS_PER_MONTH
                lines.append(
                    line(
                        f"Soft-deleted objects of the deleted bucket (at most {held} GB for {soft} days)",
                        held * share,
                        "upper bound; first month only: the soft-delete retention",
                    )
                )
            continue
        lines.append(line(f"{label} storage, bucket kept ({stored_gb} GB)", stored_gb, "every month until deleted"))
        if not _versioned(bucket, resources):
            continue
        days = noncurrent_expiry_days(bucket, resources)
        if days is None:
            lines.append(
                line(
                    f"Noncurrent object versions (at most {stored_gb} GB)",
                    stored_gb,
                    "upper bound; no noncurrent-version expiry: every month until deleted",
                )
            )
            continue
        soft = soft_delete_days(bucket)
        billed = days + soft
        share = min(Decimal(billed * HOURS_PER_DAY), HOURS_PER_MONTH) / HOURS_PER_MONTH
        extra = f" + {soft} days soft-deleted" if soft else ""
        lines.append(
            line(
                f"Noncurrent object versions (at most {stored_gb} GB for {days} days{extra})",
                stored_gb * share,
                f"upper bound; first month only: they expire {days} days after they were replaced",
            )
        )
    return lines


def _kept_line(resource: str, unit: Price | None, missing: str, component: str, qty: Decimal, note: str) -> KeptLine:
    return KeptLine(
        resource,
        component,
        "GB-months",
        qty,
        None if unit is None else unit.usd,
        missing if unit is None else unit.source,
        "" if unit is None else unit.date,
        note,
    )


def kept_total(lines: list[KeptLine]) -> Total:
    """The monthly total of ``lines`` (incomplete when one has no price)."""
    return Total.of(line.monthly_usd for line in lines)


def kept_json(lines: list[KeptLine]) -> dict:
    """``{"monthly_usd", "lines_without_price", "lines": [...]}`` of ``lines`` (``monthly_usd``
    null when a line has no price)."""
    total = kept_total(lines)
    return {
        "monthly_usd": total.json(),
        "lines_without_price": total.missing,
        "lines": [line.to_json() for line in lines],
    }
