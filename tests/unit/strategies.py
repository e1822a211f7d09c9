"""Hypothesis strategies shared by the codec round-trip tests: tensors of every datatype with
random shapes (0-d and zero-sized included) and random values (every bit pattern for the float
types)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from v2proxy.codecs.dtypes import from_numpy
from v2proxy.core.model import Datatype, Tensor

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)

# Datatypes drawn directly; float types are drawn as raw bit patterns of the same width.
DIRECT = {
    Datatype.BOOL: np.dtype("?"),
    Datatype.UINT8: np.dtype("u1"),
    Datatype.UINT16: np.dtype("<u2"),
    Datatype.UINT32: np.dtype("<u4"),
    Datatype.UINT64: np.dtype("<u8"),
    Datatype.INT8: np.dtype("i1"),
    Datatype.INT16: np.dtype("<i2"),
    Datatype.INT32: np.dtype("<i4"),
    Datatype.INT64: np.dtype("<i8"),
}
FLOATS: dict[Datatype, tuple[np.dtype[Any], Any]] = {
    Datatype.FP16: (np.dtype("<u2"), np.dtype("<f2")),
    Datatype.FP32: (np.dtype("<u4"), np.dtype("<f4")),
    Datatype.FP64: (np.dtype("<u8"), np.dtype("<f8")),
    Datatype.BF16: (np.dtype("<u2"), np.dtype(ml_dtypes.bfloat16)),
}
FIXED = [*DIRECT, *FLOATS]

JSON_TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)


@st.composite
def tensors(draw: st.DrawFn, datatype: Datatype, json_safe: bool, name: str = "T") -> Tensor:
    shape = draw(SHAPES)
    if datatype is Datatype.BYTES:
        elements = JSON_TEXT.map(str.encode) if json_safe else st.binary(max_size=12)
        array = draw(hnp.arrays(np.dtype(object), shape, elements=elements))
    elif datatype in FLOATS:
        bits, dtype = FLOATS[datatype]
        array = draw(hnp.arrays(bits, shape)).view(dtype)
    else:
        array = draw(hnp.arrays(DIRECT[datatype], shape))
    return from_numpy(name, datatype, array)
