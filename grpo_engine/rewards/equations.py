"""The exact arithmetic of one equation in a step's text: reading each side's tokens as a
:class:`fractions.Fraction` (never a float) and whether the two sides agree (:func:`link_holds`). step_check.py
finds the equations and their sides in the text; this module evaluates them.

A side is numbers and ``+ - * / ^ %`` and brackets, its unit words dropped, evaluated by recursive descent with
the usual precedence (``-2^2`` is -4, ``2^3^2`` is 2^9, ``%`` divides by 100); a side it cannot read (malformed,
a number over MAX_NUMBER_DIGITS digits, a power past MAX_EXPONENT or MAX_POWER_BITS) makes its link uncheckable,
so the link holds. Two sides agree when they are equal as fractions, or one side is a lone decimal written with
d places and the other side rounds to it (lies within half a unit of its last place): ``10/3 = 3.33`` and
``10/3 = 3.3`` hold, ``10/3 = 3.4`` does not. A lone percentage also stands for its bare number, the
convention of ``4/5 * 100 = 80%``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

MAX_NUMBER_DIGITS = 40
MAX_EXPONENT = 64
MAX_POWER_BITS = 4096


class Tok(NamedTuple):
    """One token of a step's text, as step_check.py cuts it."""

    kind: str  # NUM OP LP RP EQ REL CMD WORD PUNCT
    text: str
    start: int
    end: int


class _Uncheckable(ValueError):
    """A side that cannot be read as exact arithmetic: its link is skipped, never reported."""


def link_holds(left: list[Tok], right: list[Tok]) -> bool:
    """False only when both sides are checkable and disagree; more than one kind of unit is a conversion."""
    units = {t.text.lower().rstrip("s") for t in left + right if t.kind == "WORD"}  # hour, Hours: one unit
    if len(units) > 1:
        return True
    try:
        (a_values, a_places), (b_values, b_places) = _side_values(left), _side_values(right)
    except (ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return True
    return any(_values_agree(a, b, a_places, b_places) for a in a_values for b in b_values)


def _values_agree(a: Fraction, b: Fraction, a_places: int, b_places: int) -> bool:
    """Equal, or one side is a lone decimal with d places and the other rounds to it:
    |other - decimal| <= 1/2 * 10**-d, so 10/3 = 3.33 holds and 10/3 = 3.4 does not."""
    return a == b or any(
        places and abs(other - decimal) * 2 * 10**places <= 1
        for decimal, other, places in ((a, b, a_places), (b, a, b_places))
    )


def _side_values(side: list[Tok]) -> tuple[list[Fraction], int]:
    """(exact readings, decimal places when the side is a lone decimal number else 0) of one side's tokens.

    The reading is the side's value; a lone percentage also reads as its bare number, the convention of
    ``4/5 * 100 = 80%``."""
    items: list[Fraction | str] = []
    for tok in side:
        if tok.kind == "NUM":
            digits = tok.text.replace(",", "")
            if len(digits.replace(".", "")) > MAX_NUMBER_DIGITS:
                raise _Uncheckable("number too long")
            items.append(Fraction(digits))
        elif tok.kind != "WORD":  # units are dropped
            items.append({"**": "^", "[": "(", "]": ")"}.get(tok.text, tok.text))
    numbers = [t.text for t in side if t.kind == "NUM"]
    lone = len(numbers) == 1 and all(isinstance(i, Fraction) or i in "+-" for i in items)
    places = len(numbers[0].partition(".")[2]) if lone else 0
    value = _Parser(items).parse()
    return ([value, items[0]] if len(items) == 2 and items[1] == "%" else [value]), places


class _Parser:
    """Exact recursive-descent evaluation of one side's items (Fractions and operator strings).

    Precedence, lowest first: ``+ -``; ``* /`` and implicit products ``2(3)``; signs; ``^`` (right to left,
    so ``-2^2`` is -4 and ``2^3^2`` is 2^9); postfix ``%`` (divides by 100). Raises _Uncheckable when malformed.
    """

    def __init__(self, items: list[Fraction | str]):
        self.items, self.i = items, 0

    def peek(self) -> Fraction | str | None:
        """The next item, not consumed; None at the end."""
        return self.items[self.i] if self.i < len(self.items) else None

    def take(self) -> Fraction | str:
        """The next item, consumed."""
        if self.i >= len(self.items):
            raise _Uncheckable("side ends early")
        self.i += 1
        return self.items[self.i - 1]

    def parse(self) -> Fraction:
        """The value of the whole side, which must use every item."""
        value = self.sum()
        if self.i != len(self.items):
            raise _Uncheckable("trailing items")
        return value

    def sum(self) -> Fraction:
        """Terms joined by ``+`` and ``-``."""
        value = self.product()
        while self.peek() in ("+", "-"):
            value = value + self.product() if self.take() == "+" else value - self.product()
        return value

    def product(self) -> Fraction:
        """Factors joined by ``*``, ``/`` or an implicit product before ``(``."""
        value = self.signed()
        while self.peek() in ("*", "/", "("):
            op = self.take() if self.peek() != "(" else "*"
            value = value * self.signed() if op == "*" else value / self.signed()
        return value

    def signed(self) -> Fraction:
        """A factor after any signs."""
        if self.peek() in ("+", "-"):
            return -self.signed() if self.take() == "-" else self.signed()
        return self.power()

    def power(self) -> Fraction:
        """``base ^ exponent``, for a small integer exponent and a bounded result only."""
        base = self.percent()
        if self.peek() != "^":
            return base
        self.take()
        exponent = self.signed()
        bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
        if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT or bits * abs(exponent) > MAX_POWER_BITS:
            raise _Uncheckable("power too large")
        return base ** int(exponent)

    def percent(self) -> Fraction:
        """A number or a bracket, then any ``%``."""
        item = self.take()
        if item == "(":
            value = self.sum()
            if self.take() != ")":
                raise _Uncheckable("unclosed bracket")
        elif isinstance(item, Fraction):
            value = item
        else:
            raise _Uncheckable(f"unexpected {item!r}")
        while self.peek() == "%":
            self.take()
            value /= 100
        return value
