"""The two Google REST calls a GCP bake makes, through an authorized ``requests`` session
(google-auth ``AuthorizedSession``; extra ``gcp-bake``): publish the message that starts the
Cloud Build trigger, and read the newest image of the bake's family. Errors map to gpuinfra's
exit codes: 401/403 and missing credentials -> :class:`MissingDependencyError` (6), other
failures -> :class:`OperationError` (7).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from gpuinfra.credentials import gcp_credentials, no_gcp_credentials
from gpuinfra.errors import MissingDependencyError, OperationError

#: Pub/Sub and Compute REST roots (pubsub.googleapis.com/v1, compute.googleapis.com/compute/v1).
PUBSUB_API = "https://pubsub.googleapis.com"
COMPUTE_API = "https://compute.googleapis.com"


@dataclass(frozen=True)
class GcpApis:
    """An authorized HTTP session (``requests``-like: ``get``/``post``) and the REST roots."""

    session: Any
    pubsub: str = PUBSUB_API
    compute: str = COMPUTE_API


def make_gcp_apis() -> GcpApis:
    """:class:`GcpApis` with Application Default Credentials (tests replace this function).

    Raises:
        MissingDependencyError: google-auth / requests missing, or no credentials (exit 6).
    """
    try:
        from google.auth.transport.requests import AuthorizedSession
    except ImportError:
        raise MissingDependencyError(
            "a GCP bake needs google-auth and requests: pip install 'gpuinfra[gcp-bake]'"
        ) from None
    credentials, _ = gcp_credentials(" to start or record the bake")
    return GcpApis(AuthorizedSession(credentials))


def _gcp_call(apis: GcpApis, method: str, url: str, what: str, **kwargs) -> dict:
    """One REST call; Google's JSON error (``{"error": {"code", "message", "status"}}``) as
    :class:`OperationError` (exit 7), or :class:`MissingDependencyError` for 401/403 (exit 6)."""
    import requests
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    try:
        response = getattr(apis.session, method)(url, timeout=60, **kwargs)
    except (DefaultCredentialsError, RefreshError):
        raise no_gcp_credentials(f" to {what}") from None
    except requests.RequestException as exc:
        raise OperationError(f"{what} failed: {exc}") from None
    if response.status_code < 400:
        return response.json()
    try:
        error = response.json().get("error") or {}
    except ValueError:
        error = {}
    detail = f"{response.status_code} {error.get('status', '')}: {error.get('message', response.reason)}".replace(
        " :", ":"
    )
    if response.status_code in (401, 403):
        raise MissingDependencyError(f"{what} was refused ({detail}); check the GCP credentials and their permissions")
    raise OperationError(f"{what} failed ({detail})")


def publish_build(apis: GcpApis, topic: str) -> str:
    """Start a bake: publish one message (data ``bake``) to ``topic``
    (``projects/P/topics/T``) with ``POST {pubsub}/v1/{topic}:publish``
    (cloud.google.com/pubsub/docs/reference/rest/v1/projects.topics/publish: body
    ``{"messages": [{"data": <base64>}]}``, answer ``{"messageIds": [...]}``).

    Returns:
        The message id.
    """
    body = {"messages": [{"data": base64.b64encode(b"bake").decode()}]}
    answer = _gcp_call(apis, "post", f"{apis.pubsub}/v1/{topic}:publish", f"publishing to {topic}", json=body)
    return (answer.get("messageIds") or ["?"])[0]


def family_images(apis: GcpApis, project: str, family: str) -> list[dict]:
    """Every Compute ``Image`` of ``project`` whose family is ``family``, all pages:
    ``GET {compute}/compute/v1/projects/{project}/global/images`` with
    ``filter=family = "<family>"`` (AIP-160 form), ``maxResults`` 500 and ``pageToken`` until the
    answer has no ``nextPageToken`` (cloud.google.com/compute/docs/reference/rest/v1/images/list).

    Raises:
        OperationError / MissingDependencyError: see :func:`_gcp_call`.
    """
    images: list[dict] = []
    token = ""
    while True:
        params = ({"pageToken": token} if token else {}) | {"filter": f'family = "{family}"', "maxResults": 500}
        answer = _gcp_call(
            apis,
            "get",
            f"{apis.compute}/compute/v1/projects/{project}/global/images",
            f"listing the images of family {family} in project {project}",
            params=params,
        )
        images += answer.get("items") or []
        token = answer.get("nextPageToken") or ""
        if not token:
            return images
