"""Every error class lives in gpuinfra.errors with its exit code."""

from __future__ import annotations

import ast
from decimal import Decimal
from pathlib import Path

import pytest

from gpuinfra import errors
from gpuinfra.errors import (
    BudgetExceededError,
    CatalogGateError,
    DataSourceError,
    ExitCode,
    PreviewFileError,
    ProfileError,
    RuleViolationError,
    SizingError,
    SpecError,
    UsageError,
)
from gpuinfra.rules.model import Violation


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (CatalogGateError, ExitCode.BAD_INPUT),
        (DataSourceError, ExitCode.BAD_INPUT),
        (ProfileError, ExitCode.BAD_INPUT),
        (SizingError, ExitCode.BAD_INPUT),
        (RuleViolationError, ExitCode.BAD_INPUT),
        (PreviewFileError, ExitCode.BAD_INPUT),
        (UsageError, ExitCode.BAD_INPUT),
        (BudgetExceededError, ExitCode.BUDGET_EXCEEDED),
    ],
)
def test_exit_codes(cls, code):
    assert cls.exit_code == code


def test_every_error_class_is_defined_in_errors_and_listed_in_its_docstring():
    root = Path(errors.__file__).parent
    elsewhere = []
    for path in root.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", "")).endswith("Error") for b in node.bases
            ):
                elsewhere.append(f"{path.relative_to(root)}:{node.name}")
    assert elsewhere == []
    for name in (
        "CatalogGateError",
        "DataSourceError",
        "ProfileError",
        "SizingError",
        "RuleViolationError",
        "PreviewFileError",
        "UsageError",
        "BudgetExceededError",
        "CapacityError",
        "HealthGateError",
    ):
        assert f"\n{name} " in errors.__doc__


def test_errors_imports_nothing_from_gpuinfra():
    tree = ast.parse(Path(errors.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("gpuinfra")]


def test_rule_violation_error_has_one_line_per_violation():
    found = [
        Violation("aws-efa-sg-both-ways", "c-sg", "no egress to itself", "docs.aws.amazon.com/efa"),
        Violation("budget-max-price", "", "the stack costs $12.00/h", "README.md"),
    ]
    exc = RuleViolationError(iter(found))
    assert exc.violations == found and isinstance(exc, SpecError)
    assert str(exc) == (
        "aws-efa-sg-both-ways: c-sg: no egress to itself (source: docs.aws.amazon.com/efa)\n"
        "budget-max-price: the stack costs $12.00/h (source: README.md)"
    )


def test_catalog_gate_error_shows_five_failures_and_counts_the_rest():
    exc = CatalogGateError([f"f{i}" for i in range(7)])
    assert exc.failures == [f"f{i}" for i in range(7)]
    assert str(exc) == "catalog failed 7 sanity gate check(s), nothing written: f0; f1; f2; f3; f4 (and 2 more)"


def test_budget_exceeded_error_names_both_amounts():
    exc = BudgetExceededError(Decimal("1234.5678"), Decimal("1000"))
    assert (exc.run_usd, exc.budget_usd) == (Decimal("1234.5678"), Decimal("1000"))
    assert str(exc) == "run total $1,234.57 exceeds the budget $1,000.00"
