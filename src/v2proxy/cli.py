"""Command-line parsing only: ``v2proxy serve`` and ``v2proxy reference-server``.

Every option of ``serve`` is also a YAML key of ``--config FILE`` and an environment variable
``V2PROXY_<NAME>`` (command line > environment > file > defaults; see v2proxy.config).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from v2proxy import __version__
from v2proxy.config import ConfigError, load_settings


def _common(p: argparse.ArgumentParser, http_default: int) -> None:
    p.add_argument("--http-port", type=int, help=f"HTTP port (default {http_default})")
    p.add_argument("--grpc-port", type=int, help=f"gRPC port (default {http_default + 1})")
    p.add_argument(
        "--grpc-max-message-size",
        type=int,
        help="largest gRPC message in bytes, both ways (default 2 GiB - 1)",
    )
    p.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    p.add_argument(
        "--max-input-size",
        type=int,
        help="largest JSON header, JSON-decoded input, raw body or decompressed body in bytes"
        " (default 64 MiB, like Triton's --http-max-input-size)",
    )
    p.add_argument(
        "--max-body-size",
        type=int,
        help="hard cap on any HTTP request body in bytes (default 2 GiB - 1)",
    )
    p.add_argument("--event-loop", choices=("uvloop", "asyncio"), help="default uvloop")
    p.add_argument(
        "--workers",
        type=int,
        help="processes serving the same ports (SO_REUSEPORT); default 1",
    )
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="v2proxy", description=__doc__)
    top.add_argument("--version", action="version", version=f"v2proxy {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy in front of a model server")
    serve.add_argument(
        "--backend",
        help="'builtin' (default: the reference models in-process), http://host:port (a v2 REST"
        " server) or grpc://host:port (a v2 gRPC server)",
    )
    serve.add_argument(
        "--backend-encoding",
        choices=("auto", "json", "binary"),
        help="how tensors are sent to a REST backend (default auto: ask its /v2 extensions)",
    )
    serve.add_argument("--backend-timeout", type=float, help="seconds per backend request")
    serve.add_argument("--config", help="YAML file with the same keys and per-model settings")
    _common(serve, 9000)

    ref = sub.add_parser(
        "reference-server", help="serve the builtin reference models as a standalone v2 server"
    )
    _common(ref, 8000)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    command = args.pop("command")
    try:
        if command == "reference-server":
            settings = load_settings(
                args,
                None,
                env={},
                http_port=8000,
                backend="builtin",
                server_name="v2proxy-reference",
            )
        else:
            settings = load_settings(args, args.get("config"))
    except ConfigError as exc:
        print(f"v2proxy: {exc}", file=sys.stderr)
        return 2
    from v2proxy.app import run

    run(settings)
    return 0
