"""``v2proxy inject``: the options (added to the CLI by :func:`add_parser`) and the start."""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
from pathlib import Path
from typing import Any

import yaml

from v2proxy.inject.settings import MODES, AnnotationError, SidecarSettings, load_defaults


def add_parser(sub: Any, version: str) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "inject",
        help="run the admission webhook that injects v2proxy into annotated pods",
        description="Serve a Kubernetes mutating admission webhook (AdmissionReview v1, POST"
        " /mutate over HTTPS; GET /healthz) that adds the v2proxy sidecar, a shared /dev/shm"
        ' and the grace period to pods annotated v2proxy.io/inject: "true". Per-pod'
        " annotations v2proxy.io/backend, v2proxy.io/ports, v2proxy.io/client-shm, ... override"
        " the defaults (docs/deployment.md).",
    )
    p.add_argument("--tls-cert", required=True, metavar="FILE", help="PEM certificate chain")
    p.add_argument("--tls-key", required=True, metavar="FILE", help="PEM private key")
    p.add_argument("--port", type=int, default=8443, metavar="PORT", help="default 8443")
    p.add_argument("--host", default="0.0.0.0", metavar="ADDRESS", help="default 0.0.0.0")
    p.add_argument(
        "--sidecar-mode",
        choices=MODES,
        help="native (an init container with restartPolicy: Always, Kubernetes >= 1.29) or"
        " classic (a plain container) for pods without v2proxy.io/sidecar-mode (default:"
        " the sidecar config's mode, else native)",
    )
    p.add_argument(
        "--sidecar-config",
        metavar="FILE",
        help="YAML with the sidecar's defaults (image, backend, httpPort, grpcPort, clientShm,"
        " backendShm, logFormat, drainTimeout, preStopSleepSeconds, shmSizeLimit, extraArgs,"
        " resources, ...), as the Helm chart renders it",
    )
    p.add_argument(
        "--image", metavar="IMAGE", help=f"the sidecar's image (default v2proxy:{version})"
    )
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def main(args: dict[str, Any], version: str) -> int:
    try:
        defaults = _defaults(args, version)
        from v2proxy.inject.server import Certificate

        Certificate(args["tls_cert"], args["tls_key"])  # fail now, with one line
    except (AnnotationError, OSError, ssl.SSLError, yaml.YAMLError) as exc:
        print(f"v2proxy inject: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args["log_level"].upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from v2proxy.inject.server import serve

    serve(args["host"], args["port"], args["tls_cert"], args["tls_key"], defaults)
    return 0


def _defaults(args: dict[str, Any], version: str) -> SidecarSettings:
    base = SidecarSettings(image=f"v2proxy:{version}")
    if args.get("sidecar_config"):
        path = args["sidecar_config"]
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise AnnotationError(f"{path}: must hold a mapping of sidecar settings")
        try:
            base = load_defaults(data, base)
        except AnnotationError as exc:
            raise AnnotationError(f"{path}: {exc}") from None
    flags = {"image": args.get("image"), "mode": args.get("sidecar_mode")}
    return load_defaults({k: v for k, v in flags.items() if v}, base)
