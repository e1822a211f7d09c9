"""JSON text <-> Python values for v2 bodies (docs/protocol.md, JSON bodies): the parse and
serialize primitives under the v2 codecs."""

from __future__ import annotations

import json as _stdjson
import re
from collections.abc import Iterator
from typing import Any, Final

import orjson
import simdjson

from v2proxy.core.errors import CodecError, InvalidText

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
        doc = _stdjson.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CodecError(f"failed to parse the {what} JSON buffer: {first}") from None
    # The standard library takes a lone surrogate escape, which orjson refused: only valid
    # text gets through (a lone surrogate can come in no other way: the bytes are UTF-8).
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogate(doc, what)
    return doc


#: a \uD800-\uDFFF escape, which the document must hold for a string to hold a lone surrogate
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
#: (written with chr: mypyc compiles no surrogate in a literal); the standard library pairs
#: the valid ones
_SURROGATE = re.compile(f"[{chr(0xD800)}-{chr(0xDFFF)}]")
Path = tuple[str | int, ...]


def _refuse_lone_surrogate(doc: Any, what: str) -> None:
    """InvalidText naming the first string or key (in document order) with a lone surrogate."""
    found = _find_surrogate(doc)
    if found is None:
        return
    path, in_key, char = found
    field = _path_text(path)
    esc = f"\\u{ord(char):04x}"
    detail = f"a lone surrogate ({esc}) is not valid UTF-8 text"
    if in_key:
        where = f"a key of '{field}'" if field else f"a key of the {what}"
    elif not path:
        where = f"the {what}"
    else:
        where = _tensor_field(doc, path) or f"'{field}'"
    raise InvalidText(f"Unable to parse {where}: {detail}", field, in_key, esc)


def _find_surrogate(doc: Any) -> tuple[Path, bool, str] | None:
    """(path, whether in a key there, the surrogate) of the first lone surrogate, or None."""
    stack: list[Iterator[tuple[Path, Any]]] = [iter([((), doc)])]
    while stack:
        for path, node in stack[-1]:
            kind = type(node)
            if kind is str:
                m = _SURROGATE.search(node)
                if m is not None:
                    return path, False, m.group()
            elif kind is dict:
                for key in node:
                    m = _SURROGATE.search(key)
                    if m is not None:
                        return path, True, m.group()
                stack.append(_children(path, node.items()))
                break
            elif kind is list:
                stack.append(_children(path, enumerate(node)))
                break
        else:
            stack.pop()
    return None


def _children(path: Path, items: Any) -> Iterator[tuple[Path, Any]]:
    for key, value in items:
        yield (*path, key), value


#: a path in a message is kept short: its first and last parts, each key's first characters
_PATH_HEAD, _PATH_TAIL, _KEY_CHARS = 8, 4, 64


def _path_text(path: Path) -> str:
    """``inputs[0].name``; ``a.b.c...[0][0]`` when it is long."""
    out = ""
    for i, part in enumerate(path):
        if len(path) > _PATH_HEAD + _PATH_TAIL and i == _PATH_HEAD:
            out += "..."
        if _PATH_HEAD <= i < len(path) - _PATH_TAIL:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = part if len(part) <= _KEY_CHARS else part[: _KEY_CHARS - 3] + "..."
            out += f".{key}" if out else key
    return out


def _tensor_field(doc: Any, path: Path) -> str | None:
    """``'data[0]' for input 'X'`` when ``path`` leads into a field of a v2 tensor (an item of
    ``inputs`` or ``outputs``) whose name is valid text; None otherwise."""
    if len(path) < 3 or path[0] not in ("inputs", "outputs") or type(path[1]) is not int:
        return None
    tensor = doc[path[0]][path[1]]
    name = tensor.get("name")
    if path[2] == "name" or type(name) is not str or _SURROGATE.search(name):
        return None
    return f"'{_path_text(path[2:])}' for {str(path[0])[:-1]} '{name}'"


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
REUSE_LIMIT: Final = 32 * 1024 * 1024
#: documents up to this size are parsed by orjson into Python objects
SMALL_DOCUMENT: Final = 16 * 1024


def parse_header(buf: bytes | bytearray | memoryview, what: str = "request") -> Any:
    """Parse a v2 request/response header; tensors' ``data`` stay lazy simdjson arrays; the result
    must be consumed and dropped before the next call (the parser is reused)."""
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


def is_object(buf: bytes | bytearray | memoryview, what: str = "response") -> bool:
    """Whether ``buf`` is one JSON document that is an object (False: another JSON value);
    CodecError when it is not JSON."""
    parser = _CHECKER if len(buf) <= REUSE_LIMIT else simdjson.Parser()
    try:
        doc = parser.parse(buf)
    except (ValueError, RuntimeError, TypeError):
        return isinstance(loads(buf, what), dict)
    found = isinstance(doc, simdjson.Object)
    del doc  # the parser is free for the next document
    return found


#: the parser of :func:`is_object` (documents up to REUSE_LIMIT), never handed out
_CHECKER: Final = simdjson.Parser()


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
