"""Command-line parsing only: ``v2proxy serve``, ``v2proxy reference-server`` and ``v2proxy
inject`` (the admission webhook; its options live in v2proxy.inject.command).

Every option of ``serve`` is also a YAML key of ``--config FILE`` and an environment variable
``V2PROXY_<NAME>`` (command line > environment > file > defaults; see v2proxy.config). The
options' values are taken here as text and parsed by v2proxy.config's parsers, the same for the
three sources: a bad value stops the start with one line naming the option, exit status 2
(``v2proxy: --max-body-size=lots: invalid value for 'max_body_size': ...``). What argparse itself
refuses (an unknown option, a missing value) is one line too, without the usage; ``--help`` is
unchanged.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from v2proxy import __version__
from v2proxy.config import OTHER_VARIABLES, load_settings
from v2proxy.config_sections import ConfigError
from v2proxy.inject.command import add_parser as add_inject_parser
from v2proxy.restricted import GROUPS

_LATER = "takes effect with the shared-memory extension"
#: what a size option takes (v2proxy.config_values.byte_size: K, M, G powers of 1000, Ki, Mi, Gi
#: powers of 1024, B optional)
_SIZE = "bytes, or with a unit: 512K, 64Mi, 1G, 1GiB"


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line ``v2proxy: <message>`` (exit status 2) instead of
    the usage followed by the error; the subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        self.exit(2, f"v2proxy: {line} (see {self.prog} --help)\n")


def _common(p: argparse.ArgumentParser, http_default: int, restricted_default: str) -> None:
    p.add_argument("--http-port", metavar="PORT", help=f"HTTP port (default {http_default})")
    p.add_argument("--grpc-port", metavar="PORT", help=f"gRPC port (default {http_default + 1})")
    p.add_argument(
        "--host", metavar="ADDRESS", help="address to listen on, both ports (default 0.0.0.0)"
    )
    p.add_argument(
        "--grpc-max-message-size",
        metavar="SIZE",
        help=f"largest gRPC message, both ways ({_SIZE}; default 2 GiB - 1, the most gRPC allows)",
    )
    p.add_argument(
        "--max-input-size",
        metavar="SIZE",
        help="largest JSON header, JSON-decoded input, raw body or decompressed body"
        f" ({_SIZE}; default 64Mi, like Triton's --http-max-input-size)",
    )
    p.add_argument(
        "--max-body-size",
        metavar="SIZE",
        help=f"hard cap on any HTTP request body, 413 beyond it ({_SIZE}; default 2 GiB - 1)",
    )
    p.add_argument(
        "--max-tensors",
        metavar="N",
        help="most inputs, and most requested outputs, one inference request may name (400"
        " beyond it; default 1024)",
    )
    p.add_argument(
        "--max-concurrency",
        metavar="N",
        help="most requests in progress at once per worker, REST and gRPC together (a stream"
        " counts as one while open); beyond it 503 with Retry-After, gRPC RESOURCE_EXHAUSTED;"
        " health, metadata and /metrics are never refused; 0: no limit (default 1024)",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="PEM certificate chain: serve HTTPS and gRPC over TLS on both ports, with"
        " --tls-key (default: no TLS)",
    )
    p.add_argument(
        "--tls-key",
        metavar="FILE",
        help="PEM private key of --tls-cert, unencrypted (default none)",
    )
    p.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="PEM CA bundle: require client certificates signed by one of these CAs on both"
        " ports (mutual TLS; default: no client certificates asked)",
    )
    p.add_argument(
        "--client-shm",
        metavar="off|local|on",
        help="who may register and use shared memory (register, status, unregister and every"
        " inference naming a region): off, local (default: peers on loopback or a unix socket,"
        f" the pod's boundary) or on (anyone); {_LATER}",
    )
    p.add_argument(
        "--max-shm-regions",
        metavar="N",
        help="most shared-memory regions registered at once (each holds one file descriptor;"
        " kept to a quarter of the open-file limit); beyond it a registration gets 400"
        " (default 256)",
    )
    p.add_argument(
        "--restricted-api",
        metavar="GROUPS",
        help="comma-separated API groups refused unless the request carries"
        f" --restricted-api-header, or 'none' (default {restricted_default}; groups:"
        f" {', '.join(sorted(GROUPS))})",
    )
    p.add_argument(
        "--restricted-api-header",
        metavar="KEY=VALUE",
        help="requests carrying header KEY with exactly VALUE may use the restricted groups"
        " (default unset: restricted groups are refused to everyone); prefer the variable"
        " V2PROXY_RESTRICTED_API_HEADER, as command lines are visible to other users",
    )
    p.add_argument(
        "--client-header-timeout",
        metavar="SECONDS",
        help="a client must send a request's whole head within this from its first byte, and"
        " a new connection its first request (408 and closed beyond it; default 10)",
    )
    p.add_argument(
        "--client-idle-timeout",
        metavar="SECONDS",
        help="an idle keep-alive connection between requests is closed after this (default 5)",
    )
    p.add_argument(
        "--client-body-timeout",
        metavar="SECONDS",
        help="a request body that stops arriving for this long gets 408 and the connection is"
        " closed; also the longest a client may take to read an answer (default 60)",
    )
    p.add_argument(
        "--drain-timeout",
        metavar="SECONDS",
        help="on SIGTERM/SIGINT: stop accepting, turn readiness false, and let requests in"
        " flight (REST, gRPC, streams) finish for up to this long before closing (default 30)",
    )
    p.add_argument("--event-loop", metavar="uvloop|asyncio", help="event loop (default uvloop)")
    p.add_argument(
        "--workers",
        metavar="N",
        help="processes serving the same ports (SO_REUSEPORT), supervised by the parent"
        " (default 1)",
    )
    p.add_argument(
        "--log-level",
        metavar="debug|info|warning|error",
        help="log level (default info)",
    )
    p.add_argument(
        "--log-format",
        metavar="text|json",
        help="text lines, or json: one JSON object per line with ts, level, logger, message"
        " and the request's fields (default text)",
    )
    p.add_argument(
        "--access-log",
        nargs="?",
        const="on",
        metavar="on|off",
        help="one INFO line per request: method, path, status, duration, bytes (default off;"
        " --access-log alone turns it on)",
    )
    p.add_argument(
        "--metrics",
        metavar="on|off",
        help="Prometheus metrics on GET /metrics of the HTTP port; off: nothing is recorded"
        " and /metrics answers 404 (default on)",
    )


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog="v2proxy",
        description="v2proxy: a sidecar that makes every KServe v2 / Open Inference Protocol"
        " client work with every model server (Triton, KServe ModelServer, MLServer, ...)."
        " It sits beside the model server and transcodes between JSON, binary tensors, raw"
        " bodies and gRPC, adds what the backend lacks (classification, binary tensors) and"
        " exports Prometheus metrics on /metrics. 'v2proxy serve' runs it (in front of the"
        " builtin demo models by default); 'v2proxy serve --help' lists every option with its"
        " default. Every option is also a YAML key of --config FILE and an environment"
        " variable V2PROXY_<NAME> (command line > environment > file > defaults).",
    )
    top.add_argument("--version", action="version", version=f"v2proxy {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the proxy in front of a model server",
        description="Run the proxy in front of a model server. Every option is also a YAML key"
        " of --config FILE (http_port: 9000) and an environment variable (V2PROXY_HTTP_PORT);"
        " command line > environment > file > defaults. A SIZE is a number of bytes or a"
        " number with a unit: K, M, G, T are powers of 1000, Ki, Mi, Gi, Ti powers of 1024, B"
        " optional (512K, 64Mi, 1GB, 1GiB), in every source. Any other V2PROXY_* variable"
        " stops the start (a misspelt setting), except V2PROXY_CONFIG and those of v2proxy's"
        f" own tests and benchmarks ({', '.join(sorted(OTHER_VARIABLES - {'V2PROXY_CONFIG'}))}),"
        " which are ignored.",
    )
    serve.add_argument(
        "--backend",
        metavar="URL",
        help="'builtin' (default: the reference models in-process), http://host:port or"
        " https://host:port (a v2 REST server), grpc://host:port or grpcs://host:port (a v2"
        " gRPC server; grpcs: over TLS) or mindie://host:port (a MindIE server's native"
        " /infer, served as the v2 model mindie.model, default llm)",
    )
    serve.add_argument(
        "--backend-ca",
        metavar="FILE",
        help="PEM CA bundle the https:// or grpcs:// backend's certificate must chain to"
        " (default: the system's trust store); its host name is always checked",
    )
    serve.add_argument(
        "--backend-cert",
        metavar="FILE",
        help="PEM client certificate presented to an https:// or grpcs:// backend, with"
        " --backend-key (default: none)",
    )
    serve.add_argument(
        "--backend-key",
        metavar="FILE",
        help="PEM private key of --backend-cert, unencrypted (default none)",
    )
    serve.add_argument(
        "--backend-encoding",
        metavar="auto|json|binary",
        help="how tensors are sent to a REST backend (default auto: ask its /v2 extensions)",
    )
    serve.add_argument(
        "--backend-timeout",
        metavar="SECONDS",
        help="seconds to wait on the backend per request, 504 beyond it (default 60)",
    )
    serve.add_argument(
        "--backend-connect-timeout",
        metavar="SECONDS",
        help="seconds to connect to the backend, 503 beyond it (default 5)",
    )
    serve.add_argument(
        "--backend-connections",
        metavar="N",
        help="most connections open to a REST backend at once (default 100)",
    )
    serve.add_argument(
        "--backend-shm",
        metavar="off|system|auto",
        help="stage large tensors in the backend's own shared memory: off, system (always) or"
        " auto (default: when the backend has the extension and shares /dev/shm)",
    )
    serve.add_argument(
        "--backend-shm-threshold",
        metavar="SIZE",
        help="inputs and outputs of at least this size are staged in the backend's shared"
        f" memory ({_SIZE}; default 64Ki)",
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file with the same keys (underscores: backend_timeout), plus per-model"
        " settings (models: NAME: outputs: OUTPUT: labels: FILE) and the mindie: section"
        " (also V2PROXY_CONFIG)",
    )
    _common(serve, 9000, "model-repository,logging,trace")

    ref = sub.add_parser(
        "reference-server",
        help="serve the builtin reference models as a standalone v2 server",
        description="Serve the builtin reference models as a standalone v2 server (REST with"
        " binary tensors, gRPC). Environment variables are not read.",
    )
    _common(ref, 8000, "none, like Triton")
    add_inject_parser(sub, __version__)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    command = args.pop("command")
    if command == "inject":
        from v2proxy.inject.command import main as inject_main

        return inject_main(args, __version__)
    try:
        if command == "reference-server":
            settings = load_settings(
                args,
                None,
                env={},
                http_port=8000,
                backend="builtin",
                server_name="v2proxy-reference",
                restricted_api="none",
            )
        else:
            settings = load_settings(args, args.get("config"))
    except ConfigError as exc:
        print(f"v2proxy: {exc}", file=sys.stderr)
        return 2
    from v2proxy.app import run

    run(settings)
    return 0
