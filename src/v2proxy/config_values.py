"""Parsers of single setting values (``ValueError`` with the reason, which config.py turns into
one line naming the setting and where it came from). Pure: no I/O."""

from __future__ import annotations

from typing import Any


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
