"""Before serving, each listening port is bound once and let go, so that a port in use (or an
address this host lacks) stops the start with one line naming the option to change, before
grpcio can print its own errors."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable

__all__ = ["ListenError", "cannot_listen", "check_ports", "option_names"]


class ListenError(Exception):
    """A port cannot be listened on; the message is the one line to print."""


def option_names(option: str, env: bool = True) -> str:
    """``--grpc-port`` -> ``--grpc-port / V2PROXY_GRPC_PORT`` (the option alone without ``env``:
    ``reference-server`` reads no environment)."""
    variable = "V2PROXY_" + option.removeprefix("--").replace("-", "_").upper()
    return f"{option} / {variable}" if env else option


def cannot_listen(
    what: str, host: str, port: int, option: str, exc: OSError | None, env: bool
) -> str:
    """The one line for ``what`` (``HTTP``, ``gRPC``) failing to listen on ``host:port``."""
    code = exc.errno if exc is not None else errno.EADDRINUSE
    reason = (exc.strerror if exc is not None else None) or "address already in use"
    if code == errno.EADDRINUSE:
        fix = f"another program holds the port: stop it, or choose another port with {option}"
    elif code == errno.EACCES:
        fix = f"ports below 1024 need privileges: choose another with {option}"
    elif code == errno.EADDRNOTAVAIL:
        fix = "this host has no such address: choose the address with --host"
        option = "--host"
    else:
        fix = f"see {option}"
    fix = fix.replace(option, option_names(option, env))
    address = f"[{host}]" if ":" in host else host
    return f"cannot listen for {what} on {address}:{port}: {reason.lower()}; {fix}"


def check_ports(host: str, ports: Iterable[tuple[str, str, int]], env: bool = True) -> None:
    """Bind each ``(what, option, port)`` on ``host`` (SO_REUSEADDR, as the servers do) and let it
    go; port 0 (any free port) is not checked. Raises :class:`ListenError`."""
    for what, option, port in ports:
        if port == 0:
            continue
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
        except socket.gaierror as exc:
            raise ListenError(
                f"cannot listen on {host}: {exc.strerror};"
                f" choose the address with {option_names('--host', env)}"
            ) from None
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise ListenError(cannot_listen(what, host, port, option, exc, env)) from None
