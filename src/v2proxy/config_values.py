"""Parsers of single setting values (``ValueError`` with the reason, which config.py turns into
one line naming the setting and where it came from). Pure: no I/O.

Byte sizes (:func:`byte_size`) are an integer number of bytes or a number with a unit: ``K``,
``M``, ``G``, ``T`` are powers of 1000, ``Ki``, ``Mi``, ``Gi``, ``Ti`` powers of 1024, either may
end in ``B`` (``1GB``, ``1GiB``) and ``B`` alone is bytes; case does not matter, a space may
separate the number from its unit, and a fraction is allowed when it makes whole bytes
(``1.5Gi``). The same text is taken from the command line, the environment and the YAML file.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

#: byte-size units (upper case; ``i`` marks the powers of 1024)
SIZE_UNITS = {
    "": 1,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "KI": 1024,
    "MI": 1024**2,
    "GI": 1024**3,
    "TI": 1024**4,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]I?)?B?", re.IGNORECASE)
SIZE_FORMAT = (
    "an integer number of bytes, or a number with a unit K, M, G, T (powers of 1000) or Ki, Mi,"
    " Gi, Ti (powers of 1024), B optional: 512K, 64Mi, 1GB, 1GiB"
)


def port(v: Any) -> int:
    n = integer(v)
    if not 0 <= n <= 65535:
        raise ValueError("must be a port number 0..65535")
    return n


def integer(v: Any) -> int:
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError("expected an integer")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ValueError("expected an integer") from None


def positive_int(v: Any) -> int:
    n = integer(v)
    if n <= 0:
        raise ValueError("must be a positive integer")
    return n


def non_negative_int(v: Any) -> int:
    n = integer(v)
    if n < 0:
        raise ValueError("must be an integer >= 0")
    return n


def int_range(low: int, high: int) -> Any:
    def parse(v: Any) -> int:
        n = integer(v)
        if not low <= n <= high:
            raise ValueError(f"must be an integer {low}..{high}")
        return n

    return parse


def byte_size(minimum: int = 1, maximum: int | None = None, limit: str = "") -> Any:
    """A parser of byte sizes (see the module's docstring) from ``minimum`` to ``maximum``;
    ``limit`` says why there is a maximum."""

    def parse(v: Any) -> int:
        if isinstance(v, str):
            match = _SIZE.fullmatch(v.strip())
            if match is None:
                raise ValueError(f"expected a size: {SIZE_FORMAT}")
            number, unit = match.group(1), (match.group(2) or "").upper()
            exact = Fraction(number) * SIZE_UNITS[unit]
            if exact.denominator != 1:
                raise ValueError(f"{v.strip()} is not a whole number of bytes")
            n = int(exact)
        else:
            try:
                n = integer(v)
            except ValueError:
                raise ValueError(f"expected a size: {SIZE_FORMAT}") from None
        if n < minimum:
            raise ValueError(f"must be at least {minimum} byte{'s' if minimum != 1 else ''}")
        if maximum is not None and n > maximum:
            raise ValueError(f"must be at most {maximum} bytes{limit}")
        return n

    return parse


def positive_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("must be a positive number")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError("expected a positive number") from None
    if not 0 < x < float("inf"):
        raise ValueError("must be a positive number")
    return x


def choice(*options: str) -> Any:
    def parse(v: Any) -> str:
        # YAML 1.1 reads a bare off/on as false/true.
        s = {False: "off", True: "on"}[v] if isinstance(v, bool) else str(v).strip().lower()
        if s not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return s

    return parse


def switch(v: Any) -> bool:
    """on/off (YAML's bare on/off/true/false are booleans already; env vars are text)."""
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("on", "true", "yes", "1"):
        return True
    if s in ("off", "false", "no", "0"):
        return False
    raise ValueError("must be on or off")


def text(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a non-empty string")
    return v.strip()
