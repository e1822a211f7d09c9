"""The check of a JSON /infer request body fed piece by piece as it arrives
(docs/guides/sidecar.md, pass-through)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson
import simdjson

from v2proxy.codecs.dtypes import ITEM_SIZE
from v2proxy.codecs.json import loads
from v2proxy.codecs.json_data import BUFFER_TYPES, INT_RANGES
from v2proxy.codecs.json_v2 import request_from_obj
from v2proxy.codecs.limits import DEFAULT_MAX_TENSORS
from v2proxy.core.errors import CodecError, PayloadTooLarge
from v2proxy.core.model import Datatype, InferRequest

#: the skeleton (the document less the number arrays checked in pieces) may be this large
SKELETON_LIMIT = 256 * 1024
#: numbers are checked in pieces of about this many bytes
PIECE_SIZE = 256 * 1024
#: a token left unfinished by a piece is scanned again, from its start, with the next one: past
#: this many pieces in a row the check gives up (a slow client's long string in small pieces
#: would otherwise cost time quadratic in its length: seconds of event loop for 256 KiB)
MAX_CARRIED = 16
#: one structural token: a string, a punctuation mark, or a scalar (number, true, false, null)
_TOKEN = re.compile(
    rb'[ \t\n\r]*(?:("(?:[^"\\]|\\.)*")|([{}\[\]:,])|([^ \t\n\r{}\[\]:,"]+))', re.DOTALL
)
_OPEN = frozenset({b"{", b"["})
_CLOSE = frozenset({b"}", b"]"})


class StreamCheck:
    """Checks a JSON request body as it arrives, piece by piece, without building its tensors: the
    check behind relaying a large JSON body while it streams (the backend gets the last bytes only
    once the whole body passed). ``finish`` gives the InferRequest, or None when only the full
    decoder can tell; anything unusual makes it give up, so its "valid" never differs from it."""

    #: pieces in a row that ended inside the same unfinished token
    _carried = 0

    def __init__(
        self, model: str, version: str, max_input_size: int, max_tensors: int = DEFAULT_MAX_TENSORS
    ) -> None:
        self._model = model
        self._version = version
        self._max = max_input_size
        self._max_tensors = max_tensors
        self._gave_up = False
        self._size = 0
        self._skeleton = bytearray()
        self._pending = b""
        #: open containers: [True, key, expecting a key, keys] or [False, index, -, -]
        self._stack: list[list[Any]] = []
        self._datatypes: dict[int, str] = {}
        self._checked: dict[int, tuple[Datatype, int]] = {}
        # the array being checked: its input, datatype, buffer type, count so far, parts
        self._input = -1
        self._datatype = Datatype.FP32
        self._kind = ""
        self._count = 0
        self._parts: list[memoryview] = []
        self._parts_size = 0
        self._parser: simdjson.Parser | None = None

    def feed(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._gave_up:
            return
        data, pos = chunk, 0
        carried = len(self._pending) if self._kind == "" else 0
        if carried:
            data = self._pending + chunk
        in_token = carried and self._pending != b" "
        while pos >= 0:
            pos = self._numbers(data, pos) if self._kind else self._tokens(data, pos)
        if in_token and len(self._pending) > carried:  # the same token is still unfinished
            self._carried += 1
            if self._carried > MAX_CARRIED:
                self._give_up()
        else:
            self._carried = 0

    def finish(self) -> InferRequest | None:
        """The request when the body fed was a valid one; None when undecided."""
        if (
            self._gave_up
            or self._kind
            or self._stack
            or self._pending.strip()
            or self._size > self._max
        ):
            return None
        try:
            obj = loads(self._skeleton)
            return request_from_obj(
                obj,
                self._model,
                self._version,
                None,
                self._max,
                self._checked,
                max_tensors=self._max_tensors,
            )
        except (CodecError, PayloadTooLarge):
            return None

    def _give_up(self) -> int:
        self._gave_up = True
        self._skeleton = bytearray()
        self._pending = b""
        self._parts = []
        return -1

    def _tokens(self, data: bytes, pos: int) -> int:
        """Walk structural tokens from ``pos``; the position just after the ``[`` of a number
        array to check, or -1 when more bytes are needed (or the check gave up)."""
        start, n, stack = pos, len(data), self._stack
        while True:
            m = _TOKEN.match(data, pos)
            if m is None or (m.end() == n and m.lastindex == 3):
                break  # an unfinished string or scalar, or only blanks left
            pos = m.end()
            string, mark = m.group(1), m.group(2)
            top = stack[-1] if stack else None
            if mark == b",":
                if top is not None:
                    if top[0]:
                        top[2] = True
                    else:
                        top[1] += 1
                continue
            if mark == b":":
                continue
            if mark in _CLOSE:
                if stack:
                    stack.pop()
                continue
            if string is not None and top is not None and top[0] and top[2]:
                try:
                    key = orjson.loads(string)
                except orjson.JSONDecodeError:
                    return self._give_up()
                if key in top[3]:
                    return self._give_up()  # duplicate keys: parsers differ on which wins
                top[3].add(key)
                top[1], top[2] = key, False
                continue
            if (
                len(stack) == 3
                and stack[0][1] == "inputs"
                and stack[2][0]
                and stack[0][0]
                and not stack[1][0]
            ):
                index, key = stack[1][1], stack[2][1]
                if key == "datatype" and string is not None:
                    self._datatypes[index] = string[1:-1].decode("latin-1")
                elif key == "data" and mark == b"[":
                    self._skeleton += data[start:pos]
                    stack.append([False, 0, False, None])  # closed by the array's "]"
                    return self._begin_numbers(index, pos)
            if mark in _OPEN:
                stack.append([True, None, True, set()] if mark == b"{" else [False, 0, False, None])
        self._skeleton += data[start:pos]
        rest = data[pos:]
        token = rest.lstrip(b" \t\n\r")
        # blanks before the unfinished token: one is kept, as they may separate it from the
        # token before ('fal se' is no 'false'); a run of them is never scanned again
        self._pending = b" " + token if len(token) < len(rest) else token
        if len(self._skeleton) + len(self._pending) > SKELETON_LIMIT:
            return self._give_up()
        return -1

    def _begin_numbers(self, index: int, pos: int) -> int:
        try:
            datatype = Datatype(self._datatypes.get(index, ""))
        except ValueError:
            return self._give_up()
        kind = BUFFER_TYPES.get(datatype)
        if kind is None or index in self._checked:
            return self._give_up()
        self._input, self._datatype, self._kind, self._count = index, datatype, kind[0], 0
        self._pending = b""
        return pos

    def _numbers(self, data: bytes, pos: int) -> int:
        """Check the numbers of the array being checked from ``pos``; the position of its
        closing bracket, or -1 when the chunk is used up (or the check gave up)."""
        end = data.find(b"]", pos)
        stop = len(data) if end < 0 else end
        if data.find(b"[", pos, stop) >= 0:
            return self._give_up()  # nested arrays: left to the full decoder
        view = memoryview(data)
        while True:
            # pieces of about PIECE_SIZE, cut at a comma (small pieces stay in the cache)
            target = pos + max(PIECE_SIZE - self._parts_size, 0)
            if target >= stop:
                break
            cut = data.rfind(b",", pos, target + 1)
            if cut < 0:
                cut = data.find(b",", target, stop)
                if cut < 0:
                    break
            self._parts.append(view[pos:cut])
            if not self._piece(final=False):
                return self._give_up()
            pos = cut + 1
        if pos < stop:
            self._parts.append(view[pos:stop])
            self._parts_size += stop - pos
        if end < 0:
            return -1
        if not self._piece(final=True):
            return self._give_up()
        self._checked[self._input] = (self._datatype, self._count)
        self._kind = ""
        return end

    def _piece(self, final: bool) -> bool:
        """Whether the parts hold one or more numbers (none only for an empty array) of the
        datatype's kind; their count is added up."""
        text = b"".join([b"[", *self._parts, b"]"])
        self._parts, self._parts_size = [], 0
        if self._parser is None:
            self._parser = simdjson.Parser()
        doc: Any = None
        try:
            doc = self._parser.parse(text)
            buf = doc.as_buffer(of_type=self._kind)
        except (ValueError, TypeError, RuntimeError):
            return False
        finally:
            del doc
        count = memoryview(buf).nbytes // 8
        if count == 0 and not (final and self._count == 0):
            return False  # an element is missing next to a comma
        bounds = INT_RANGES.get(self._datatype)
        if bounds is not None and count and ITEM_SIZE[self._datatype] < 8:
            arr = np.frombuffer(buf, dtype=BUFFER_TYPES[self._datatype][1])
            if arr.min() < bounds[0] or arr.max() > bounds[1]:
                return False
        self._count += count
        return True
