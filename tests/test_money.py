"""The one JSON representation of USD amounts (README.md "JSON output")."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuinfra.money import usd_json


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("14.69354"), "14.693540"),  # a catalog price: exact, padded to 6 places
        (Decimal("21.95764") * 24, "526.983360"),  # a computed run total
        (Decimal("43.91528") / 8, "5.489410"),  # $/GPU-h
        (Decimal("0.0000005"), "0.000000"),  # half to even: down to 0
        (Decimal("0.0000015"), "0.000002"),  # half to even: up to 2
        (Decimal("-0.0000001"), "0.000000"),  # never "-0.000000"
        (Decimal("-2.5"), "-2.500000"),  # a diff's change can be negative
        (Decimal("1E+3"), "1000.000000"),  # never an exponent
        (7, "7.000000"),
        (None, None),  # unknown stays null
    ],
)
def test_usd_json(value, text):
    assert usd_json(value) == text


@pytest.mark.parametrize("value", [1.5, True, "1.5"])
def test_usd_json_refuses_floats_and_other_types(value):
    with pytest.raises(TypeError, match="USD amounts must be Decimal or int"):
        usd_json(value)
