"""GCP IAM conditions evaluated as IAM would, and refused where IAM would refuse them.

An IAM condition is a CEL expression (cloud.google.com/iam/docs/conditions-overview), but IAM
accepts only the functions its attribute reference documents for each attribute: for the
resource name, ``startsWith()``, ``endsWith()`` and ``extract()`` besides ``==`` / ``!=``
(cloud.google.com/iam/docs/conditions-attribute-reference#resource-name). cel-python
(github.com/cloud-custodian/cel-python) implements all of CEL, so an expression using ``matches``,
``contains`` or ``size`` would evaluate here and be rejected by IAM when the binding is set:
:func:`cel_true` first walks the parsed expression and fails on any function outside
:data:`IAM_FUNCTIONS`. No gpuinfra condition uses ``extract``: it is left out of the evaluator
rather than approximated.
"""

from __future__ import annotations

#: Functions IAM documents for the attributes gpuinfra's conditions test: the string tests of
#: the resource-name attribute (resource.type and destination.port take ``==`` / ``!=`` only).
IAM_FUNCTIONS = frozenset({"resource.name.startsWith", "resource.name.endsWith"})
#: "Each condition expression can have up to 12 logical operators" (cloud.google.com/iam/docs/
#: conditions-overview, limitations).
MAX_LOGICAL_OPERATORS = 12


def functions_used(expression: str) -> set[str]:
    """Every function or method called in ``expression``: ``f(x)`` as ``f``, ``x.f(y)`` as
    ``<receiver>.f`` with the receiver's dotted name (``resource.name.startsWith``)."""
    import celpy

    tree = celpy.Environment().compile(expression)
    names = set()
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg":
            receiver = ".".join(str(token) for token in node.children[0].scan_values(lambda _: True))
            names.add(f"{receiver}.{node.children[1]}")
        elif node.data == "ident_arg":
            names.add(str(node.children[0]))
    return names


def logical_operators(expression: str) -> int:
    """How many ``&&``, ``||`` and ``!`` ``expression`` has."""
    import celpy

    tree = celpy.Environment().compile(expression)
    return sum(
        1
        for node in tree.iter_subtrees()
        if (node.data in ("conditionalor", "conditionaland") and len(node.children) == 2) or node.data == "unary_not"
    )


def cel_true(expression: str, activation: dict) -> bool:
    """``expression`` evaluated over ``activation`` (e.g. ``{"resource": {"type": ..., "name": ...}}``).

    Raises:
        AssertionError: the expression calls a function IAM does not document for conditions
            (or on another attribute), or has more logical operators than IAM allows.
    """
    import celpy

    undocumented = functions_used(expression) - IAM_FUNCTIONS
    assert not undocumented, f"IAM conditions do not document {sorted(undocumented)}: {expression}"
    assert logical_operators(expression) <= MAX_LOGICAL_OPERATORS, f"over 12 logical operators: {expression}"
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return bool(program.evaluate({key: celpy.json_to_cel(value) for key, value in activation.items()}))


def resource_allowed(expression: str, resource_type: str, resource_name: str) -> bool:
    """:func:`cel_true` over the two resource attributes IAM gives a request."""
    return cel_true(expression, {"resource": {"type": resource_type, "name": resource_name}})
