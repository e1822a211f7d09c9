"""msgspec types of the common small JSON ``/infer`` request, checked as it is parsed: the plain
decoder's shape and the relay check's (:data:`RELAY_CHECK`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar, Union

import msgspec

from v2proxy.codecs.dtypes import INTEGER_TYPES, ITEM_SIZE
from v2proxy.codecs.json_data import SMALL_ARRAY
from v2proxy.core.model import Datatype

#: what a decode raises for a body not of these types (non-UTF-8 strings included)
DecodeErrors = (msgspec.MsgspecError, UnicodeDecodeError)


#: a caller compares the length with the shape's product
_DATA_LENGTH = msgspec.Meta(min_length=1, max_length=SMALL_ARRAY)


# gc=False here and on the request: strings and lists of numbers never make a cycle
class Input(msgspec.Struct, tag_field="datatype", forbid_unknown_fields=True, gc=False):
    """An input of the common shape; a subclass per datatype (its tag) types ``data``."""

    name: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    datatype_of: ClassVar[Datatype]


def tensor_types(
    datatypes: Iterable[Datatype],
    element: Callable[[Datatype], Any],
    namespace: Callable[[Datatype], dict[str, Any]],
) -> Any:
    """The union of one input struct per datatype: ``data`` a short list of ``element(dt)``,
    ``datatype_of`` its datatype, other class attributes ``namespace(dt)`` (found on the input:
    no look-up keyed by an enum)."""
    return Union[  # noqa: UP007
        tuple(
            msgspec.defstruct(
                f"_{dt.value}",
                [("data", Annotated[list[element(dt)], _DATA_LENGTH])],  # type: ignore[misc]
                bases=(Input,),
                tag=dt.value,
                namespace={**namespace(dt), "datatype_of": dt},
            )
            for dt in datatypes
        )
    ]


def request_decoder(tensors: Any, outputs: Any, parameters: bool) -> msgspec.json.Decoder[Any]:
    """The decoder of a request of ``inputs``, optional ``id``, ``outputs`` and (when
    ``parameters``) ``parameters``; nothing else."""
    fields: list[Any] = [
        ("inputs", list[tensors]),
        ("id", Union[str, None], None),  # noqa: UP007
        ("outputs", Union[list[outputs], None], None),  # noqa: UP007
    ]
    if parameters:
        fields.append(("parameters", Union[dict[str, Any], None], None))  # noqa: UP007
    request = msgspec.defstruct("_Request", fields, forbid_unknown_fields=True, gc=False)
    return msgspec.json.Decoder(request)


_FP32_MAX = 3.4028234663852886e38
_UINT64_MAX = (1 << 64) - 1


def _ranged(dt: Datatype) -> Any:
    """The type of one element of ``dt``'s data, its range included (UINT64's top is checked
    by the relay check: msgspec bounds an int within int64 only)."""
    if dt is Datatype.BOOL:
        return bool
    if dt is Datatype.FP32:
        return Annotated[float, msgspec.Meta(ge=-_FP32_MAX, le=_FP32_MAX)]
    if dt is Datatype.FP64:
        return float
    if dt is Datatype.UINT64:
        return Annotated[int, msgspec.Meta(ge=0)]
    bits = ITEM_SIZE[dt] * 8
    if dt.value.startswith("U"):
        return Annotated[int, msgspec.Meta(ge=0, le=(1 << bits) - 1)]
    return Annotated[int, msgspec.Meta(ge=-(1 << (bits - 1)), le=(1 << (bits - 1)) - 1)]


class _NamedOutput(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: str


def _checked(dt: Datatype) -> dict[str, Any]:
    """An input's item size, and the top of its elements left to check (0: none)."""
    return {"itemsize": ITEM_SIZE[dt], "top": _UINT64_MAX if dt is Datatype.UINT64 else 0}


#: the relay check's decoder (v2proxy/codecs/relay_check.py, which compares lengths, names and
#: sizes): inputs of the numeric datatypes, each element within its datatype's range; outputs by
#: name alone; no parameters. Here, apart from the check, as mypyc compiles the check and would
#: not pass these structs' class keywords on
RELAY_CHECK = request_decoder(
    tensor_types(
        [
            dt
            for dt in Datatype
            if dt in INTEGER_TYPES or dt in (Datatype.FP32, Datatype.FP64, Datatype.BOOL)
        ],
        _ranged,
        _checked,
    ),
    _NamedOutput,
    parameters=False,
)
