"""JSON text <-> Python values for v2 bodies (reference §1.3, §1.5, §1.7): the parse and
serialize primitives under the v2 codecs.

- ``loads`` parses a JSON document (orjson, then the standard library for NaN/Infinity
  literals, which Triton accepts); a body that is not JSON is a CodecError with the parser's
  message, naming ``what`` was parsed ("request", "response").
- ``parse_header`` parses a request or response header with simdjson, leaving each tensor's
  ``data`` array a lazy simdjson array so that :func:`v2proxy.codecs.json_data.data_to_buffer`
  can decode its numbers straight into numpy (no Python float objects); small documents, and
  anything simdjson cannot take, go to ``loads``, which owns the messages.
- ``dumps`` writes compact JSON; numpy arrays are serialized natively.

Pure: no I/O. Errors are CodecError.
"""

from __future__ import annotations

import json as _stdjson
from typing import Any

import orjson
import simdjson

from v2proxy.errors import CodecError

_DUMPS_OPTS = orjson.OPT_SERIALIZE_NUMPY


def loads(buf: bytes | bytearray | memoryview, what: str = "request") -> Any:
    """Parse a JSON document; CodecError with the parser's message if it is not JSON."""
    try:
        return orjson.loads(buf)
    except orjson.JSONDecodeError as exc:
        first = str(exc)
    # orjson refuses NaN/Infinity literals, which Triton accepts; the stdlib parser takes them.
    try:
        text = bytes(buf).decode("utf-8")
        return _stdjson.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CodecError(f"failed to parse the {what} JSON buffer: {first}") from None


def dumps(obj: Any) -> bytes:
    """Compact JSON; numpy arrays are serialized natively."""
    try:
        return orjson.dumps(obj, option=_DUMPS_OPTS)
    except orjson.JSONEncodeError as exc:  # pragma: no cover - guarded by callers
        raise CodecError(f"unable to encode JSON: {exc}") from None


#: Parsers kept for reuse. Decoding is synchronous, so one is in use at a time per thread; a
#: parser keeps its scratch buffers between documents (fresh ones cost page faults on every big
#: request), but only for documents up to REUSE_LIMIT so that one huge request does not pin
#: its buffers for the life of the process.
_PARSERS: list[simdjson.Parser] = []
REUSE_LIMIT = 32 * 1024 * 1024
#: documents up to this size are parsed by orjson into Python objects
SMALL_DOCUMENT = 16 * 1024


def parse_header(buf: bytes | bytearray | memoryview, what: str = "request") -> Any:
    """Parse a v2 request/response header; tensors' ``data`` stay lazy simdjson arrays. The
    result must be consumed (``request_from_obj``/``response_from_obj``) and dropped before the
    next call (the binary codec does)."""
    if len(buf) <= SMALL_DOCUMENT:
        return loads(buf, what)  # small: orjson's Python objects are cheaper than lazy arrays
    # simdjson takes any buffer (a view into the body, too) and keeps no reference to it
    parser = _PARSERS.pop() if _PARSERS else simdjson.Parser()
    try:
        doc = parser.parse(buf)
    except RuntimeError:  # still referenced by an earlier document: use a new one
        parser = simdjson.Parser()
        try:
            doc = parser.parse(buf)
        except (ValueError, RuntimeError, TypeError):
            return loads(buf, what)
    except (ValueError, TypeError):
        _PARSERS.append(parser)
        return loads(buf, what)  # not plain JSON (NaN literals) or not JSON: precise messages
    if len(buf) <= REUSE_LIMIT:
        _PARSERS.append(parser)
    if not isinstance(doc, simdjson.Object):
        return _plain(doc)
    # Objects are walked by key: simdjson's items() would convert every value eagerly.
    out: dict[str, Any] = {}
    for key in doc.keys():  # noqa: SIM118 - a simdjson Object, not a dict
        value = doc[key]
        if key in ("inputs", "outputs") and isinstance(value, simdjson.Array):
            out[key] = [_lazy_tensor(value[i]) for i in range(len(value))]
        else:
            out[key] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _lazy_tensor(item: Any) -> Any:
    if not isinstance(item, simdjson.Object):
        return _plain(item)
    out: dict[str, Any] = {}
    for key in item.keys():  # noqa: SIM118 - a simdjson Object, not a dict
        value = item[key]
        out[key] = value if key == "data" and isinstance(value, simdjson.Array) else _plain(value)
    return out
