"""One place where values from users are checked.

Every entry point — ``ModelParams``, the command line, trace loaders, the
strategies — validates through these functions, so a value is accepted or
refused the same way everywhere, and a refusal is one line naming the
argument, the value and what would be valid (an :class:`InvalidArgument`).

Integers: ``int`` and numpy integers are accepted; a float or a string is
accepted when it denotes an integer exactly (``4.0``, ``"1e3"``, ``"131_000"``)
so that scientific notation on a command line works; ``True``/``False`` are
never numbers.  Every integer has an upper bound, so a huge value is refused
before any work starts instead of overflowing or hanging later.
"""

from __future__ import annotations

import math
import numbers
from decimal import Decimal, InvalidOperation
from typing import TypeVar

from kvstab.errors import InvalidArgument

#: an int or a float, whichever a bound check was given
_N = TypeVar("_N", int, float)

__all__ = [
    "MAX_TOKENS",
    "MAX_COUNT",
    "MAX_SLOTS",
    "MAX_SEED",
    "MAX_RATE",
    "as_int",
    "positive_int",
    "nonneg_int",
    "positive_float",
    "nonneg_float",
    "fraction",
    "unit_fraction",
]

#: the largest token count kvstab accepts (2⁴⁰ ≈ 1.1·10¹²: far above any KV cache)
MAX_TOKENS = 2**40
#: the largest count of requests, sequences or examples
MAX_COUNT = 2**31 - 1
#: the largest horizon in slots (10⁹ slots is days of serving)
MAX_SLOTS = 10**9
#: seeds are numpy seeds: non-negative and below 2⁶³
MAX_SEED = 2**63 - 1
#: the largest arrival rate in requests per second
MAX_RATE = 1e9


def _integral(name: str, value: object) -> int:
    """``value`` as an exact ``int``, or :class:`InvalidArgument`."""
    what = f"{name} must be an integer, got {value!r}"
    if isinstance(value, bool):
        raise InvalidArgument(what)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f) or not f.is_integer():
            raise InvalidArgument(what)
        return int(f)
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            d = Decimal(text)
        except InvalidOperation:
            raise InvalidArgument(what) from None
        if not d.is_finite() or d != d.to_integral_value():
            raise InvalidArgument(what)
        if abs(d) > Decimal(2) ** 64:  # far beyond every bound below; int() of 1e999999 would hang
            raise InvalidArgument(f"{name} is too large, got {value!r}")
        return int(d)
    raise InvalidArgument(what)


def as_int(name: str, value: object, *, minimum: int, maximum: int) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``, else one clear error."""
    v = _integral(name, value)
    if v < minimum or v > maximum:
        raise InvalidArgument(f"{name} must be an integer in [{minimum}, {maximum}], got {value!r}")
    return v


def _signed(name: str, value: object, v: _N, *, zero: bool, noun: str, maximum: _N, shown: str) -> _N:
    """``v`` (``value`` read as a number) if it is ``> 0`` (``≥ 0`` with ``zero``) and at most
    ``maximum`` (written ``shown`` in the refusal)."""
    if v < 0 or (not zero and v == 0):
        raise InvalidArgument(f"{name} must be a {'non-negative' if zero else 'positive'} {noun}, got {value!r}")
    if v > maximum:
        raise InvalidArgument(f"{name} must be at most {shown}, got {value!r}")
    return v


def positive_int(name: str, value: object, *, maximum: int = MAX_TOKENS) -> int:
    """A positive integer at most ``maximum``."""
    return _signed(name, value, _integral(name, value), zero=False, noun="integer", maximum=maximum, shown=f"{maximum}")


def nonneg_int(name: str, value: object, *, maximum: int = MAX_SEED) -> int:
    """A non-negative integer at most ``maximum``."""
    return _signed(name, value, _integral(name, value), zero=True, noun="integer", maximum=maximum, shown=f"{maximum}")


def _real(name: str, value: object) -> float:
    if isinstance(value, bool):
        raise InvalidArgument(f"{name} must be a number, got {value!r}")
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(f):
        raise InvalidArgument(f"{name} must be a finite number, got {value!r}")
    return f


def positive_float(name: str, value: object, *, maximum: float = math.inf) -> float:
    """A finite number ``> 0`` (at most ``maximum``)."""
    return _signed(name, value, _real(name, value), zero=False, noun="number", maximum=maximum, shown=f"{maximum:g}")


def nonneg_float(name: str, value: object, *, maximum: float = math.inf) -> float:
    """A finite number ``≥ 0`` (at most ``maximum``)."""
    return _signed(name, value, _real(name, value), zero=True, noun="number", maximum=maximum, shown=f"{maximum:g}")


def fraction(name: str, value: object) -> float:
    """A number in ``[0, 1)`` (e.g. a warm-up fraction)."""
    f = _real(name, value)
    if not 0 <= f < 1:
        raise InvalidArgument(f"{name} must be a number in [0, 1), got {value!r}")
    return f


def unit_fraction(name: str, value: object) -> float:
    """A number in ``(0, 1]`` (e.g. a target utilisation ρ)."""
    f = _real(name, value)
    if not 0 < f <= 1:
        raise InvalidArgument(f"{name} must be a number in (0, 1], got {value!r}")
    return f
