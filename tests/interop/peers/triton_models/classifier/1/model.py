"""`classifier`: SCORES = 2 * INPUT0 + 0.125 * index, in FP32 like the builtin model."""

import numpy as np
import triton_python_backend_utils as pb_utils

WEIGHTS = np.float32(2.0)
BIAS = (np.arange(10, dtype=np.float32) * np.float32(0.125)).astype(np.float32)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            scores = (x * WEIGHTS + BIAS).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORES", scores)]))
        return responses
