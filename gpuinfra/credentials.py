"""Cloud credentials: one place that finds them and says, in one line, how to set them up.

AWS: boto3's default credential chain (environment, shared files, SSO, instance profile:
boto3.amazonaws.com/v1/documentation/api/latest/guide/credentials.html). GCP: Application
Default Credentials (cloud.google.com/docs/authentication/application-default-credentials).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuinfra.errors import MissingDependencyError

AWS_HINT = "set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (`aws configure`)"
GCP_HINT = "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"


def no_aws_credentials(purpose: str = "", alternative: str = "") -> MissingDependencyError:
    """The error for missing AWS credentials: ``no AWS credentials found<purpose>: <hint><alternative>``."""
    return MissingDependencyError(f"no AWS credentials found{purpose}: {AWS_HINT}{alternative}")


def no_gcp_credentials(purpose: str = "", alternative: str = "") -> MissingDependencyError:
    """The error for missing GCP credentials (same shape as :func:`no_aws_credentials`)."""
    return MissingDependencyError(f"no GCP credentials found{purpose}: {GCP_HINT}{alternative}")


def aws_session(purpose: str = "", alternative: str = ""):
    """A ``boto3.Session`` that has credentials.

    Args:
        purpose: what they are for, in the message (``" to look up the bucket"``).
        alternative: what the user can do instead (``", or give --data-region"``).

    Raises:
        MissingDependencyError: the default chain finds none (exit 6).
    """
    import boto3

    session = boto3.Session()
    if session.get_credentials() is None:
        raise no_aws_credentials(purpose, alternative)
    return session


def gcp_credentials(purpose: str = "", alternative: str = ""):
    """``(credentials, project)`` from Application Default Credentials (needs google-auth).

    Raises:
        MissingDependencyError: none configured (exit 6).
    """
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return google.auth.default()
    except DefaultCredentialsError:
        raise no_gcp_credentials(purpose, alternative) from None


def check_gcp_credentials_configured() -> None:
    """Fail early when no Application Default Credentials are configured, without importing the
    Google client libraries (an optional extra): ``GOOGLE_APPLICATION_CREDENTIALS`` or gcloud's
    ``application_default_credentials.json``.

    Raises:
        MissingDependencyError: neither is there (exit 6).
    """
    adc = (
        Path(os.environ.get("CLOUDSDK_CONFIG", Path.home() / ".config" / "gcloud"))
        / "application_default_credentials.json"
    )
    if not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") and not adc.is_file():
        raise no_gcp_credentials()


def cloud_storage(purpose: str):
    """The ``google.cloud.storage`` module (the optional ``gcp-data`` extra).

    Args:
        purpose: what needs it, for the message (``"reading a GCS bucket"``).

    Raises:
        MissingDependencyError: the client library is not installed (exit 6).
    """
    try:
        import google.cloud.storage as storage  # (google-cloud-storage ships no type information)
    except ImportError:
        raise MissingDependencyError(
            f"{purpose} needs google-cloud-storage: pip install 'gpuinfra[gcp-data]'"
        ) from None
    return storage


def aws_client_factory(endpoint_url: str | None = None):
    """boto3 client factory using the default credential chain.

    Raises:
        MissingDependencyError: no AWS credentials are configured.
    """
    session = aws_session()
    return lambda service, region: session.client(service, region_name=region, endpoint_url=endpoint_url)
