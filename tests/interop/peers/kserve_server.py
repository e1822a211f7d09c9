"""Real KServe ModelServer peer for the v2proxy interop tests.

Run with the python of the kserve venv made by setup_peers.sh:

    .cache/peers/kserve/bin/python tests/interop/peers/kserve_server.py \
        --http-port 8080 --grpc-port 8081

Hosts four tiny v2 models written against KServe's own v2 API
(kserve.Model + InferRequest / InferResponse / InferOutput), so REST
/v2/models/{m}/infer and the gRPC GRPCInferenceService both go through
KServe's native encoding (binary vs JSON outputs, requested outputs, ...):

    simple           INT32 INPUT0, INPUT1 [N,16] or [16] -> OUTPUT0 = a+b, OUTPUT1 = a-b
    simple_identity  BYTES INPUT0 [-1]                  -> OUTPUT0 (same bytes)
    identity_fp32    FP32  INPUT0 [-1]                  -> OUTPUT0 (same values)
    identity_fp16    FP16  INPUT0 [-1]                  -> OUTPUT0 (same values)

and two FP16 identities answering as some hand-written KServe models do:

    identity_fp16_flag      honours only the request's binary_data_output (its response
                            gets use_binary_outputs but not the requested outputs)
    identity_fp16_json_out  honours neither (KServe's custom-model example builds its
                            InferResponse from the outputs alone): over REST every answer
                            is KServe's "Sending FP16 data via JSON is not supported.
                            Please use the binary data format for output OUTPUT0"

Everything is logged to stderr (stdout is redirected onto stderr).
KServe 0.21 hard-codes its listen addresses (HTTP 0.0.0.0, gRPC [::]);
with --host (default 127.0.0.1) this script narrows both to loopback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; '' keeps KServe's own "
        "0.0.0.0 / [::] defaults)",
    )
    return p.parse_args(argv)


ARGS = _parse_args(sys.argv[1:])
# kserve.model_server runs argparse over sys.argv at import time; give it a
# clean argv so it only ever sees its own defaults.
sys.argv = sys.argv[:1]
# "Log to stderr only": uvicorn's access log handler writes to stdout.
sys.stdout.flush()
os.dup2(2, 1)

import kserve  # noqa: E402
import numpy as np  # noqa: E402
from kserve import InferOutput, InferRequest, InferResponse  # noqa: E402
from kserve.errors import InvalidInput  # noqa: E402
from kserve.utils.utils import generate_uuid  # noqa: E402


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


def _restrict_listen_host(host: str) -> None:
    """Make KServe's REST (uvicorn) and gRPC servers bind ``host``.

    KServe exposes no option for this, so wrap the two places that decide the
    address. If KServe's internals move, warn and keep its defaults.
    """
    try:
        from kserve.protocol.grpc import server as grpc_server_mod
        from kserve.protocol.rest import server as rest_server_mod

        orig_rest_init = rest_server_mod.RESTServer.__init__

        def rest_init(self, *a, **kw):
            orig_rest_init(self, *a, **kw)
            self.config.host = host  # uvicorn.Server reads it at startup

        rest_server_mod.RESTServer.__init__ = rest_init

        real_aio = grpc_server_mod.aio

        class _AioShim:
            def __getattr__(self, name):
                return getattr(real_aio, name)

            @staticmethod
            def server(*a, **kw):
                srv = real_aio.server(*a, **kw)
                orig_add = srv.add_insecure_port

                def add_insecure_port(address: str) -> int:
                    port = address.rsplit(":", 1)[-1]
                    return orig_add(f"{host}:{port}")

                srv.add_insecure_port = add_insecure_port
                return srv

        grpc_server_mod.aio = _AioShim()
    except Exception as exc:  # pragma: no cover - depends on kserve internals
        print(f"kserve_server: cannot restrict listen host: {exc!r}", file=sys.stderr)


def _response(
    model: kserve.Model, request: InferRequest, outputs: list[InferOutput]
) -> InferResponse:
    # The standard way: KServe's to_rest()/to_grpc() then decide binary vs JSON
    # (binary_data_output / per-output binary_data / raw gRPC inputs) and apply
    # the request's requested outputs. Echo the request id, else a fresh uuid
    # (what KServe's own custom-model examples do).
    return InferResponse(
        response_id=request.id or generate_uuid(),
        model_name=model.name,
        infer_outputs=outputs,
        use_binary_outputs=request.use_binary_outputs,
        requested_outputs=request.request_outputs,
    )


def _output(name: str, datatype: str, arr: np.ndarray) -> InferOutput:
    # Data is handed over as a flat Python list, not the ndarray: KServe 0.21's
    # InferResponse.to_grpc() evaluates `infer_output.data and ...`, which
    # raises "truth value of an array ... is ambiguous" (-> gRPC INTERNAL) for
    # any ndarray output of more than one element whenever the request used
    # raw_input_contents (i.e. every tritonclient.grpc request). With a list,
    # to_rest()/to_grpc() convert it themselves: raw/binary when the request
    # asks for it, typed JSON `data` / gRPC `contents` otherwise.
    return InferOutput(name, list(arr.shape), datatype, data=arr.flatten().tolist())


def _input(request: InferRequest, name: str, datatype: str) -> np.ndarray:
    inp = request.get_input_by_name(name)
    if inp is None:
        raise InvalidInput(f"missing input '{name}'")
    if inp.datatype != datatype:
        raise InvalidInput(f"input '{name}' must be {datatype}, got {inp.datatype}")
    return inp.as_numpy()


class SimpleModel(kserve.Model):
    """INT32 add/sub, the classic Triton 'simple' example model."""

    def __init__(self, name: str = "simple"):
        super().__init__(name)
        self.load()

    def get_input_types(self):
        return [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ]

    def get_output_types(self):
        return [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ]

    async def predict(
        self, payload: InferRequest, headers=None, response_headers=None
    ) -> InferResponse:
        a = _input(payload, "INPUT0", "INT32")
        b = _input(payload, "INPUT1", "INT32")
        if a.shape != b.shape or a.shape[-1:] != (16,) or a.ndim not in (1, 2):
            raise InvalidInput(
                "INPUT0/INPUT1 must both be [N,16] or [16], "
                f"got {list(a.shape)} and {list(b.shape)}"
            )
        out0 = (a + b).astype(np.int32)
        out1 = (a - b).astype(np.int32)
        return _response(
            self,
            payload,
            [_output("OUTPUT0", "INT32", out0), _output("OUTPUT1", "INT32", out1)],
        )


class IdentityModel(kserve.Model):
    """Returns INPUT0 unchanged as OUTPUT0 for one datatype. ``binary``: which of the
    request's binary-output choices its response honours ("both", "flag": only
    binary_data_output, "none")."""

    def __init__(self, name: str, datatype: str, binary: str = "both"):
        super().__init__(name)
        self.datatype = datatype
        self.binary = binary
        self.load()

    def get_input_types(self):
        return [{"name": "INPUT0", "datatype": self.datatype, "shape": [-1]}]

    def get_output_types(self):
        return [{"name": "OUTPUT0", "datatype": self.datatype, "shape": [-1]}]

    async def predict(
        self, payload: InferRequest, headers=None, response_headers=None
    ) -> InferResponse:
        x = _input(payload, "INPUT0", self.datatype)
        outputs = [_output("OUTPUT0", self.datatype, x)]
        if self.binary == "both":
            return _response(self, payload, outputs)
        return InferResponse(
            response_id=payload.id or generate_uuid(),
            model_name=self.name,
            infer_outputs=outputs,
            use_binary_outputs=self.binary == "flag" and payload.use_binary_outputs,
        )


def main() -> None:
    _exit_with_parent()
    if ARGS.host:
        _restrict_listen_host(ARGS.host)
    models = [
        SimpleModel("simple"),
        IdentityModel("simple_identity", "BYTES"),
        IdentityModel("identity_fp32", "FP32"),
        IdentityModel("identity_fp16", "FP16"),
        IdentityModel("identity_fp16_flag", "FP16", binary="flag"),
        IdentityModel("identity_fp16_json_out", "FP16", binary="none"),
    ]
    kserve.ModelServer(
        http_port=ARGS.http_port,
        grpc_port=ARGS.grpc_port,
        enable_grpc=True,
        workers=1,
        max_threads=2,
        max_asyncio_workers=2,
        enable_latency_logging=False,
        grace_period=2,
    ).start(models)


if __name__ == "__main__":
    main()
