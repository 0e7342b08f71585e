"""Names of child resources. Child logical names derive from the component name
(``<stack>-vpc``), never from values that can change, so Pulumi URNs stay stable."""

from __future__ import annotations

import re


def child(name: str, role: str) -> str:
    """Logical name of a child resource: ``<component>-<role>``."""
    return f"{name}-{role}"


def dns_safe(text: str, max_len: int = 40) -> str:
    """Lower-case letters, digits and '-' only (S3/GCS bucket and GCE resource names)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (cleaned or "gpuinfra")[:max_len].rstrip("-")
