"""msgspec types of the common small JSON ``/infer`` request, checked as it is parsed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar, Union

import msgspec

from v2proxy.codecs.json_data import SMALL_ARRAY
from v2proxy.core.model import Datatype

#: what a decode of these types raises for a body not of their shape, kinds or ranges (a string
#: that is not UTF-8 included)
DecodeErrors = (msgspec.MsgspecError, UnicodeDecodeError)


#: the length of a ``data`` array of the common shape (the elements a shape of 1 to SMALL_ARRAY
#: elements holds: a caller compares it with the shape's product)
_DATA_LENGTH = msgspec.Meta(min_length=1, max_length=SMALL_ARRAY)


# gc=False here and on the request: what they hold (strings, lists of numbers) never makes a
# cycle, so the collector need not track them (one less cost per decoded request)
class Input(msgspec.Struct, tag_field="datatype", forbid_unknown_fields=True, gc=False):
    """An input of the common shape; a subclass per datatype (its tag) types ``data``."""

    name: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    #: the datatype (the tag's)
    datatype_of: ClassVar[Datatype]


def tensor_types(
    datatypes: Iterable[Datatype],
    element: Callable[[Datatype], Any],
    namespace: Callable[[Datatype], dict[str, Any]],
) -> Any:
    """The union of one input struct per datatype, its ``data`` a list of ``element(dt)`` of 1 to
    :data:`~v2proxy.codecs.json_data.SMALL_ARRAY` elements, the struct's ``datatype_of`` its
    datatype and its other class attributes ``namespace(dt)`` (what a caller needs per
    datatype, found on the input: no look-up keyed by an enum)."""
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
    """The decoder of a request of ``inputs`` (a list of ``tensors``), an optional string ``id``,
    optional ``outputs`` (a list of ``outputs``) and, when ``parameters``, optional
    ``parameters`` (an object of any values); nothing else."""
    fields: list[Any] = [
        ("inputs", list[tensors]),
        ("id", Union[str, None], None),  # noqa: UP007
        ("outputs", Union[list[outputs], None], None),  # noqa: UP007
    ]
    if parameters:
        fields.append(("parameters", Union[dict[str, Any], None], None))  # noqa: UP007
    request = msgspec.defstruct("_Request", fields, forbid_unknown_fields=True, gc=False)
    return msgspec.json.Decoder(request)
