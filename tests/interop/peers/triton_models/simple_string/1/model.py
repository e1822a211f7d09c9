"""`simple_string`: sum and difference of BYTES elements holding decimal integers, answered as
decimal strings; a non-decimal element is an INVALID_ARG error naming the input, with the
builtin model's message."""

import numpy as np
import triton_python_backend_utils as pb_utils


class _NotDecimal(Exception):
    pass


def _decimal(values, name):
    try:
        return np.array([int(v) for v in values.reshape(-1)], dtype=np.int64).reshape(values.shape)
    except (ValueError, UnicodeDecodeError):
        raise _NotDecimal(
            f"input '{name}' of model 'simple_string' must hold decimal integers"
        ) from None


def _strings(values):
    return np.array([str(int(v)).encode() for v in values.reshape(-1)], dtype=np.object_).reshape(
        values.shape
    )


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                a = _decimal(
                    pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy(), "INPUT0"
                )
                b = _decimal(
                    pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy(), "INPUT1"
                )
            except _NotDecimal as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT0", _strings(a + b)),
                        pb_utils.Tensor("OUTPUT1", _strings(a - b)),
                    ]
                )
            )
        return responses
