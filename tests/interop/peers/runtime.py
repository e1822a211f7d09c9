"""MLServer runtimes for the v2proxy interop peer models.

Imported by MLServer (mlserver venv only) through the ``implementation``
field of each ``mlserver_models/*/model-settings.json``:

    runtime.SimpleModel    INT32 INPUT0, INPUT1 [N,16] or [16] -> OUTPUT0 = a+b, OUTPUT1 = a-b
    runtime.IdentityModel  INPUT0 -> OUTPUT0 unchanged (datatype from the model's
                           declared inputs: BYTES for simple_identity, FP32 for
                           identity_fp32)

Outputs are built as plain ResponseOutput objects (no codec) so shapes come
back exactly as sent; MLServer's NumpyCodec would add a content_type
parameter and may rewrite 1-D shapes. MLServer leaves requested outputs to
the runtime, so they are filtered here by name.
"""

from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse, RequestInput, ResponseOutput


def _find(payload: InferenceRequest, name: str) -> RequestInput:
    for inp in payload.inputs:
        if inp.name == name:
            return inp
    raise InferenceError(f"missing input '{name}'")


def _datatype(t) -> str:
    return getattr(t.datatype, "value", t.datatype)


def _select(payload: InferenceRequest, outputs: list[ResponseOutput]) -> list[ResponseOutput]:
    if not payload.outputs:
        return outputs
    by_name = {o.name: o for o in outputs}
    selected = []
    for req in payload.outputs:
        if req.name not in by_name:
            raise InferenceError(f"unknown requested output '{req.name}'")
        selected.append(by_name[req.name])
    return selected


class SimpleModel(MLModel):
    async def load(self) -> bool:
        self.ready = True
        return self.ready

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        ins = [_find(payload, n) for n in ("INPUT0", "INPUT1")]
        for inp in ins:
            if _datatype(inp) != "INT32":
                raise InferenceError(f"input '{inp.name}' must be INT32, got {_datatype(inp)}")
        a, b = (NumpyCodec.decode_input(i).astype(np.int32) for i in ins)
        if a.shape != b.shape or a.shape[-1:] != (16,) or a.ndim not in (1, 2):
            raise InferenceError(
                "INPUT0/INPUT1 must both be [N,16] or [16], "
                f"got {list(a.shape)} and {list(b.shape)}"
            )
        outs = []
        for name, result in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
            arr = result.astype(np.int32)
            outs.append(
                ResponseOutput(
                    name=name,
                    shape=list(arr.shape),
                    datatype="INT32",
                    data=arr.flatten().tolist(),
                )
            )
        return InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=_select(payload, outs),
        )


class IdentityModel(MLModel):
    async def load(self) -> bool:
        declared = self.inputs or []
        self._datatype = _datatype(declared[0]) if declared else None
        self.ready = True
        return self.ready

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inp = _find(payload, "INPUT0")
        if self._datatype and _datatype(inp) != self._datatype:
            raise InferenceError(f"input 'INPUT0' must be {self._datatype}, got {_datatype(inp)}")
        # Echo the tensor untouched: BYTES elements stay bytes (gRPC) or str
        # (REST JSON), numbers stay as sent.
        out = ResponseOutput(
            name="OUTPUT0",
            shape=list(inp.shape),
            datatype=_datatype(inp),
            data=inp.data,
        )
        return InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=_select(payload, [out]),
        )
