"""The binary-tensor extension framing (docs/protocol.md, binary tensors)."""

from __future__ import annotations

from collections.abc import Callable

from v2proxy.codecs.answer_heads import AnswerHeads
from v2proxy.codecs.json import parse_header
from v2proxy.codecs.json_data import DEFAULT_MAX_INPUT_SIZE
from v2proxy.codecs.json_plain import plain_request
from v2proxy.codecs.json_v2 import (
    dumps_tree,
    request_from_obj,
    response_from_obj,
    response_to_obj,
)
from v2proxy.codecs.limits import DEFAULT_MAX_TENSORS
from v2proxy.codecs.sections import BinaryReader, SizeOnlyReader
from v2proxy.core.errors import CodecError, PayloadTooLarge
from v2proxy.core.model import Buffer, InferRequest, InferResponse, Tensor

IHCL_HEADER = "Inference-Header-Content-Length"


def parse_ihcl(value: str | None, body_length: int) -> int | None:
    """The JSON header length from an IHCL header value; None when the header is absent.
    0 means a raw binary request (docs/protocol.md, raw binary requests)."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        raise CodecError(f"Unable to parse Inference-Header-Content-Length, got: {value}")
    n = int(text)
    if n > body_length:
        raise CodecError(
            f"inference header size should be in range (0, {body_length}), got: {value}"
        )
    return n


def check_json_size(size: int, max_json: int) -> None:
    """Refuse a request whose JSON (the body, or a framed one's header) is longer than
    --max-input-size, before any of it is read."""
    if size > max_json:
        raise PayloadTooLarge(
            f"request JSON size of {size} bytes exceeds the maximum allowed input size of"
            f" {max_json} bytes. Use --max-input-size to increase the limit."
        )


def _split(body: Buffer, ihcl: int | None, max_json: int) -> tuple[memoryview, memoryview | None]:
    mv = memoryview(body).cast("B")
    header = mv if ihcl is None else mv[:ihcl]
    check_json_size(len(header), max_json)
    return header, (None if ihcl is None else mv[ihcl:])


def decode_request(
    body: Buffer,
    ihcl: int | None,
    model_name: str,
    model_version: str = "",
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    max_tensors: int = DEFAULT_MAX_TENSORS,
    *,
    plain: bool = True,
) -> InferRequest:
    """Decode a JSON or binary-framed request body (not a raw one: ``ihcl`` must not be 0);
    ``plain=False``: a JSON body :func:`plain_request` said None of already."""
    if ihcl == 0:
        raise ValueError("raw requests are decoded by codecs.raw")
    if plain and ihcl is None and isinstance(body, (bytes, bytearray)):
        request = plain_request(body, model_name, model_version, max_input_size, max_tensors)
        if request is not None:
            return request
    header, section = _split(body, ihcl, max_input_size)
    reader = None if section is None else BinaryReader(section)
    return _request(header, reader, model_name, model_version, max_input_size, max_tensors)


def decode_request_header(
    header: Buffer,
    section_length: int,
    model_name: str,
    model_version: str = "",
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    max_tensors: int = DEFAULT_MAX_TENSORS,
) -> InferRequest:
    """Decode and check the JSON header of a binary-framed request whose binary section is
    still to come; binary inputs carry no data."""
    head, _ = _split(header, None, max_input_size)
    reader = SizeOnlyReader(section_length)
    return _request(head, reader, model_name, model_version, max_input_size, max_tensors)


def _request(
    header: memoryview,
    reader: BinaryReader | None,
    model_name: str,
    model_version: str,
    max_input_size: int,
    max_tensors: int,
) -> InferRequest:
    if len(header) == 0:
        raise CodecError("failed to parse the request JSON buffer: the request body is empty")
    obj = parse_header(header)
    return request_from_obj(
        obj, model_name, model_version, reader, max_input_size, max_tensors=max_tensors
    )


def decode_response(
    body: Buffer, ihcl: int | None, heads: AnswerHeads | None = None
) -> InferResponse:
    """Decode a backend's JSON or binary-framed response body; ``heads``: its answer headers
    decoded before (:mod:`v2proxy.codecs.answer_heads`), asked first."""
    if heads is not None and ihcl is not None and ihcl > 0:
        # (a known header: its length within the body is part of what heads.decode matches)
        known = heads.decode(body, ihcl)
        if known is not None:
            return known
    mv = memoryview(body).cast("B")
    if ihcl is not None and not 0 < ihcl <= len(mv):
        raise CodecError(
            f"invalid response from backend: Inference-Header-Content-Length {ihcl} is not"
            f" within the body of {len(mv)} bytes"
        )
    if ihcl is None:
        return response_from_obj(parse_header(mv, what="response"), None)
    header = mv[:ihcl]
    obj = parse_header(header, what="response")
    response = response_from_obj(obj, BinaryReader(mv[ihcl:]))
    if heads is not None:
        heads.learn(header, obj, response)
    return response


def encode_response(
    resp: InferResponse, is_binary: Callable[[Tensor], bool] | None
) -> tuple[list[Buffer], int | None]:
    """A response body for a client (``is_binary``: :func:`binary_output_rule`'s)."""
    blobs: list[Buffer] = []
    head = dumps_tree(response_to_obj(resp, is_binary, blobs))
    if not blobs:
        return [head], None
    return [head, *blobs], len(head)


def binary_output_rule(req: InferRequest) -> Callable[[Tensor], bool] | None:
    """Which response outputs go binary (docs/protocol.md): a listed output by its own
    ``binary_data``, else all by ``binary_data_output``. None: none does."""
    if req.outputs is None:
        params = req.parameters
        if not params or params.get("binary_data_output") is not True:
            return None
        return _all_binary
    listed = {o.name: o.parameters.get("binary_data") is True for o in req.outputs}
    return lambda t: listed.get(t.name, False)


def _all_binary(_t: Tensor) -> bool:
    return True
