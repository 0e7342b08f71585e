"""OCI image references: the grammar a ``container_image`` must match before it reaches a node.

The grammar is the one Docker and containerd parse references with, from
https://github.com/distribution/reference (``reference.go``, "Grammar")::

    reference        := name [ ":" tag ] [ "@" digest ]
    name             := [domain '/'] remote-name
    domain           := host [':' port-number]
    host             := domain-name | IPv4address          (IPv6 hosts are not accepted here)
    domain-name      := domain-component ['.' domain-component]*
    domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
    port-number      := /[0-9]+/
    path-component   := alpha-numeric [separator alpha-numeric]*
    remote-name      := path-component ['/' path-component]*
    alpha-numeric    := /[a-z0-9]+/
    separator        := /[_.]|__|[-]+/
    tag              := /[\\w][\\w.-]{0,127}/
    digest           := digest-algorithm ":" digest-hex
    digest-algorithm := component [ /[+.-_]/ component ]*,  component := /[A-Za-z][A-Za-z0-9]*/
    digest-hex       := /[0-9a-fA-F]{32,}/

and a name is at most 255 characters (``NameTotalLengthMax``). A reference that matches has no
whitespace, quotes, ``$``, ``;``, ``&`` or newline, so it cannot change the meaning of a shell
command or a unit file; the writers quote it all the same.
"""

from __future__ import annotations

import re

from gpuinfra.errors import SpecError

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
#: One OCI image reference (the whole string; groups: name).
REFERENCE_RE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?")
NAME_MAX_LENGTH = 255
ALLOWED_FORM = "registry/path/name[:tag][@sha256:digest], e.g. nvcr.io/nvidia/pytorch:25.01-py3"


def check_image_reference(image: str, field: str = "container_image") -> str:
    """``image`` if it is an OCI image reference (module docstring); "" (no image) passes.

    Args:
        image: the reference, e.g. ``nvcr.io/nvidia/pytorch:25.01-py3``.
        field: the setting's name for the error message ("" when the caller's error path
            already names it).

    Raises:
        SpecError: one line naming ``field`` and the allowed form.
    """
    if image == "":
        return image
    match = REFERENCE_RE.fullmatch(image)
    if match is None or len(match.group("name")) > NAME_MAX_LENGTH:
        shown = image if len(image) <= 80 and image.isprintable() else repr(image[:80])
        subject = f"{field} {shown!r}" if field else repr(shown) if shown == image else shown
        raise SpecError(
            f"{subject} is not an OCI image reference: use {ALLOWED_FORM} (grammar: github.com/distribution/reference)"
        )
    return image
