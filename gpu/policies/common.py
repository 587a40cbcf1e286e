"""What the policy modules share: the checks of a launch's arguments."""

from __future__ import annotations

import numbers

import numpy as np


def positive_int(value: object, name: str) -> int:
    """`value` as an int >= 1, or a ValueError naming `name` (a launch's sizes: keys, heads, SMs)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def flag(value: object, name: str) -> None:
    """A ValueError naming `name` unless `value` is True or False (a string such as 'no' would be true)."""
    if not isinstance(value, (bool, np.bool_)) and not (isinstance(value, numbers.Integral) and value in (0, 1)):
        raise ValueError(f"{name}: expected True or False, got {value!r}")


__all__ = ["flag", "positive_int"]
