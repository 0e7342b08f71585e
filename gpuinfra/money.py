"""How an amount of US dollars is written in JSON: one representation for every command.

Rule (docs/json-output.md, "JSON output"): a JSON **string** holding a plain decimal number of USD with
exactly :data:`USD_PLACES` (6) decimal places, rounded half to even -- ``"14.693540"``,
``"0.000000"``, ``"-2.500000"`` -- never a float, never an exponent, currency sign or thousands
separator; the key ends in ``_usd`` (``price_per_hour_usd``, ``run_usd``); ``null`` when the
amount is unknown (a missing price is never ``"0.000000"``).

Six places hold every price of the shipped catalog and price table exactly (they have at most
six); amounts computed from them (totals for N nodes, $/GPU-h, run totals) are rounded once,
here, when they are written.

A total of priced lines is a :class:`Total`: it has no amount once any line lacks a price, so a
partial sum can never be shown or compared as if it were the total (money fails closed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Total:
    """A sum of USD amounts that fails closed: unknown once any part is unknown.

    Build it with :meth:`of` (amounts, None for a line without a price) or :meth:`unpriced`
    (lines known to have no price); add, subtract and scale it with ``+``, ``-``, ``*``. An
    incomplete total has no amount at all (``amount_usd`` is None, JSON ``null``), so no
    partial sum reaches a document, a text or a comparison.

    Attributes:
        amount_usd: the sum in USD; None when ``missing`` > 0.
        missing: how many lines (or resources) have no price.

    Raises:
        ValueError: built with an amount and ``missing`` > 0, or with ``missing`` < 0.
    """

    amount_usd: Decimal | None
    missing: int = 0

    def __post_init__(self) -> None:
        if self.missing < 0 or (self.missing > 0) == (self.amount_usd is not None):
            raise ValueError(f"a Total has an amount exactly when no line is missing: {self!r}")

    @classmethod
    def of(cls, amounts: Iterable[Decimal | None]) -> Total:
        """The sum of ``amounts`` (USD); each None is one line without a price."""
        total, missing = Decimal(0), 0
        for amount in amounts:
            if amount is None:
                missing += 1
            else:
                total += amount
        return cls(None if missing else total, missing)

    @classmethod
    def unpriced(cls, missing: int) -> Total:
        """``missing`` lines without a price (a complete $0 when ``missing`` is 0)."""
        return cls(None, missing) if missing else cls(Decimal(0))

    @classmethod
    def from_json(cls, value: str | None, missing: int) -> Total:
        """A total read back from a document: ``value`` as written by :meth:`json` (None when
        incomplete) and the document's count of lines without a price."""
        if value is None:  # a null total is incomplete even where the count is missing
            return cls(None, max(missing, 1))
        return cls(None, missing) if missing else cls(Decimal(value))

    @property
    def complete(self) -> bool:
        """True when every line has a price (the amount is a total)."""
        return self.missing == 0

    def __add__(self, other: Total) -> Total:
        if self.amount_usd is None or other.amount_usd is None:
            return Total(None, self.missing + other.missing)
        return Total(self.amount_usd + other.amount_usd)

    def __sub__(self, other: Total) -> Total:
        return self + Total(None if other.amount_usd is None else -other.amount_usd, other.missing)

    def __mul__(self, factor: Decimal | int) -> Total:
        return self if self.amount_usd is None else Total(self.amount_usd * factor)

    def json(self) -> str | None:
        """:func:`usd_json` of the amount: ``null`` when incomplete."""
        return usd_json(self.amount_usd)

    def text(self, places: int = 2, suffix: str = "", signed: bool = False) -> str:
        """The amount for people (``$1,234.56`` + ``suffix``), or, when incomplete and in its
        place, ``incomplete: N lines without a price`` (never a number).

        Args:
            places: decimal places shown.
            suffix: appended to the amount (``"/h"``); not to the incomplete text.
            signed: show ``+`` / ``-`` before the dollar sign (a change).
        """
        if self.amount_usd is None:
            return incomplete_text(self.missing)
        sign = ("+" if self.amount_usd >= 0 else "-") if signed else ("-" if self.amount_usd < 0 else "")
        return f"{sign}${abs(self.amount_usd):,.{places}f}{suffix}"


def incomplete_text(missing: int) -> str:
    """What stands where a total would be when ``missing`` lines have no price."""
    return f"incomplete: {missing} line{'' if missing == 1 else 's'} without a price"
