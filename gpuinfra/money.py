"""How an amount of US dollars is written in JSON: one representation for every command.

Rule (README.md "JSON output"): a JSON **string** holding a plain decimal number of USD with
exactly :data:`USD_PLACES` (6) decimal places, rounded half to even -- ``"14.693540"``,
``"0.000000"``, ``"-2.500000"`` -- never a float, never an exponent, currency sign or thousands
separator; the key ends in ``_usd`` (``price_per_hour_usd``, ``run_usd``); ``null`` when the
amount is unknown (a missing price is never ``"0.000000"``).

Six places hold every price of the shipped catalog and price table exactly (they have at most
six); amounts computed from them (totals for N nodes, $/GPU-h, run totals) are rounded once,
here, when they are written.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

#: Decimal places of every USD amount in JSON output (micro-dollars).
USD_PLACES = 6
_QUANTUM = Decimal(1).scaleb(-USD_PLACES)


def usd_json(value: Decimal | int | None) -> str | None:
    """The JSON form of an amount of USD (see module docstring); None stays None.

    Args:
        value: the amount in USD, a Decimal (or an int); never a float.

    Raises:
        TypeError: ``value`` is a float (binary floats cannot hold prices exactly; convert
            with ``Decimal(str(x))`` where a float is unavoidable).
    """
    if value is None:
        return None
    if isinstance(value, (float, bool)) or not isinstance(value, (Decimal, int)):
        raise TypeError(f"USD amounts must be Decimal or int, got {type(value).__name__} {value!r}")
    rounded = Decimal(value).quantize(_QUANTUM, rounding=ROUND_HALF_EVEN)
    return format(abs(rounded) if rounded == 0 else rounded, "f")  # never "-0.000000"
