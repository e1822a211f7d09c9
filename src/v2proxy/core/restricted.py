"""Restricted API groups: which operations a client may use only with a shared header."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

from v2proxy.core.errors import Forbidden

GROUPS = frozenset(
    {
        "health",
        "metadata",
        "inference",
        "shared-memory",
        "model-config",
        "model-repository",
        "statistics",
        "trace",
        "logging",
    }
)
#: shared memory is not among them: ``--client-shm local`` (the default) already keeps it to
#: clients on loopback or a unix socket, the pod's boundary; an operator can still add it.
DEFAULT_GROUPS = frozenset({"model-repository", "logging", "trace"})

# RFC 9110 token; gRPC metadata keys are a subset (lowercase letters, digits, "-_.").
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

Headers = Mapping[str, Any] | Iterable[tuple[str | bytes, str | bytes]]


class AccessPolicy(Protocol):
    """Decides whether a request may use an API group."""

    def restricts(self, group: str) -> bool:
        """Whether ``group`` is restricted at all (else :meth:`check` never refuses it)."""
        ...

    def check(self, group: str, headers: Headers) -> None:
        """Raise a ProxyError (403) when the request may not use ``group``."""
        ...


def parse_groups(value: Any) -> frozenset[str]:
    """``"a,b"`` (or a list) -> the set of groups; ``none``, ``""`` or null -> no group;
    ValueError names an unknown group."""
    if value is None:
        return frozenset()
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    names = [str(item).strip().lower() for item in items]
    names = [n for n in names if n]
    if names == ["none"]:
        return frozenset()
    for name in names:
        if name not in GROUPS:
            known = ", ".join(sorted(GROUPS))
            raise ValueError(f"unknown API group '{name}' (known: {known}; or 'none')")
    return frozenset(names)


def parse_header(value: Any) -> tuple[str, str] | None:
    """``"KEY=VALUE"`` -> ``("key", "VALUE")`` (name lowercased); ``""`` or null -> None."""
    if value is None or str(value).strip() == "":
        return None
    key, sep, secret = str(value).strip().partition("=")
    key, secret = key.strip(), secret.strip()  # HTTP drops a value's surrounding spaces
    if not sep or not key or not secret:
        raise ValueError("must be KEY=VALUE (a header name and a non-empty value)")
    if not _TOKEN.match(key):
        raise ValueError(f"'{key}' is not a valid header name")
    if not secret.isascii() or not secret.isprintable():
        raise ValueError("the header value must be printable ASCII")
    return key.lower(), secret


@dataclass(frozen=True, slots=True, repr=False)
class RestrictedPolicy:
    """The restricted groups and the header (lowercase name, exact value) that opens them."""

    groups: frozenset[str] = DEFAULT_GROUPS
    header: tuple[str, str] | None = None

    def __repr__(self) -> str:  # never shows the header's value (settings get logged)
        header = f"('{self.header[0]}', '***')" if self.header else "None"
        return f"RestrictedPolicy(groups={sorted(self.groups)}, header={header})"

    @classmethod
    def parse(cls, groups: Any = None, header: Any = None) -> RestrictedPolicy:
        """Build from the setting texts (see :func:`parse_groups`, :func:`parse_header`)."""
        return cls(parse_groups(groups), parse_header(header))

    def restricts(self, group: str) -> bool:
        """Whether requests for ``group`` need the header (False for unrestricted groups)."""
        return group in self.groups

    def check(self, group: str, headers: Headers) -> None:
        """Raise Forbidden unless ``group`` is open or ``headers`` carry the configured header."""
        if group not in self.groups:
            return
        if self.header is None:
            raise Forbidden(
                f"This API is restricted: '{group}' is refused unless --restricted-api-header"
                " KEY=VALUE is set and the request carries that header"
            )
        key, secret = self.header
        expected = secret.encode()
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        ok = False
        for name, value in pairs:
            name_text = name.decode("latin-1") if isinstance(name, bytes) else str(name)
            if name_text.lower() != key:
                continue
            got = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
            # No early exit: every occurrence is compared in constant time.
            ok |= hmac.compare_digest(got.strip(b" \t"), expected)
        if not ok:
            raise Forbidden(f"This API is restricted, expecting header '{self.header[0]}'")


#: the policy that restricts nothing (a frontend built without one)
OPEN = RestrictedPolicy(frozenset(), None)


#: path words -> the API group a passed-through request belongs to, first match wins; matched
#: on the percent-decoded, lowercased path anywhere in it, so that no spelling of a restricted
#: path (``/v2/%72epository/...``, a trailing slash, a doubled one) slips through as another
_PATH_GROUPS = (
    ("repository", "model-repository"),
    ("sharedmemory", "shared-memory"),
    ("logging", "logging"),
    ("trace", "trace"),
    ("stats", "statistics"),
    ("/config", "model-config"),
    ("/models/", "inference"),
)


def passthrough_group(target: str) -> str:
    """The API group of a request passed through to the backend: a REST request that no row of
    the route table matches (a spelling of a route's path among them)."""
    path = unquote(target.split("?", 1)[0]).lower()
    for word, group in _PATH_GROUPS:
        if word in path:
            return group
    return "metadata"
