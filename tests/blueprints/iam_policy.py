"""Evaluate AWS identity-based policies the way IAM does, for the elements gpuinfra's policies use.

Source: docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html
(within one account, for identity policies only: an explicit ``Deny`` in any statement wins; else
an ``Allow`` in any statement allows; else the request is implicitly denied). Elements:

* ``Action`` / ``NotAction``: ``service:Name`` with ``*`` and ``?`` wildcards, case-insensitive
  (reference_policies_elements_action.html, reference_policies_elements_notaction.html);
* ``Resource`` / ``NotResource``: ARNs with ``*`` (any run of characters, ``/`` included) and
  ``?`` (one character), case-sensitive (reference_policies_elements_resource.html);
* ``Condition``: all operators of a block and all keys of an operator must match (AND), any of a
  key's values may match (OR); a key absent from the request context makes a non-negated
  operator false (reference_policies_elements_condition.html, ..._condition_operators.html).
  Operators implemented: ``StringEquals``, ``StringNotEquals``, ``StringLike``, ``ArnEquals``,
  ``ArnLike``; any other raises, so a policy this module cannot judge fails its test instead of
  passing it.

Why not moto's ``moto.iam.access_control.IAMPolicy`` (moto 5.2.5, already a dependency): its
condition code (``moto/iam/policy_conditions.py``) evaluates only ``StringEquals`` and treats
every other operator as true, treats a key absent from the request as a match, returns an explicit
deny when an ``Allow`` statement's condition fails, and knows no ``NotResource``: each would make
some must-deny case below pass or fail for the wrong reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from enum import Enum


class Decision(Enum):
    """IAM's three outcomes."""

    ALLOW = "allow"
    EXPLICIT_DENY = "explicit deny"
    IMPLICIT_DENY = "implicit deny"


def _wildcard(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"{body}\\Z", re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _matches_any(patterns: str | list[str], value: str, *, ignore_case: bool) -> bool:
    return any(_wildcard(p, ignore_case=ignore_case).match(value) for p in _listed(patterns))


_OPERATORS = {
    "StringEquals": (lambda want, got: want == got, False),
    "StringNotEquals": (lambda want, got: want != got, True),
    "StringLike": (lambda want, got: bool(_wildcard(want, ignore_case=False).match(got)), False),
    "ArnEquals": (lambda want, got: want == got, False),
    "ArnLike": (lambda want, got: bool(_wildcard(want, ignore_case=False).match(got)), False),
}


def _condition_holds(block: Mapping[str, Mapping[str, str | list[str]]], context: Mapping[str, str]) -> bool:
    for operator, keys in block.items():
        if operator not in _OPERATORS:
            raise NotImplementedError(f"condition operator {operator} is not evaluated by this module")
        test, negated = _OPERATORS[operator]
        for key, wanted in keys.items():
            got = next((v for k, v in context.items() if k.lower() == key.lower()), None)  # keys: case-insensitive
            if got is None:
                if not negated:
                    return False
                continue
            values = _listed(wanted)
            if negated:
                if not all(test(w, got) for w in values):
                    return False
            elif not any(test(w, got) for w in values):
                return False
    return True


def _applies(statement: Mapping, action: str, resource: str, context: Mapping[str, str]) -> bool:
    known = {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition"}
    if set(statement) - known:
        raise NotImplementedError(f"statement elements {sorted(set(statement) - known)} are not evaluated")
    if "Action" in statement:
        if not _matches_any(statement["Action"], action, ignore_case=True):
            return False
    elif _matches_any(statement["NotAction"], action, ignore_case=True):
        return False
    if "Resource" in statement:
        if not _matches_any(statement["Resource"], resource, ignore_case=False):
            return False
    elif _matches_any(statement["NotResource"], resource, ignore_case=False):
        return False
    return _condition_holds(statement.get("Condition", {}), context)


def evaluate(
    documents: Iterable[str | Mapping], action: str, resource: str, context: Mapping[str, str] | None = None
) -> Decision:
    """The decision of a principal whose identity policies are ``documents`` (JSON text or
    parsed) on ``action`` (``service:Name``) against ``resource`` (an ARN, or ``*`` for actions
    without a resource type), with request-context keys ``context`` (e.g.
    ``{"cloudwatch:namespace": "x"}``)."""
    allowed = False
    for document in documents:
        doc = json.loads(document) if isinstance(document, str) else document
        for statement in _listed_statements(doc["Statement"]):
            if _applies(statement, action, resource, context or {}):
                if statement["Effect"] == "Deny":
                    return Decision.EXPLICIT_DENY
                allowed = True
    return Decision.ALLOW if allowed else Decision.IMPLICIT_DENY


def _listed_statements(statements: Mapping | list[Mapping]) -> list[Mapping]:
    return [statements] if isinstance(statements, Mapping) else list(statements)
