"""Try v2proxy with NVIDIA's tritonclient: `python examples/tritonclient_http.py --url HOST:PORT`.

Sends INPUT0 as JSON and INPUT1 as binary to the `simple` model, asks for OUTPUT0 binary and
OUTPUT1 as JSON, and prints the sum and difference.
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.http as httpclient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="localhost:9000")
    args = parser.parse_args()
    client = httpclient.InferenceServerClient(args.url)
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(in0, binary_data=False)
    inputs[1].set_data_from_numpy(in1, binary_data=True)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = client.infer("simple", inputs, outputs=outputs)
    print("server:", client.get_server_metadata()["name"])
    print("INPUT0 + INPUT1 =", result.as_numpy("OUTPUT0").tolist())
    print("INPUT0 - INPUT1 =", result.as_numpy("OUTPUT1").tolist())


if __name__ == "__main__":
    main()
