"""KServe's own gRPC client (``kserve.InferenceGRPCClient``), run with the kserve venv's python
by the interop tests: ``python kserve_grpc_client.py HOST:PORT``. It checks health, runs the
`simple` model with numpy inputs and prints one JSON line with what it got back."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest


async def main(url: str) -> dict[str, object]:
    client = InferenceGRPCClient(url=url, timeout=30, retries=2)
    try:
        live = await client.is_server_live()
        ready = await client.is_server_ready()
        model_ready = await client.is_model_ready("simple")
        in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
        in1 = np.full((1, 16), 2, dtype=np.int32)
        inputs = [InferInput("INPUT0", [1, 16], "INT32"), InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(in0, binary_data=True)
        inputs[1].set_data_from_numpy(in1, binary_data=True)
        request = InferRequest(model_name="simple", infer_inputs=inputs, request_id="kserve-1")
        response = await client.infer(request)
        outputs = {o.name: o.as_numpy().tolist() for o in response.outputs}
        return {
            "live": live,
            "ready": ready,
            "model_ready": model_ready,
            "id": response.id,
            "model_name": response.model_name,
            "outputs": outputs,
        }
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
