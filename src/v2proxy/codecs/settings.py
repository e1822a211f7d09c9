"""Trace and log settings (Triton's trace and logging extensions): the updates a client may
make, checked."""

from __future__ import annotations

from typing import Any

from v2proxy.core.errors import InvalidRequest

TRACE_LEVELS = frozenset({"OFF", "TIMESTAMPS", "TENSORS"})
_TRACE_STRINGS = frozenset(
    {"trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode"}
)
_LOG_BOOLS = frozenset({"log_info", "log_warning", "log_error"})
_LOG_STRINGS = frozenset({"log_file", "log_format"})
LOG_FORMATS = frozenset({"default", "ISO8601"})
INT32_MAX = 2**31 - 1


def trace_update(update: dict[str, Any]) -> dict[str, Any]:
    """The checked trace settings update (``trace_level``: a list of levels; others strings)."""
    checked: dict[str, Any] = {}
    for key, value in update.items():
        if value is None:
            continue
        if key == "trace_level":
            levels = value if isinstance(value, list) else [value]
            if not levels or any(v not in TRACE_LEVELS for v in levels):
                raise InvalidRequest(
                    "Invalid value for 'trace_level': expected a list of"
                    f" {', '.join(sorted(TRACE_LEVELS))}"
                )
            checked[key] = list(levels)
        elif key in _TRACE_STRINGS:
            one = value[0] if isinstance(value, list) and len(value) == 1 else value  # gRPC's
            if not isinstance(one, str):
                raise InvalidRequest(f"Invalid value for '{key}': expected a string")
            checked[key] = one
        else:
            raise InvalidRequest(f"Unknown trace setting '{key}'")
    return checked


def log_update(update: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    """The checked log settings update (not ``strict``: unknown settings are left as given)."""
    checked: dict[str, Any] = {}
    for key, value in update.items():
        if value is None:
            continue
        if key in _LOG_BOOLS:
            ok = isinstance(value, bool)
            expected = "a boolean"
        elif key in _LOG_STRINGS:
            ok = isinstance(value, str) and (key != "log_format" or value in LOG_FORMATS)
            expected = "default or ISO8601" if key == "log_format" else "a string"
        elif key == "log_verbose_level":
            ok = type(value) is int and 0 <= value <= INT32_MAX
            expected = f"an integer in [0, {INT32_MAX}]"
        elif strict:
            raise InvalidRequest(f"Unknown log setting '{key}'")
        else:
            ok, expected = True, ""
        if not ok:
            raise InvalidRequest(f"Invalid value for '{key}': expected {expected}")
        checked[key] = value
    return checked
