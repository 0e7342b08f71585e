"""Data types of the conformance rules: a violation, and a view of a preview's resources.

A *rule* is one cloud constraint (EFA security group both ways, allowed local SSD count, ...)
with the page that states it (registry: :mod:`gpuinfra.rules.spec_rules`). A check reads a :class:`ResourceGraph` -- the resources a preview
registered, with their inputs exactly as the provider receives them (camelCase) -- and the
:class:`~gpuinfra.catalog.model.InstanceFacts` of the node type, and yields
:class:`Violation` objects. The same functions run in ``gpuinfra preview`` / ``gpuinfra new``
and in the CrossGuard policy pack (``policy/``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Stands for a value Pulumi does not know yet during ``pulumi preview`` (ids of resources still
#: to be created). Checks treat it as "set, value unknown": it matches no resource and no enum.
UNKNOWN = "<unknown during preview>"


@dataclass(frozen=True)
class Violation:
    """One broken rule on one resource.

    Attributes:
        rule: the rule's name (kebab-case, e.g. ``aws-efa-sg-both-ways``).
        resource: logical name of the offending resource ("" when the stack as a whole).
        message: what is wrong and what the cloud allows, one line.
        source: the page or file that states the rule.
    """

    rule: str
    resource: str
    message: str
    source: str

    def line(self) -> str:
        """``<rule>: <resource>: <message> (source: <source>)`` -- one line for the CLI."""
        where = f"{self.resource}: " if self.resource else ""
        return f"{self.rule}: {where}{self.message} (source: {self.source})"


@dataclass(frozen=True)
class Resource:
    """One resource of a preview: Pulumi type token, logical name, parent name, inputs."""

    type: str
    name: str
    inputs: dict[str, Any]
    parent: str | None = None

    def get(self, path: str, default: Any = None) -> Any:
        """Input at a dotted camelCase path (``"targetCapacitySpecification.totalTargetCapacity"``)."""
        value: Any = self.inputs
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                return default
            value = value[key]
        return value


@dataclass
class ResourceGraph:
    """The resources of one stack, indexed by type token."""

    resources: list[Resource] = field(default_factory=list)

    @classmethod
    def from_records(cls, records: Iterable[Any]) -> ResourceGraph:
        """Build from objects with ``type``, ``name``, ``inputs`` and ``parent`` attributes
        (:class:`gpuinfra.preview.ResourceRecord`, or the policy pack's adapters)."""
        return cls([Resource(r.type, r.name, dict(r.inputs or {}), getattr(r, "parent", None)) for r in records])

    def of_type(self, token: str) -> list[Resource]:
        """Resources whose type token is ``token`` (``aws:ec2/fleet:Fleet``)."""
        return [r for r in self.resources if r.type == token]

    def first(self, token: str) -> Resource | None:
        """The first resource of type ``token``, or None."""
        found = self.of_type(token)
        return found[0] if found else None

    def whole_number(self, token: str, path: str, default: int = 1) -> int:
        """The number at ``path`` of the first resource of type ``token`` (a fleet's or a MIG's
        node count), or ``default`` when there is none or it is not known yet."""
        found = self.first(token)
        value = found.get(path) if found else None
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    def referenced(self, value: Any, token: str) -> Resource | None:
        """The resource of type ``token`` that ``value`` (an id or self link input) points to.

        The offline preview's ids are ``<name>-id`` and its self links end in ``/<name>``; under
        ``pulumi preview`` ids of resources not yet created are unknown, and then nothing matches
        (checks fall back to the stack's resources of that type).
        """
        if not isinstance(value, str):
            return None
        for res in self.of_type(token):
            names = {res.name, str(res.inputs.get("name", ""))} - {""}
            if value == f"{res.name}-id" or any(value.rstrip("/").endswith("/" + n) for n in names):
                return res
        return None

    def __iter__(self) -> Iterator[Resource]:
        return iter(self.resources)


#: instance / machine type -> its facts, as the checks receive them.
Facts = Mapping[str, Any]
