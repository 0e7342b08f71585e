"""Where a training data set lives and how big it is: ``--data``, ``--data-region``, ``--data-size``.

``--data s3://bucket/prefix`` asks S3 for the bucket's region (``HeadBucket``'s
``x-amz-bucket-region``) and, without ``--data-size``, sums the object sizes under the prefix
(``ListObjectsV2``). ``--data gs://bucket/prefix`` asks Cloud Storage for the bucket's location
(``buckets.get``: a region such as ``US-CENTRAL1`` or a multi-/dual-region such as ``US``,
``EU``, ``NAM4``) and sums ``objects.list`` sizes. ``--data-region R`` names the region
directly (its cloud is read from the name: AWS ``us-east-1`` vs GCP ``us-east1``).

Errors are :class:`~gpuinfra.errors.DataSourceError` (exit 2) or, for missing credentials or client libraries,
:class:`~gpuinfra.errors.MissingDependencyError` (exit 6).
"""

from __future__ import annotations

import os
import re
from decimal import Decimal, InvalidOperation

from gpuinfra.credentials import aws_session, cloud_storage, gcp_credentials, no_aws_credentials
from gpuinfra.errors import DataSourceError
from gpuinfra.spec import AWS_REGION, GCP_REGION, GCS_MULTI_REGIONS, DataSource  # noqa: F401 (re-exported)

#: How the credentials errors of a bucket lookup read (gpuinfra.credentials).
LOOKUP, LOOKUP_ALTERNATIVE = " to look up the bucket", ", or give --data-region and --data-size"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|PB|KIB|MIB|GIB|TIB|PIB)?\s*$", re.IGNORECASE)
_UNITS_GB = {
    "B": Decimal("1e-9"),
    "KB": Decimal("1e-6"),
    "MB": Decimal("1e-3"),
    "GB": Decimal(1),
    "TB": Decimal(1000),
    "PB": Decimal(10**6),
    "KIB": Decimal(1024) / Decimal(10**9),
    "MIB": Decimal(1024**2) / Decimal(10**9),
    "GIB": Decimal(1024**3) / Decimal(10**9),
    "TIB": Decimal(1024**4) / Decimal(10**9),
    "PIB": Decimal(1024**5) / Decimal(10**9),
}


def parse_size_gb(text: str) -> Decimal:
    """``2TB`` -> 2000, ``500GiB`` -> 536.870912, ``750`` -> 750 (GB when no unit).

    Raises:
        DataSourceError: not a size with a known unit, or not positive.
    """
    match = _SIZE.match(text or "")
    if not match:
        raise DataSourceError(
            f"--data-size {text!r} is not a size; give a number with B, KB, MB, GB, TB, PB or KiB..PiB (e.g. 2TB)"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
        raise DataSourceError(f"--data-size {text!r} is not a size") from None
    gb = number * _UNITS_GB[(match.group(2) or "GB").upper()]
    if gb <= 0:
        raise DataSourceError(f"--data-size must be more than 0, got {text!r}")
    return gb


def cloud_of_region(region: str) -> str:
    """``aws`` or ``gcp`` from a region name.

    Raises:
        DataSourceError: the name is neither an AWS nor a GCP region name.
    """
    if AWS_REGION.match(region):
        return "aws"
    if GCP_REGION.match(region):
        return "gcp"
    raise DataSourceError(
        f"--data-region {region!r} is not an AWS region (like us-east-1) or a GCP region (like us-central1)"
    )


def split_uri(uri: str) -> tuple[str, str, str]:
    """(cloud, bucket, prefix) of ``s3://bucket/prefix`` or ``gs://bucket/prefix``.

    Raises:
        DataSourceError: another scheme or no bucket.
    """
    form = re.match(r"^(s3|gs)://([^/]*)(?:/(.*))?$", uri or "")
    if not form:
        raise DataSourceError(f"--data {uri!r} must be s3://bucket[/prefix] or gs://bucket[/prefix]")
    bucket = form.group(2)
    # S3: 3-63 characters of a-z, 0-9, '.', '-', starting and ending with a letter or digit
    # (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html); GCS: the same, up
    # to 222 with dots (cloud.google.com/storage/docs/buckets#naming), '_' allowed
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]", bucket):
        raise DataSourceError(
            f"--data {uri!r}: bucket name {bucket!r} is not a bucket name: use 3-63 (GCS with dots: up to 222) "
            "lowercase letters, digits, '.', '-' (and '_' on GCS), starting and ending with a letter or digit"
        )
    return ("aws" if form.group(1) == "s3" else "gcp"), bucket, form.group(3) or ""


def resolve_data_set(
    uri: str | None, region: str | None, size: str | None, s3_client=None, gcs_client=None
) -> DataSource | None:
    """The data set named by the options, or None when none was given.

    Args:
        uri: ``--data``.
        region: ``--data-region`` (needs ``--data-size``; with ``--data`` it overrides the lookup).
        size: ``--data-size`` (with ``--data`` it skips the listing).
        s3_client, gcs_client: clients to use (default: from the default credential chains).

    Raises:
        DataSourceError: malformed values, a bucket that does not exist or is empty.
        MissingDependencyError: no credentials / client library for the lookup.
    """
    if uri is None and region is None:
        if size is not None:
            raise DataSourceError("--data-size needs --data or --data-region")
        return None
    size_gb = parse_size_gb(size) if size is not None else None
    if uri is None:
        if size_gb is None:
            raise DataSourceError("--data-region needs --data-size (e.g. --data-size 2TB)")
        assert region is not None  # uri and region are not both None (above)
        return DataSource(cloud=cloud_of_region(region), location=region, size_gb=size_gb)
    cloud, bucket, prefix = split_uri(uri)
    if region is not None and cloud_of_region(region) != cloud:
        raise DataSourceError(f"--data-region {region} is not a {cloud} region, but {uri} is on {cloud}")
    if region is not None and size_gb is not None:  # nothing to look up: no client, no credentials
        return DataSource(cloud=cloud, location=region, size_gb=size_gb, uri=uri)
    if cloud == "aws":
        location, listed = _s3_lookup(s3_client, bucket, prefix, need_region=region is None, need_size=size_gb is None)
    else:
        location, listed = _gcs_lookup(
            gcs_client, bucket, prefix, need_region=region is None, need_size=size_gb is None
        )
    size_gb = size_gb if size_gb is not None else listed
    if size_gb is None or size_gb <= 0:
        raise DataSourceError(f"{uri} holds no objects; give --data-size if the data is not there yet")
    return DataSource(cloud=cloud, location=region or location, size_gb=size_gb, uri=uri)


def _s3_lookup(
    client, bucket: str, prefix: str, need_region: bool, need_size: bool
) -> tuple[str | None, Decimal | None]:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    if client is None:
        client = aws_session(LOOKUP, LOOKUP_ALTERNATIVE).client("s3")
    try:
        region = None
        if need_region:
            headers = client.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPHeaders"]
            region = headers.get("x-amz-bucket-region") or "us-east-1"
        total = None
        if need_size:
            total = 0
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                total += sum(obj["Size"] for obj in page.get("Contents", []))
    except NoCredentialsError:
        raise no_aws_credentials(LOOKUP, LOOKUP_ALTERNATIVE) from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise DataSourceError(f"s3://{bucket}: {code or exc} (does the bucket exist and may you read it?)") from None
    except BotoCoreError as exc:
        raise DataSourceError(f"s3://{bucket}: {exc}") from None
    return region, None if total is None else Decimal(total) / Decimal(10**9)


def _gcs_lookup(
    client, bucket: str, prefix: str, need_region: bool, need_size: bool
) -> tuple[str | None, Decimal | None]:
    storage = cloud_storage("gs:// data")
    from google.api_core.exceptions import GoogleAPIError, NotFound

    if client is None and os.environ.get("STORAGE_EMULATOR_HOST"):
        # the client library's own switch for a local Cloud Storage server (fake-gcs-server)
        client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "gpuinfra"))
    if client is None:
        credentials, project = gcp_credentials(LOOKUP, LOOKUP_ALTERNATIVE)
        client = storage.Client(credentials=credentials, project=project)
    try:
        location = client.get_bucket(bucket).location.lower() if need_region else None
        total = sum(blob.size or 0 for blob in client.list_blobs(bucket, prefix=prefix or None)) if need_size else None
    except NotFound:
        raise DataSourceError(f"gs://{bucket} does not exist (or you may not read it)") from None
    except GoogleAPIError as exc:
        raise DataSourceError(f"gs://{bucket}: {exc}") from None
    return location, None if total is None else Decimal(total) / Decimal(10**9)
