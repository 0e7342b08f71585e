"""The one JSON representation of USD amounts (README.md "JSON output")."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuinfra.money import Total, usd_json


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


def test_a_total_with_a_missing_price_has_no_amount_and_stays_incomplete():
    """One unpriced line makes the total unknown, through every sum, difference and scaling:
    never the sum of the other lines (money fails closed)."""
    priced = Total.of([Decimal("21.95764"), Decimal("0.08")])
    gap = Total.of([Decimal("21.95764"), None, None])
    assert (priced.amount_usd, priced.json(), priced.complete) == (Decimal("22.03764"), "22.037640", True)
    assert (gap.amount_usd, gap.missing, gap.json()) == (None, 2, None)
    assert (priced - gap).json() is None and (gap - priced).missing == 2 and (gap + gap).missing == 4
    assert (gap * 24).json() is None and (priced * 24).json() == "528.903360"
    assert gap.text(suffix="/h") == "incomplete: 2 lines without a price"
    assert Total.unpriced(1).text() == "incomplete: 1 line without a price"
    assert priced.text(suffix="/h") == "$22.04/h" and (Total.of([]) - priced).text(signed=True) == "-$22.04"
    assert Total.from_json("22.037640", 0) == priced and Total.from_json("22.037640", 1).json() is None
    with pytest.raises(ValueError):
        Total(Decimal(1), missing=1)


def test_a_null_total_read_back_is_incomplete_whatever_its_count():
    assert Total.from_json(None, 0).text() == "incomplete: 1 line without a price"
    assert Total.from_json(None, 3).missing == 3 and Total.from_json("1.500000", 0).text() == "$1.50"
