"""Several addresses behind one backend URL: the endpoints a backend spreads its calls over.

A backend URL names one or more ``host:port``; a host name (a headless Service) stands for every
address it resolves to, one client per address. :class:`Endpoints`:

- **resolves** the names at start and every ``resolve_every`` seconds; a name that does not
  resolve (yet) is used as is, and one that stops resolving keeps its last addresses;
- **picks** the endpoint with the fewest calls outstanding, ties going round-robin;
- judges each endpoint by what its calls did (passive health, no probes). An unreachable one is
  out of rotation at once; one that misbehaves (timeout, malformed answer, 5xx) after
  :data:`EJECT_AFTER` failures in a row, unless that would take out more than
  :data:`MAX_EJECTED_SHARE` of them or the last one. Out means for a back-off that doubles per
  ejection; one answer puts it back. When every endpoint is out, the one due back first is tried.

Whether a failed call may go to another endpoint is the backend's decision (an inference is
never sent twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

from v2proxy.core.errors import BackendUnavailable

log = logging.getLogger(__name__)

#: back-offs in seconds, doubled per ejection in a row
BACKOFF_S: Final = 0.5
BACKOFF_MAX_S: Final = 10.0
EJECT_AFTER: Final = 3
#: longer for misbehaving: the call that tries it again may cost a whole timeout
EJECT_BACKOFF_S: Final = 5.0
EJECT_BACKOFF_MAX_S: Final = 60.0
#: Envoy's max_ejection_percent, as a share
MAX_EJECTED_SHARE: Final = 0.5
OUTCOMES: Final = ("ok", "unreachable", "timeout", "malformed", "5xx")

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class HostPort:
    """One ``host:port`` of a backend URL, as written (a name or an IP literal, no brackets)."""

    host: str
    port: int

    @property
    def authority(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def split_hosts(netloc: str) -> list[HostPort]:
    """The host:port of a backend URL's authority, separated by commas (already checked)."""
    out = []
    for one in netloc.rpartition("@")[2].split(","):
        host, _, port = one.rpartition(":")
        out.append(HostPort(host.strip("[]"), int(port)))
    return out


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Cell(Protocol):
    def inc(self, amount: float = 1.0) -> None: ...


class EndpointCells(Protocol):
    """Where the endpoints report (``--metrics``): the cells of one endpoint label."""

    def calls(self, endpoint: str, outcome: str) -> _Cell:
        """``outcome``: one of :data:`OUTCOMES`."""
        ...

    def up(self, endpoint: str, value: float) -> None: ...

    def forget(self, endpoint: str) -> None: ...


class Endpoint(Generic[C]):
    """One address of the backend and its client."""

    __slots__ = (
        "_cells",
        "_ok",
        "address",
        "client",
        "down_until",
        "ejections",
        "failures",
        "label",
        "name",
        "outstanding",
    )

    def __init__(self, name: HostPort, address: str, client: C, cells: dict[str, _Cell]) -> None:
        #: the URL's host:port (Host header, TLS server name)
        self.name = name
        #: an IP literal, or the name when it did not resolve
        self.address = address
        self.label = HostPort(address, name.port).authority
        self.client = client
        self.outstanding = 0
        self.failures = 0
        self.ejections = 0
        #: loop time before which it is out of rotation (0.0: in)
        self.down_until = 0.0
        self._cells = cells
        self._ok = cells["ok"]


class Endpoints(Generic[C]):
    """The endpoints of one backend (see the module's docstring)."""

    def __init__(
        self,
        names: Sequence[HostPort],
        make: Callable[[HostPort, str], C],
        close: Callable[[C], Awaitable[None]],
        *,
        resolve_every: float = 30.0,
        cells: EndpointCells | None = None,
        resolver: Callable[[str, int], Awaitable[list[str]]] | None = None,
    ) -> None:
        if not names:
            raise ValueError("a backend needs at least one host:port")
        self.names = tuple(names)
        self._make = make
        self._close = close
        self._resolve_every = resolve_every
        self._cells = cells
        self._resolver = resolver or _getaddrinfo
        self.all: list[Endpoint[C]] = []
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._last: dict[HostPort, list[str]] = {}

    @property
    def one_server(self) -> bool:
        """Whether the endpoints are one server (one address, or all loopback): staging needs
        it, since a region registered with one server is unknown to the next."""
        eps = self.all
        if len(self.names) != 1:
            return False
        return len(eps) <= 1 or all(_loopback(ep.address) for ep in eps)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.resolve()
        if self._resolve_every > 0 and not all(is_ip(n.host) for n in self.names):
            self._task = asyncio.create_task(self._every())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        gone, self.all = self.all, []
        for ep in gone:
            self._forget(ep)
            await self._close(ep.client)

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(self._resolve_every)
            try:
                await self.resolve()
            except Exception:
                log.exception("re-resolving the backend's addresses failed")

    async def resolve(self) -> None:
        """Resolve every name and bring the endpoints in line with the addresses found."""
        wanted: list[tuple[HostPort, str]] = []
        for name in self.names:
            if is_ip(name.host):
                addresses = [name.host]
            else:
                try:
                    addresses = await self._resolver(name.host, name.port)
                except OSError as exc:
                    addresses = []
                    log.warning("backend host %s does not resolve: %s", name.host, exc)
                if not addresses:
                    addresses = self._last.get(name) or [name.host]
                else:
                    self._last[name] = addresses
            wanted.extend((name, a) for a in addresses)
        have = {(ep.name, ep.address): ep for ep in self.all}
        kept: list[Endpoint[C]] = []
        for key in dict.fromkeys(wanted):
            ep = have.pop(key, None)
            if ep is None:
                ep = self._endpoint(*key)
                log.info("backend endpoint %s joins (%s)", ep.label, key[0].authority)
            kept.append(ep)
        self.all = kept
        for ep in have.values():
            log.info("backend endpoint %s leaves (%s)", ep.label, ep.name.authority)
            self._forget(ep)
            await self._close(ep.client)

    def _endpoint(self, name: HostPort, address: str) -> Endpoint[C]:
        client = self._make(name, address)
        label = HostPort(address, name.port).authority
        cells = self._cells
        if cells is None:
            mine: dict[str, _Cell] = dict.fromkeys(OUTCOMES, _NULL)
        else:
            mine = {outcome: cells.calls(label, outcome) for outcome in OUTCOMES}
            cells.up(label, 1.0)
        return Endpoint(name, address, client, mine)

    def _forget(self, ep: Endpoint[C]) -> None:
        if self._cells is not None:
            self._cells.forget(ep.label)

    def pick(self, tried: Iterable[Endpoint[C]] = ()) -> Endpoint[C] | None:
        """The endpoint for the next call, leaving out ``tried``; None when none is left."""
        eps = self.all
        n = len(eps)
        if n == 1:
            ep = eps[0]
            return None if tried and ep in tried else ep
        loop = self._loop
        now = loop.time() if loop is not None else 0.0
        start = self._next
        self._next = (start + 1) % n if n else 0
        best: Endpoint[C] | None = None
        due: Endpoint[C] | None = None
        for i in range(n):
            ep = eps[(start + i) % n]
            if tried and ep in tried:
                continue
            if ep.down_until > now:
                if due is None or ep.down_until < due.down_until:
                    due = ep
            elif best is None or ep.outstanding < best.outstanding:
                best = ep
        return best if best is not None else due

    def next(self, tried: Sequence[Endpoint[C]], last: Exception | None) -> Endpoint[C]:
        """:meth:`pick`, raising ``last`` (or BackendUnavailable) when none is left."""
        ep = self.pick(tried)
        if ep is None:
            if last is None:
                raise BackendUnavailable("the backend has no endpoint")
            raise last
        return ep

    def unpick(self) -> None:
        """The last :meth:`pick` was not used: the rotation steps back."""
        n = len(self.all)
        if n > 1:
            self._next = (self._next - 1) % n

    def ok(self, ep: Endpoint[C]) -> None:
        """The endpoint answered (anything but a 5xx): in rotation, record cleared."""
        ep._ok.inc()
        if ep.failures:
            ep.failures = ep.ejections = 0
            if ep.down_until:
                ep.down_until = 0.0
                log.info("backend endpoint %s answers again", ep.label)
                if self._cells is not None:
                    self._cells.up(ep.label, 1.0)

    def answered(self, ep: Endpoint[C], status: int) -> None:
        if status >= 500:
            self.failed(ep, "5xx")
        elif ep.failures:
            self.ok(ep)
        else:  # (ok, written out for an endpoint with no failure on record)
            ep._ok.inc()

    def failed(self, ep: Endpoint[C], outcome: str = "unreachable") -> None:
        """A call to the endpoint failed with ``outcome``; it may go out of rotation."""
        ep._cells[outcome].inc()
        ep.failures += 1
        if outcome != "unreachable" and (ep.failures < EJECT_AFTER or not self._may_eject(ep)):
            return
        ep.ejections += 1
        if outcome == "unreachable":
            backoff = min(BACKOFF_S * 2 ** (ep.ejections - 1), BACKOFF_MAX_S)
        else:
            backoff = min(EJECT_BACKOFF_S * 2 ** (ep.ejections - 1), EJECT_BACKOFF_MAX_S)
        loop = self._loop
        first = not ep.down_until
        ep.down_until = (loop.time() if loop is not None else 0.0) + backoff
        if first:
            log.warning(
                "backend endpoint %s out of rotation for %g s (%d failures in a row, the last: %s)",
                ep.label,
                backoff,
                ep.failures,
                outcome,
            )
            if self._cells is not None:
                self._cells.up(ep.label, 0.0)

    def _may_eject(self, ep: Endpoint[C]) -> bool:
        """Whether one more endpoint may go out for misbehaving."""
        loop = self._loop
        now = loop.time() if loop is not None else 0.0
        eps = self.all
        out = sum(1 for e in eps if e is not ep and e.down_until > now)
        if ep.down_until > now:
            return True
        return out < len(eps) - 1 and out < MAX_EJECTED_SHARE * len(eps)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class _NullCell:
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        return None


_NULL: Final = _NullCell()


async def _getaddrinfo(host: str, port: int) -> list[str]:
    """Every address of ``host`` for TCP, in the resolver's order, each once."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
