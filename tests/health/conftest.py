"""Recorded command outputs for the health gate (tests/fixtures/health/, each with a .source file)."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "health"


def fixture_text(name: str) -> str:
    """The text of one recorded output."""
    return (FIXTURES / name).read_text()


@pytest.fixture
def recorded():
    return fixture_text
