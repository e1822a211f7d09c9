"""Parsers of single setting values (``ValueError`` with the reason, which config.py turns into
one line naming the setting and where it came from). Pure: no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any
from urllib.parse import urlsplit

MiB = 1024 * 1024

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
    """A parser of byte sizes from ``minimum`` to ``maximum``;
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


def _finite(v: Any, words: str, low: float, low_ok: bool) -> float:
    """A finite number above ``low`` (or equal to it, ``low_ok``); ``words`` name what it must
    be in the errors."""
    if isinstance(v, bool):
        raise ValueError(f"must be {words}")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"expected {words}") from None
    if not (x > low or (low_ok and x == low)) or x == float("inf"):  # NaN: neither
        raise ValueError(f"must be {words}")
    return x


def positive_float(v: Any) -> float:
    return _finite(v, "a positive number", 0.0, False)


def non_negative_float(v: Any) -> float:
    return _finite(v, "a number, 0 or more", 0.0, True)


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


@dataclass(frozen=True, slots=True)
class BackendTarget:
    """Where the model server is: ``kind`` is builtin, http, https (``url`` the base URL), grpc
    or mindie (``url`` is then host:port); ``tls``: https://, grpcs:// (kind grpc) or mindies://
    (kind mindie: MindIE's server speaks HTTPS by default)."""

    kind: str
    url: str = ""
    tls: bool = False

    @property
    def display(self) -> str:
        """The backend as logs show it, always with its scheme: ``builtin``, the http(s) URL,
        ``grpc://``, ``grpcs://``, ``mindie://`` or ``mindies://`` host:port."""
        if self.kind in ("grpc", "mindie"):
            return f"{self.kind}{'s' if self.tls else ''}://{self.url}"
        return self.url or self.kind


#: the port an example names when a backend URL has none (the servers' usual ones)
_EXAMPLE_PORT = {"http": 8000, "https": 8000, "grpc": 8001, "grpcs": 8001, "mindie": 1025}
_EXAMPLE_PORT["mindies"] = _EXAMPLE_PORT["mindie"]


def parse_backend(v: Any) -> BackendTarget:
    """A backend URL; its host:port may be a comma-separated list (several endpoints,
    ``grpc://10.0.0.1:8001,10.0.0.2:8001``), each with its port."""
    text = str(v).strip()
    if text == "builtin":
        return BackendTarget("builtin")
    parts = urlsplit(text)
    addresses = parts.netloc.rpartition("@")[2].split(",")
    if parts.scheme not in _EXAMPLE_PORT or (len(addresses) == 1 and not parts.hostname):
        raise ValueError(
            "must be 'builtin', http://host:port or https://host:port (a v2 REST server),"
            " grpc://host:port or grpcs://host:port (a v2 gRPC server) or mindie://host:port or"
            " mindies://host:port (a MindIE server's native /infer); several host:port of one"
            " backend separated by commas"
        )
    if len(addresses) > 1 and parts.scheme in ("mindie", "mindies"):
        raise ValueError("names several host:port: a MindIE backend is one server")
    for address in addresses:
        _check_address(parts.scheme, address)
    if len(set(addresses)) != len(addresses):
        raise ValueError("names one host:port more than once")
    if parts.scheme in ("grpc", "grpcs", "mindie", "mindies"):
        secure = parts.scheme in ("grpcs", "mindies")
        kind = parts.scheme.removesuffix("s") if secure else parts.scheme
        return BackendTarget(kind, parts.netloc, secure)
    return BackendTarget(parts.scheme, text.rstrip("/"), parts.scheme == "https")


def _check_address(scheme: str, address: str) -> None:
    """One host:port of a backend URL: a host and a port 1..65535."""
    end = address.index("]") + 1 if address.startswith("[") and "]" in address else 0
    host, _, given = address[end:].partition(":")
    example = f"e.g. {scheme}://{address[:end] or host or 'host'}:{_EXAMPLE_PORT[scheme]}"
    one = urlsplit(f"{scheme}://{address}")
    if not one.hostname:
        raise ValueError(f"has an empty host in '{address}': {example}")
    try:
        port_number = one.port
    except ValueError:  # not a number, or beyond 65535
        port_number = -1
    if port_number is None:
        raise ValueError(f"has no port: give host:port, {example}")
    if not 0 < port_number <= 65535:
        raise ValueError(f"port '{given}' is not a port number 1..65535 ({example})")
