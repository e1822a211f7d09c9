"""msgspec types of the common small JSON ``/infer`` request, checked as it is parsed: the shape
the plain decoder (:mod:`~v2proxy.codecs.json_plain`) builds from. Never compiled by mypyc, which
would not pass these structs' class keywords on."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar, Union

import msgspec

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
