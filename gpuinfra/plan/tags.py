"""Standard tags (AWS) and labels (GCP) put on every taggable resource.

Keys: ``gpuinfra:stack``, ``gpuinfra:stack-id`` (the stack's unique id, stack name and name
suffix: :func:`gpuinfra.plan.naming.stack_id`; selection of the stack's own nodes uses it, never
``gpuinfra:stack``, which a stack of the same name elsewhere also carries), ``gpuinfra:profile``, ``gpuinfra:expires-at`` and, once ``gpuinfra up``
gave the stack one, ``gpuinfra:deployment`` (:attr:`gpuinfra.spec.ClusterSpec.deployment_id`) on AWS; GCP labels
allow only ``[a-z0-9_-]`` in keys and values (cloud.google.com/compute/docs/labeling-resources
#requirements), so they become ``gpuinfra-stack``, ``gpuinfra-stack-id``, ``gpuinfra-profile`` and
``gpuinfra-expires-at`` (the timestamp written as ``20261122t0100z``) and ``gpuinfra-deployment``.
"""

from __future__ import annotations

import re

from gpuinfra.plan.naming import AWS_STACK_ID_TAG, GCP_STACK_ID_LABEL, stack_id
from gpuinfra.spec import (
    AWS_BUDGET_TAG,
    AWS_RUN_HOURS_TAG,
    AWS_WORLD_SSH_TAG,
    GCP_BUDGET_LABEL,
    GCP_RUN_HOURS_LABEL,
    ClusterSpec,
)

#: The deployment a resource belongs to (a new one at every ``up`` that creates the nodes): AWS
#: peer discovery lists only instances with this deployment's tag, and ``down`` finds the
#: instances of an interrupted ``up`` by it (:func:`gpuinfra.lifecycle.sweep_orphans`).
AWS_DEPLOYMENT_TAG = "gpuinfra:deployment"
GCP_DEPLOYMENT_LABEL = "gpuinfra-deployment"


def expires_at_text(spec: ClusterSpec) -> str:
    """TTL end as ISO 8601 UTC with seconds, e.g. ``2026-11-25T01:11:05Z``."""
    return spec.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")


def aws_selection_tags(spec: ClusterSpec) -> dict[str, str]:
    """The tags that select this stack's own instances and nothing else: :data:`AWS_STACK_ID_TAG`
    and, once ``up`` gave the stack one, :data:`AWS_DEPLOYMENT_TAG` (the ``private_ips`` output,
    the nodes' peer discovery, ``sweep_orphans``)."""
    return {
        AWS_STACK_ID_TAG: stack_id(spec),
        **({AWS_DEPLOYMENT_TAG: spec.deployment_id} if spec.deployment_id else {}),
    }


def aws_tags(spec: ClusterSpec, **extra: str) -> dict[str, str]:
    """AWS tags of every resource of the stack (plus ``Name`` etc. from ``extra``); a stack that
    allows SSH from the world says so (:data:`~gpuinfra.spec.AWS_WORLD_SSH_TAG`)."""
    budget = (
        {AWS_BUDGET_TAG: format(spec.max_price_per_hour_usd, "f"), AWS_RUN_HOURS_TAG: f"{spec.run_hours:g}"}
        if spec.max_price_per_hour_usd
        else {}
    )
    return {
        "gpuinfra:stack": spec.stack,
        AWS_STACK_ID_TAG: stack_id(spec),
        "gpuinfra:profile": spec.profile.name,
        "gpuinfra:expires-at": expires_at_text(spec),
        **({AWS_DEPLOYMENT_TAG: spec.deployment_id} if spec.deployment_id else {}),
        **budget,
        **({AWS_WORLD_SSH_TAG: "true"} if spec.network.allow_world_ssh else {}),
        **extra,
    }


def _label_value(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def gcp_labels(spec: ClusterSpec) -> dict[str, str]:
    """GCP labels of every resource of the stack."""
    budget = (
        {
            GCP_BUDGET_LABEL: format(spec.max_price_per_hour_usd, "f").replace(".", "_"),
            GCP_RUN_HOURS_LABEL: f"{spec.run_hours:g}".replace(".", "_"),
        }
        if spec.max_price_per_hour_usd
        else {}
    )
    return {
        "gpuinfra-stack": _label_value(spec.stack),
        GCP_STACK_ID_LABEL: _label_value(stack_id(spec)),
        "gpuinfra-profile": _label_value(spec.profile.name),
        "gpuinfra-expires-at": spec.expires_at.strftime("%Y%m%dt%H%M%Sz"),
        **({GCP_DEPLOYMENT_LABEL: spec.deployment_id} if spec.deployment_id else {}),
        **budget,
    }
