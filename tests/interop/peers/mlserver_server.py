"""Real MLServer peer for the v2proxy interop tests.

Run with the python of the mlserver venv made by setup_peers.sh:

    .cache/peers/mlserver/bin/python tests/interop/peers/mlserver_server.py \
        --http-port 8080 --grpc-port 8081

Serves the model repository ``mlserver_models/`` next to this file (runtimes
in ``runtime.py``) the same way ``mlserver start`` does, but with the server
settings built in memory instead of a settings.json in the repository:

* listens on --host (default 127.0.0.1) for both REST and gRPC,
* the separate Prometheus metrics server (default port 8082) is disabled
  (``metrics_endpoint=None``) so parallel test runs never collide,
* ``parallel_workers=0``: models run in the main process, no worker pool,
* MLServer's scratch folders (.envs, .metrics) go to a temporary directory.

MLServer logs to stdout; stdout is redirected onto stderr here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = os.path.join(HERE, "mlserver_models")


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--models-dir", default=MODELS_DIR)
    p.add_argument("--debug", action="store_true", help="MLServer debug logging")
    return p.parse_args(argv)


def _exit_with_parent() -> None:
    """Stop this server if the process that launched it dies (e.g. a SIGKILLed
    pytest): launch.py passes its pid in V2PROXY_PEER_PARENT_PID."""
    expected = os.environ.get("V2PROXY_PEER_PARENT_PID")
    if not expected or not expected.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(expected):
            time.sleep(1.0)
        print("parent process gone, shutting down", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


async def _serve(args: argparse.Namespace, scratch: str, models_dir: str) -> None:
    from mlserver import MLServer
    from mlserver.repository.factory import ModelRepositoryFactory
    from mlserver.settings import Settings

    settings = Settings(
        debug=args.debug,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        parallel_workers=0,
        metrics_endpoint=None,
        metrics_dir=os.path.join(scratch, "metrics"),
        environments_dir=os.path.join(scratch, "envs"),
        model_repository_root=models_dir,
        load_models_at_startup=True,
    )
    repository = ModelRepositoryFactory.resolve_model_repository(settings)
    models = await repository.list()
    if not models:
        raise SystemExit(
            f"mlserver_server: no model-settings.json under {settings.model_repository_root}"
        )
    server = MLServer(settings)
    await server.start(models)


def main() -> None:
    args = _parse_args(sys.argv[1:])
    _exit_with_parent()
    sys.stdout.flush()
    os.dup2(2, 1)
    # runtime.py lives next to this script; MLServer imports "runtime.X".
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    models_dir = os.path.abspath(args.models_dir)
    with tempfile.TemporaryDirectory(prefix="mlserver-scratch-") as scratch:
        asyncio.run(_serve(args, scratch, models_dir))


if __name__ == "__main__":
    main()
