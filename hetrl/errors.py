"""Errors for user mistakes: each names the field, the value and the limit.

The checks below are type-first: a boolean is not an integer, a list is not a string, a string
is not a number, and a number must be finite before its range is checked.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

#: Longest rendering of an offending value in a message (a long list or string is cut).
MAX_VALUE_CHARS = 200


class HetrlError(Exception):
    """Base of every error caused by bad input; the CLI prints it in one line and exits 2."""


def _shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_VALUE_CHARS` characters (one short line)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int over Python's digit limit, a deep structure
        text = f"<{type(value).__name__}>"
    if len(text) > MAX_VALUE_CHARS:
        text = text[:MAX_VALUE_CHARS - 20] + f"... ({len(text)} chars)"
    return text


def _printable(field: str) -> str:
    """``field`` with control characters escaped (a key may hold a newline) and cut to
    :data:`MAX_VALUE_CHARS` characters."""
    text = field if field.isprintable() else "".join(
        c if c.isprintable() else repr(c)[1:-1] for c in field)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


class FieldError(HetrlError):
    """A named input has a bad value: ``field`` (a dotted path such as ``nodes[2].gpu``, or an
    option such as ``--tp``), ``value`` the offending value and ``problem`` a short statement of
    the limit that was broken."""

    def __init__(self, field: str, value: Any, problem: str):
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{_printable(field)} = {_shown(value)}: {problem}")


class SpecError(FieldError, ValueError):
    """A spec, plan or file field has a bad value (see :class:`FieldError`)."""


class PlanMismatchError(SpecError):
    """A plan made for another workload or cluster than the one given: its recorded
    fingerprint (``made_for``, :mod:`hetrl.fingerprint`) differs from the given spec's."""


class OptionError(FieldError):
    """A command-line option has a bad value (checked while the arguments are parsed, before any
    work). Not a ValueError, so that argparse passes it on instead of turning it into its own
    usage message."""


class InfeasibleError(HetrlError):
    """A job cannot run on a cluster at all (e.g. the models do not fit in memory)."""


def require(cond: bool, field: str, value: Any, problem: str) -> None:
    """Raise :class:`SpecError` unless ``cond`` holds."""
    if not cond:
        raise SpecError(field, value, problem)


def is_int(value: Any) -> bool:
    """An integer that is not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number (int or float, numpy's too) that is not a boolean; may be inf or NaN."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite_number(field: str, value: Any, lo: float | None = None, hi: float | None = None,
                  unit: str = "") -> float:
    """``value`` as a float if it is a finite real number (not a bool, not a string) in
    [``lo``, ``hi``] (either may be None: unbounded), else raise. ``unit`` names the unit."""
    units = f" ({unit})" if unit else ""
    require(is_number(value), field, value, f"must be a number{units}{why_not_number(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond a float's range
        number = math.inf
    if lo is not None and hi is not None:  # one message for the range: [lo, hi]
        require(math.isfinite(number) and lo <= number <= hi, field, value,
                f"must be a finite number in [{lo:g}, {hi:g}]{units}")
        return number
    require(math.isfinite(number), field, value, f"must be finite{units}")
    if lo is not None:
        require(number >= lo, field, value, f"must be >= {lo:g}{units}")
    if hi is not None:
        require(number <= hi, field, value, f"must be <= {hi:g}{units}")
    return number


def why_not_number(value: Any) -> str:
    """Why a value that looks like a number is not one (a quoted number in a file)."""
    if not isinstance(value, str):
        return ""
    try:
        float(value.replace("_", ""))
    except ValueError:
        return ""
    return (f", not the string {value!r}: write it without quotes (YAML and JSON read "
            "1e-3, 0.001 and 1000 as numbers)")


def positive(field: str, value: Any, hi: float | None = None) -> float:
    """Return ``value`` as a float if it is a finite number > 0 (and <= ``hi``), else raise."""
    number = finite_number(field, value)
    require(number > 0, field, value, "must be > 0")
    if hi is not None:
        require(number <= hi, field, value, f"must be <= {hi:g}")
    return number


def integer(field: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` if it is an integer (not a bool, not a float) in [``lo``, ``hi``]."""
    require(is_int(value), field, value, "must be an integer")
    if lo is not None:
        require(value >= lo, field, value, f"must be >= {lo}")
    if hi is not None:
        require(value <= hi, field, value, f"must be <= {hi:,}")
    return value


def positive_int(field: str, value: Any, hi: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer >= 1 (and <= ``hi``), else raise."""
    return integer(field, value, 1, hi)


def boolean(field: str, value: Any) -> bool:
    """Return ``value`` if it is true or false (a YAML boolean, not a string or a number)."""
    require(isinstance(value, bool), field, value,
            "must be true or false (a YAML boolean, not a string)")
    return value


def string(field: str, value: Any, nonempty: bool = True) -> str:
    """Return ``value`` if it is a string (non-empty unless ``nonempty`` is false)."""
    require(isinstance(value, str), field, value, "must be a string")
    require(not nonempty or value.strip() != "", field, value, "must be a non-empty string")
    return value


def one_of(field: str, value: Any, choices: Sequence[str] | Mapping[str, Any]) -> str:
    """Return ``value`` if it is one of the string ``choices``."""
    require(isinstance(value, str) and value in choices, field, value,
            f"must be one of {list(choices)}")
    return value


def mapping(field: str, value: Any, problem: str = "must be a mapping") -> Mapping[str, Any]:
    """Return ``value`` if it is a mapping."""
    require(isinstance(value, Mapping), field, value, problem)
    return value


def listing(field: str, value: Any, problem: str = "must be a list") -> Sequence[Any]:
    """Return ``value`` if it is a list or a tuple (not a string, not a mapping)."""
    require(isinstance(value, list | tuple), field, value, problem)
    return value


def closest(name: Any, choices: Sequence[str] | Mapping[str, Any], n: int = 3) -> list[str]:
    """Up to ``n`` of ``choices`` closest to ``name`` (case-insensitive, difflib's ratio >= 0.6),
    best first: the suggestions of an unknown-name message."""
    import difflib

    if not isinstance(name, str):
        return []
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(choice.lower(), choice)
    hits = difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)
    return [by_lower[h] for h in hits]


def did_you_mean(name: Any, choices: Sequence[str] | Mapping[str, Any]) -> str:
    """``"; did you mean 'X' or 'Y'?"`` for the closest ``choices`` to ``name``, or ``""``."""
    hits = closest(name, choices)
    if not hits:
        return ""
    return "; did you mean " + " or ".join(repr(h) for h in hits) + "?"


def find_name(name: Any, choices: Sequence[str] | Mapping[str, Any]) -> str | None:
    """The one of ``choices`` equal to ``name``, else the one equal ignoring case (None: no
    match). Names are matched as people type them: ``l40s`` is ``L40S``."""
    if not isinstance(name, str):
        return None
    if name in choices:
        return name
    folded = name.casefold()
    return next((c for c in choices if c.casefold() == folded), None)
