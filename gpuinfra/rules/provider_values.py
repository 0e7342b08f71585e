"""``provider-valid-values``: every documented enum input of a preview holds an allowed value.

The allowed values are read at run time from the docstrings of the *installed* provider SDKs
(pulumi-aws, pulumi-gcp), so a provider upgrade re-checks every stack. Example: the property
``FleetOnDemandOptionsArgs.allocation_strategy`` in ``pulumi_aws/ec2/_inputs.py`` says
"Valid values: `lowestPrice`, `prioritized`." -- a Fleet with
``onDemandOptions.allocationStrategy = "lowest-price"`` is a violation.

How an input is found in the SDK: the type token ``aws:ec2/fleet:Fleet`` names, through the
SDK's own resource-module registry, the Python module ``pulumi_aws.ec2`` and the resource
``Fleet``; its inputs are the properties of ``FleetArgs`` (``@pulumi.getter(name="camelName")``),
and a nested input's Args class comes from the property's type annotation
(``pulumi.Input[Optional['FleetOnDemandOptionsArgs']]``, resolved in the defining module, the
package's ``<module>._inputs``). Everything is cached per class.

A docstring gives allowed values only when a sentence says the list is complete ("Valid
values: ...", "Possible values are ...", "Must be one of ...") and the rest of that sentence is
nothing but the list (see :func:`parse_allowed_values` for the phrasings); anything less
certain gives no list, and an input without a list is skipped, never failed. Where the
provider's validation is documented to accept a value the docstring's list lacks, the value is
added from :data:`DOCSTRING_GAPS` (with its page). Only plain ``str`` values (and ``str``
elements of lists) are compared, exactly (provider enums are case-sensitive) unless the
docstring says "case insensitive"; Pulumi unknowns, empty strings, and ``"true"`` /
``"false"`` against a list without booleans are skipped.
"""

from __future__ import annotations

import collections.abc
import importlib
import importlib.metadata
import re
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpuinfra.rules.model import UNKNOWN, Resource, ResourceGraph, Violation

RULE_NAME = "provider-valid-values"

#: Type-token package -> Python package of its Pulumi SDK.
SDK_PACKAGES: dict[str, str] = {"aws": "pulumi_aws", "gcp": "pulumi_gcp"}

#: What an unknown value (computed at deploy time) looks like in the wire format
#: (``pulumi.runtime.rpc.UNKNOWN``).
_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"

#: Values the provider accepts although the SDK docstring's list lacks them (the docstring lags
#: the provider's validation), keyed by (SDK module, Args class, Python attribute), each with the
#: page that documents it. Only added to a list the docstring gives; the tests fail once the
#: docstring lists the value itself, so an entry is removed as soon as the SDK catches up.
DOCSTRING_GAPS: dict[tuple[str, str, str], tuple[frozenset[str], str]] = {
    ("pulumi_aws.ec2._inputs", "FleetTargetCapacitySpecificationArgs", "default_target_capacity_type"): (
        frozenset({"capacity-block"}),
        "docs.aws.amazon.com/AWSEC2/latest/APIReference/API_TargetCapacitySpecificationRequest.html "
        "(Valid Values: spot | on-demand | capacity-block; terraform-provider-aws ec2_fleet.go validates "
        "DefaultTargetCapacityType_Values())",
    ),
}


# --------------------------------------------------------------------------- docstring parsing

#: Phrases that say the list after them is complete ("Valid values:", "Possible values are").
_EXHAUSTIVE = (
    r"\b(?:the\s+)?(?:valid|possible|allowed|accepted|acceptable|permitted|supported)\s+(?:values|options)"
    r"(?:\s+are)?(?:\s+one\s+of)?"
    r"|\b(?:the\s+)?only\s+(?:valid|possible|allowed|accepted|supported)\s+values?\s+(?:is|are)"
    r"|\bvalid\s+value\s+is"
    r"|\beach\s+value\s+(?:may|must|can)\s+be\s+one\s+of"
    r"|\baccepts\s+the\s+values?"
    r"|^(?:values|one\s+of)"
)
#: "<subject> can / must / should be (one of | either) ...": about this property only when the
#: subject is empty, "this value", or a word of the property's name ("Strategy can only be").
_MODAL = r"\b(?:can|must|should)\s+(?:only\s+)?be(?:\s+(?:one\s+of|either))?(?:\s+the\s+following)?"
_MARKER = re.compile(rf"(?:(?P<exhaustive>{_EXHAUSTIVE})|(?P<modal>{_MODAL}))\s*:?\s*", re.IGNORECASE)
#: Words before a marker that make the list conditional or about something else.
_CONDITIONAL = re.compile(r"\b(?:if|when|whenever|unless|for|with|without|while|where|except)\b|[`\"]", re.IGNORECASE)
_SUBJECT_FILLER = frozenset({"the", "this", "that", "these", "a", "an", "value", "values", "field", "it", "its", "of"})
#: One listed value: `x`, "x" or `"x"`, optionally followed by a plain parenthetical "(default)".
_QUOTED = r'(?:`"?([^`"]+)"?`|"([^"`]+)")(?:\s*\([^()`"]*\))?'
#: One unquoted value: an upper-case enum name (``STANDARD``, ``FLEX_START``, ``TIER_1``).
_CAPS = r"\b([A-Z][A-Z0-9_]*)\b"
_SEPARATOR = r"\s*(?:,\s*(?:and\s+|or\s+)?|\s(?:and|or)\s+|\|\s*|/\s*)"
#: What may follow the list: ", default is `x`", ", with the default being `x`".
_DEFAULT_TAIL = r"(?:\s*,?\s*(?:with\s+)?(?:the\s+)?defaults?(?:\s+(?:is|to|value\s+is|being))?\s*:?\s*{item})?"


def _list_regex(item: str) -> re.Pattern[str]:
    return re.compile(rf"\s*{item}(?:{_SEPARATOR}{item})*{_DEFAULT_TAIL.format(item=item)}\s*[.:]?\s*")


_QUOTED_LIST = _list_regex(_QUOTED)
_CAPS_LIST = _list_regex(_CAPS)
#: A value that is a pattern or placeholder, not a literal.
_NOT_LITERAL = re.compile(r"[*<>{}\s]|\.\.\.|^\$")
_BOOLEANS = frozenset({"true", "false"})
_CASE_INSENSITIVE = re.compile(r"case[- ]insensitive", re.IGNORECASE)
_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "approx", "incl")
#: A line that ends like this goes on in the next line ("Valid values: `a`,\n`b`.").
_CONTINUED = re.compile(r"(?:[,:(]|\b(?:and|or|the|a|an|of|to|be|is|are))\s*$")
#: A line that starts like this goes on the previous one ("`ingress` (inbound)\nor `egress`").
_CONTINUATION = re.compile(r"^(?:[a-z`\"(]|\d)")


def _lines(doc: str) -> Iterator[str]:
    """The docstring's logical lines: a wrapped line is joined with the next one when it ends
    in a word or sign that needs more (``,``, ``:``, ``and``, ``or`` ...) or the next one starts
    lower case or with a quoted value; a blank line, a bullet or a capital starts a new one."""
    pending = ""
    for raw in doc.splitlines():
        line = raw.strip()
        if pending and line and (_CONTINUED.search(pending) or _CONTINUATION.match(line)):
            pending = f"{pending} {line}"
            continue
        if pending:
            yield pending
        pending = line
    if pending:
        yield pending


def _sentences(doc: str) -> Iterator[str]:
    """``doc`` split into sentences: at ``.``/``;`` before white space and at line ends, never
    inside backticks or double quotes, never after an abbreviation such as ``e.g.``."""
    for line in _lines(doc):
        start, quote = 0, ""
        for i, ch in enumerate(line):
            if ch in '`"':
                quote = "" if quote == ch else (quote or ch)
            elif (
                ch in ".;"
                and not quote
                and (i + 1 == len(line) or line[i + 1].isspace())
                and not line[start:i].lower().endswith(_ABBREVIATIONS)
            ):
                yield line[start:i].strip()
                start = i + 1
        if line[start:].strip():
            yield line[start:].strip()


def _values_of_list(text: str) -> list[str] | None:
    """The values of ``text`` when it is nothing but a list of quoted values (or of two or more
    unquoted upper-case enum names), else None."""
    if _QUOTED_LIST.fullmatch(text):
        values = [tick or quoted for tick, quoted in re.findall(_QUOTED, text)]
    elif _CAPS_LIST.fullmatch(text) and len(found := re.findall(_CAPS, text)) >= 2:
        values = found
    else:
        return None
    return None if any(_NOT_LITERAL.search(v) for v in values) else values


def _is_subject(prefix: str, name: str) -> bool:
    """Whether the words before "can / must be" name the property itself (or nothing)."""
    words = set(re.findall(r"[a-z]+", prefix.lower())) - _SUBJECT_FILLER
    stems = {w[:4] for w in name.lower().split("_") if w}
    return not words or any(w[:4] in stems for w in words)


def _values_of_sentence(sentence: str, name: str) -> list[str] | None:
    """The allowed values one sentence states completely, or None."""
    for marker in _MARKER.finditer(sentence):
        prefix = sentence[: marker.start()]
        if _CONDITIONAL.search(prefix) or (marker.group("modal") and not _is_subject(prefix, name)):
            continue
        values = _values_of_list(sentence[marker.end() :])
        if values is None or (marker.group("modal") and len(values) < 2):
            continue
        return values
    return None


def parse_allowed_values(doc: str | None, name: str = "") -> frozenset[str] | None:
    """The complete set of values a property docstring allows, or None when it states none.

    Args:
        doc: a property docstring of a pulumi-aws / pulumi-gcp Args class.
        name: the property's Python name, for "<subject> must be ..." sentences.

    Recognized, when the list is all that follows the phrase in its sentence (values in
    backticks, double quotes or both; a wrapped line is joined first):

    * "Valid values: `a`, `b`." / "Valid values are `a`, `b`, and `c`" / "Valid options are:
      `A`, `B`." / "Possible values are: `A`, `B`." / 'Values: "A", "B".' / "Allowed /
      Accepted / Acceptable / Supported values are ..." / "Each value may be one of: ..." /
      "This field accepts the value `A`, `B`, or `C`" / "One of `a`, `b`" (sentence start);
    * "The only valid value is `a`" / "Valid value is `a`" (one value);
    * "Can be `a` or `b`" / "Must be one of `a`, `b`" / "Can be either ..." (two or more values,
      the subject empty, "this value" or a word of the property name: not "Day must be ...");
    * the same with two or more unquoted upper-case enum names ("Possible values are STANDARD,
      SPOT, FLEX_START, and RESERVATION_BOUND");
    * a plain parenthetical after a value ("`a` (default)") and a closing ", default is `a`".

    Not recognized (None): "Valid values include ...", "such as", "e.g.", "for example",
    unquoted lower-case lists, lists with anything else in the sentence ("... or the ARN of a
    key"), conditional sentences ("If `type` is `S3`, valid values are ..."), ranges ("`0` to
    `1000`"), patterns (`*`, `<name>`, `#{protocol}`), and docstrings with two different lists.
    """
    if not doc:
        return None
    found = {frozenset(v) for s in _sentences(doc) if (v := _values_of_sentence(s, name))}
    return found.pop() if len(found) == 1 else None


# --------------------------------------------------------------------------- SDK introspection


@dataclass(frozen=True)
class Field:
    """One input property of an SDK Args class.

    Attributes:
        python_name: the property's Python name (``allocation_strategy``).
        allowed: values its docstring allows, or None.
        ignore_case: the docstring says the values are case-insensitive.
        nested: the Args class of a nested object / list of objects, or None.
        source: ``"<package> <version> <module>.<Class>.<python_name> docstring"``.
    """

    python_name: str
    allowed: frozenset[str] | None
    nested: type | None
    source: str
    ignore_case: bool = False

    def allows(self, value: str) -> bool:
        """Whether ``value`` is one of :attr:`allowed` (True when there is no list)."""
        if self.allowed is None:
            return True
        if self.ignore_case:
            return value.casefold() in {v.casefold() for v in self.allowed}
        return value in self.allowed


@cache
def _sdk_version(package: str) -> str:
    try:
        return importlib.metadata.version(package.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _annotation_parts(annotation: Any) -> Iterator[Any]:
    """Every class, ForwardRef, string and generic origin inside a type annotation."""
    if isinstance(annotation, (str, typing.ForwardRef, type)):
        yield annotation
    origin = typing.get_origin(annotation)
    if origin is not None:
        yield origin
    for arg in typing.get_args(annotation):
        yield from _annotation_parts(arg)


def _resolve(name: str, module: Any) -> Any:
    """``name`` (``"FooArgs"`` or ``"_inputs.FooArgs"``) looked up in ``module``'s namespace."""
    value: Any = module
    for part in name.split("."):
        value = getattr(value, part, None)
    return value


def _nested_args_class(annotation: Any, owner: type) -> type | None:
    """The Args class a property annotation refers to (``Sequence[Input['XArgs']]`` -> XArgs);
    None for scalars and maps (``Mapping[str, ...]``: their keys are not properties)."""
    parts = list(_annotation_parts(annotation))
    if dict in parts or collections.abc.Mapping in parts:
        return None
    module = sys.modules.get(owner.__module__)
    for part in parts:
        name = part.__forward_arg__ if isinstance(part, typing.ForwardRef) else part if isinstance(part, str) else None
        found = _resolve(name, module) if name else part
        if isinstance(found, type) and found.__name__.endswith("Args") and _getter_properties(found):
            return found
    return None


def _takes_str(annotation: Any) -> bool:
    """Whether a property annotation admits ``str`` values (``Input[str]``, ``Sequence[Input[str]]``)."""
    return any(p is str for p in _annotation_parts(annotation))


@cache
def _getter_properties(cls: type) -> tuple[tuple[str, str, property], ...]:
    """(pulumi name, python name, property) of every ``@pulumi.getter`` property of ``cls``."""
    found = []
    for base in reversed(cls.__mro__):
        for python_name, prop in vars(base).items():
            pulumi_name = getattr(getattr(prop, "fget", None), "_pulumi_name", None)
            if isinstance(prop, property) and pulumi_name:
                found.append((pulumi_name, python_name, prop))
    return tuple(found)


def _field(cls: type, python_name: str, prop: property, where: str) -> Field:
    annotation = getattr(prop.fget, "__annotations__", {}).get("return")
    doc = prop.__doc__ or ""
    allowed = parse_allowed_values(doc, python_name) if _takes_str(annotation) else None
    source = f"{where}.{python_name} docstring"
    gap = DOCSTRING_GAPS.get((cls.__module__, cls.__name__, python_name))
    if allowed and gap:
        allowed, source = allowed | gap[0], f"{source}; {', '.join(sorted(gap[0]))}: {gap[1]}"
    return Field(
        python_name,
        allowed,
        _nested_args_class(annotation, cls),
        source,
        bool(allowed) and bool(_CASE_INSENSITIVE.search(doc)),
    )


@cache
def fields(cls: type) -> dict[str, Field]:
    """camelCase input name -> :class:`Field` for an SDK Args class (cached per class)."""
    package = cls.__module__.split(".", 1)[0]
    where = f"{package} {_sdk_version(package)} {cls.__module__.split('.', 1)[-1]}.{cls.__name__}"
    return {
        pulumi_name: _field(cls, python_name, prop, where) for pulumi_name, python_name, prop in _getter_properties(cls)
    }


def _module_of_token(package: str, module: str) -> Any:
    """The SDK module of a token's module part (``ec2/fleet`` -> ``pulumi_aws.ec2``,
    ``cloudwatch/metricAlarm`` -> ``pulumi_aws.cloudwatch``), as the SDK registers it with the
    Pulumi runtime (its ``_utilities.register``); None when the SDK has no such module."""
    top = importlib.import_module(package)
    from pulumi.runtime import rpc

    registered = rpc.get_resource_module(top.__name__.removeprefix("pulumi_"), module, "")
    fqn = (getattr(registered, "mod_info", None) or {}).get("fqn")
    if fqn is None:  # not registered (or a Pulumi without mod_info): guess the package layout
        head = module.split("/", 1)[0]
        fqn = package if head == "index" else f"{package}.{head}"
    try:
        return importlib.import_module(fqn)
    except ImportError:
        return None


@cache
def resource_args_class(type_token: str) -> type | None:
    """The Args class of a resource type token (``aws:ec2/fleet:Fleet`` -> ``pulumi_aws.ec2.FleetArgs``);
    None for tokens of other packages (``gpuinfra:aws:GpuCluster``) or types the SDK lacks.

    Raises:
        ImportError: when the token's SDK package (pulumi-aws / pulumi-gcp) is not installed.
    """
    parts = type_token.split(":")
    if len(parts) != 3 or parts[0] not in SDK_PACKAGES:
        return None
    module = _module_of_token(SDK_PACKAGES[parts[0]], parts[1])
    found = getattr(module, f"{parts[2]}Args", None) if module is not None else None
    return found if isinstance(found, type) and _getter_properties(found) else None


def field_at(type_token: str, path: tuple[str, ...]) -> Field | None:
    """The :class:`Field` of the input at a camelCase ``path`` of a resource type, or None."""
    cls: type | None = resource_args_class(type_token)
    field: Field | None = None
    for key in path:
        field = fields(cls).get(key) if cls is not None else None
        if field is None:
            return None
        cls = field.nested
    return field


def allowed_values(type_token: str, path: tuple[str, ...]) -> frozenset[str] | None:
    """The values the installed SDK documents for one input, or None when it gives none.

    Args:
        type_token: Pulumi type token (``aws:ec2/fleet:Fleet``).
        path: camelCase input path; list levels are not part of it
            (``("onDemandOptions", "allocationStrategy")``, ``("disks", "diskType")``).

    Returns:
        e.g. ``frozenset({"lowestPrice", "prioritized"})`` from the docstring of
        ``pulumi_aws/ec2/_inputs.py`` ``FleetOnDemandOptionsArgs.allocation_strategy``.

    Raises:
        ImportError: when the token's SDK package is not installed.
    """
    field = field_at(type_token, path)
    return field.allowed if field is not None else None


# --------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class Compared:
    """One string input compared with its allowed values."""

    resource: Resource
    path: str
    value: str
    field: Field

    @property
    def ok(self) -> bool:
        """Whether the value is allowed."""
        return self.field.allows(self.value)


def _comparable(value: str, field: Field) -> bool:
    """Whether a string input is compared: the field has a list, the value is known and not
    empty, and it is not a boolean written as a string against a list without booleans."""
    if field.allowed is None or value in ("", _UNKNOWN, UNKNOWN):
        return False
    return value.lower() not in _BOOLEANS or bool({v.lower() for v in field.allowed} & _BOOLEANS)


def _walk(cls: type, value: dict[str, Any], path: str) -> Iterator[tuple[str, str, Field]]:
    """(path, string value, field) of every string input under ``value`` that has allowed values."""
    table = fields(cls)
    for key, item in value.items():
        field = table.get(key)
        if field is None:
            continue
        where = f"{path}.{key}" if path else key
        items = item if isinstance(item, list) else [item]
        for index, element in enumerate(items):
            at = f"{where}[{index}]" if isinstance(item, list) else where
            if isinstance(element, dict) and field.nested is not None:
                yield from _walk(field.nested, element, at)
            elif isinstance(element, str) and _comparable(element, field):
                yield at, element, field


def compared_inputs(graph: ResourceGraph) -> list[Compared]:
    """Every string input of ``graph`` whose SDK docstring lists allowed values, with its value."""
    out = []
    for resource in graph:
        cls = resource_args_class(resource.type)
        if cls is not None:
            out += [Compared(resource, path, value, field) for path, value, field in _walk(cls, resource.inputs, "")]
    return out


def checked_inputs(graph: ResourceGraph) -> int:
    """How many string inputs of ``graph`` :func:`check_provider_values` compares (to show a
    check over a real preview is not vacuous)."""
    return len(compared_inputs(graph))


def check_provider_values(graph: ResourceGraph) -> list[Violation]:
    """``provider-valid-values``: each string input (or string element of a list input) whose
    SDK docstring lists allowed values holds one of them.

    Args:
        graph: the preview's resources, inputs in the provider wire format (camelCase keys,
            nested dicts / lists for nested Args). Resources of non-aws/gcp tokens, types and
            inputs the SDK does not know, non-string values and unknowns are skipped.

    Returns:
        One :class:`Violation` per offending value; its message names the input path, the value
        and the allowed values, its source the SDK docstring
        (``pulumi_aws 7.51.1 ec2._inputs.FleetOnDemandOptionsArgs.allocation_strategy docstring``).

    Raises:
        ImportError: when a resource's SDK package is not installed.
    """
    return [
        Violation(
            RULE_NAME,
            c.resource.name,
            f"{c.resource.type} input {c.path} = {c.value!r} is not one of the provider's valid "
            f"values: {', '.join(sorted(c.field.allowed or ()))}",
            c.field.source,
        )
        for c in compared_inputs(graph)
        if not c.ok
    ]
