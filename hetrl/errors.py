"""Errors for user mistakes: each names the field, the value and the limit."""

from __future__ import annotations

from typing import Any


class HetrlError(Exception):
    """Base of every error caused by bad input; the CLI prints it in one line and exits 2."""


class FieldError(HetrlError):
    """A named input has a bad value: ``field`` (a dotted path such as ``nodes[2].gpu``, or an
    option such as ``--tp``), ``value`` the offending value and ``problem`` a short statement of
    the limit that was broken."""

    def __init__(self, field: str, value: Any, problem: str):
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field} = {value!r}: {problem}")


class SpecError(FieldError, ValueError):
    """A spec, plan or file field has a bad value (see :class:`FieldError`)."""


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


def positive(field: str, value: Any) -> float:
    """Return ``value`` as a float if it is a finite number > 0, else raise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecError(field, value, "must be a number") from None
    require(number == number and number not in (float("inf"), float("-inf")), field, value,
            "must be finite")
    require(number > 0, field, value, "must be > 0")
    return number


def positive_int(field: str, value: Any) -> int:
    """Return ``value`` as an int if it is an integer >= 1, else raise."""
    require(isinstance(value, int) and not isinstance(value, bool), field, value,
            "must be an integer")
    require(value >= 1, field, value, "must be >= 1")
    return value
