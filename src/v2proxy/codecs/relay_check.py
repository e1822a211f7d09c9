"""Whether a small JSON ``/infer`` body may be relayed untouched without decoding it: one pass
over its bytes that builds nothing but the names, where the full decoder builds every tensor.

:func:`plain_json_request` is *sound*, not complete: True only for bodies the full decoder
accepts and no stage applies to (no ``parameters``; no FP16/BF16, which binary backends refuse
in JSON; no BYTES); anything else takes the full decoder's path, which names the fault. It
accepts ``{"id", "inputs": [{"name", "datatype", "shape", "data": [flat numbers]}, ...],
"outputs": [{"name"}, ...]}``, each key at most once, in JSON's own grammar (strings of UTF-8
without control characters; every element of its datatype's kind and range). A string holding
a backslash is refused: with escapes, any key may be spelled otherwise.

Pure: no I/O. Compiled by mypyc, where a loop over bytes with ``i64`` positions costs a few
instructions a byte: a fraction of a typed parse that builds every element.
"""

from __future__ import annotations

from math import isfinite
from typing import Final

from mypy_extensions import i64

from v2proxy.codecs.json import SMALL_DOCUMENT
from v2proxy.codecs.json_data import SMALL_ARRAY

_FP32_MAX: Final = 3.4028234663852886e38

# the kinds of element
_BOOL: Final = 0
_INT: Final = 1
_FLOAT: Final = 2

# the bytes the scan looks for
_QUOTE: Final = 34
_COMMA: Final = 44
_MINUS: Final = 45
_DOT: Final = 46
_ZERO: Final = 48
_NINE: Final = 57
_COLON: Final = 58
_OPEN_LIST: Final = 91
_BACKSLASH: Final = 92
_CLOSE_LIST: Final = 93
_OPEN_OBJECT: Final = 123
_CLOSE_OBJECT: Final = 125


class _Kind:
    """What a datatype's elements may be: its kind and item size; for integers, the greatest
    magnitude on either side as decimal digits (``low`` empty: no minus sign)."""

    __slots__ = ("high", "itemsize", "kind", "low")

    def __init__(self, kind: int, itemsize: int, low: int = 0, high: int = 0) -> None:
        self.kind = kind
        self.itemsize = itemsize
        self.low = str(low).encode() if low else b""
        self.high = str(high).encode()


def _integer_kind(itemsize: int, signed: bool) -> _Kind:
    """An integer datatype's kind: its bounds from its size and sign."""
    bits = itemsize * 8
    if signed:
        return _Kind(_INT, itemsize, 1 << (bits - 1), (1 << (bits - 1)) - 1)
    return _Kind(_INT, itemsize, 0, (1 << bits) - 1)


#: the datatypes relayed as sent, by their name's bytes, the likeliest first
_KINDS: Final[tuple[tuple[bytes, _Kind], ...]] = (
    (b"FP32", _Kind(_FLOAT, 4)),
    (b"INT32", _integer_kind(4, True)),
    (b"INT64", _integer_kind(8, True)),
    (b"FP64", _Kind(_FLOAT, 8)),
    (b"UINT8", _integer_kind(1, False)),
    (b"INT8", _integer_kind(1, True)),
    (b"BOOL", _Kind(_BOOL, 1)),
    (b"INT16", _integer_kind(2, True)),
    (b"UINT16", _integer_kind(2, False)),
    (b"UINT32", _integer_kind(4, False)),
    (b"UINT64", _integer_kind(8, False)),
)

# the keys seen, as bits
_INPUTS: Final = 1
_ID: Final = 2
_OUTPUTS: Final = 4
_NAME: Final = 1
_DATATYPE: Final = 2
_SHAPE: Final = 4
_DATA: Final = 8
_ALL: Final = 15


def plain_json_request(body: bytes | bytearray, max_input_size: int, max_tensors: int) -> bool:
    """True when ``body`` is a JSON request the full decoder accepts and no stage applies to;
    False when unsure."""
    size = len(body)
    if size > SMALL_DOCUMENT or size > max_input_size:
        return False
    scan = _Scan(body if isinstance(body, bytes) else bytes(body))
    return (
        scan.request()
        and scan.decoded <= max_input_size
        and len(scan.inputs) <= max_tensors
        and scan.outputs <= max_tensors
    )


def _skip(b: bytes, i: i64, n: i64) -> i64:
    """Where the JSON whitespace from ``i`` ends."""
    while i < n:
        c = b[i]
        if c > 32 or c not in (32, 10, 13, 9):
            return i
        i += 1
    return i


def _digits(b: bytes, i: i64, n: i64) -> i64:
    """Where the run of digits from ``i`` ends."""
    while i < n:
        c = b[i]
        if c < _ZERO or c > _NINE:
            return i
        i += 1
    return i


def _string(b: bytes, i: i64, n: i64) -> i64:
    """The closing quote of the string whose opening one is at ``i``; -1 when it is not one of
    UTF-8 without control characters and escapes (outside strings, a backslash is no JSON)."""
    start = i + 1
    i = start
    wide = False
    while i < n:
        c = b[i]
        if c == _QUOTE:
            if wide:
                try:
                    b[start:i].decode()
                except UnicodeDecodeError:
                    return -1
            return i
        if c < 32 or c == _BACKSLASH:
            return -1
        if c >= 128:
            wide = True
        i += 1
    return -1


def _is(b: bytes, start: i64, end: i64, word: bytes) -> bool:
    """Whether ``b[start:end]`` is ``word`` (nothing built)."""
    size: i64 = len(word)
    if end - start != size:
        return False
    k: i64 = 0
    while k < size:
        if b[start + k] != word[k]:
            return False
        k += 1
    return True


class _Scan:
    """One pass over a body. Each step leaves ``i`` past what it took and answers False (or
    -1) as soon as the body is not of the plain shape."""

    __slots__ = ("b", "decoded", "end", "i", "inputs", "n", "outputs")

    def __init__(self, b: bytes) -> None:
        self.b = b
        self.n: i64 = len(b)
        self.i: i64 = 0
        #: the bytes the inputs' data decodes to
        self.decoded = 0
        self.inputs: set[bytes] = set()
        self.outputs = 0
        #: the closing quote of the last key
        self.end: i64 = 0

    def _at(self) -> int:
        """The next byte that is not whitespace (``i`` at it); -1 at the end."""
        i = self.i = _skip(self.b, self.i, self.n)
        return self.b[i] if i < self.n else -1

    def _take(self, c: int) -> bool:
        """Takes the byte ``c``, after whitespace."""
        if self._at() != c:
            return False
        self.i += 1
        return True

    def _text(self) -> i64:
        """A string at ``i``: where its text starts (its closing quote in ``end``), or -1 when
        it is no string of the plain shape."""
        b = self.b
        n = self.n
        i = _skip(b, self.i, n)
        if i >= n or b[i] != _QUOTE:
            return -1
        end = _string(b, i, n)
        if end < 0:
            return -1
        self.end = end
        self.i = end + 1
        return i + 1

    def _key(self) -> i64:
        """An object's key and its colon: where the key starts (its closing quote in ``end``),
        or -1. (:meth:`_text` and the colon, written out: the check reads a key most often.)"""
        b = self.b
        n = self.n
        i = _skip(b, self.i, n)
        if i >= n or b[i] != _QUOTE:
            return -1
        end = _string(b, i, n)
        if end < 0:
            return -1
        j = _skip(b, end + 1, n)
        if j >= n or b[j] != _COLON:
            return -1
        self.end = end
        self.i = j + 1
        return i + 1

    def _after(self, close: int) -> int:
        """After a member or element: 1 when another follows (its comma taken), 0 at ``close``
        (taken), -1 on anything else."""
        i = _skip(self.b, self.i, self.n)
        if i >= self.n:
            return -1
        c = self.b[i]
        self.i = i + 1
        if c == _COMMA:
            return 1
        return 0 if c == close else -1

    def _name(self) -> bytes | None:
        """A string value, as its bytes."""
        start = self._text()
        return None if start < 0 else self.b[start : self.end]

    def _kind(self) -> _Kind | None:
        """A datatype relayed as sent, matched where it lies (nothing built)."""
        start = self._text()
        if start >= 0:
            for word, kind in _KINDS:
                if _is(self.b, start, self.end, word):
                    return kind
        return None

    def _null(self) -> bool:
        if self._at() == 110 and self.b.startswith(b"null", self.i):
            self.i += 4
            return True
        return False

    def request(self) -> bool:
        if not self._take(_OPEN_OBJECT):
            return False
        b = self.b
        seen = 0
        while True:
            key = self._key()
            if key < 0:
                return False
            end = self.end
            if _is(b, key, end, b"inputs"):
                if seen & _INPUTS or not self._inputs():
                    return False
                seen |= _INPUTS
            elif _is(b, key, end, b"outputs"):
                if seen & _OUTPUTS or not (self._null() or self._outputs()):
                    return False
                seen |= _OUTPUTS
            elif _is(b, key, end, b"id"):
                if seen & _ID or not (self._null() or self._name() is not None):
                    return False
                seen |= _ID
            else:
                return False
            more = self._after(_CLOSE_OBJECT)
            if more < 0:
                return False
            if more == 0:
                return seen & _INPUTS != 0 and self._at() == -1

    def _inputs(self) -> bool:
        if not self._take(_OPEN_LIST):
            return False
        while True:
            if not self._tensor():
                return False
            more = self._after(_CLOSE_LIST)
            if more < 0:
                return False
            if more == 0:
                return True

    def _outputs(self) -> bool:
        if not self._take(_OPEN_LIST):
            return False
        if self._at() == _CLOSE_LIST:
            self.i += 1
            return True
        names: set[bytes] = set()
        b = self.b
        while True:
            if not self._take(_OPEN_OBJECT):
                return False
            key = self._key()
            if key < 0 or not _is(b, key, self.end, b"name"):
                return False
            name = self._name()
            if name is None or name in names or self._after(_CLOSE_OBJECT) != 0:
                return False
            names.add(name)
            more = self._after(_CLOSE_LIST)
            if more < 0:
                return False
            if more == 0:
                self.outputs = len(names)
                return True

    def _tensor(self) -> bool:
        """One input, its name added to ``inputs``."""
        if not self._take(_OPEN_OBJECT):
            return False
        b = self.b
        seen = 0
        name: bytes | None = None
        kind: _Kind | None = None
        count = 1
        elements = -1
        data: i64 = -1
        while True:
            key = self._key()
            if key < 0:
                return False
            end = self.end
            first = b[key]  # (the closing quote of an empty key)
            if first == 110 and _is(b, key, end, b"name"):
                name = self._name()
                if seen & _NAME or name is None:
                    return False
                seen |= _NAME
            elif first == 100 and _is(b, key, end, b"datatype"):
                kind = self._kind()
                if seen & _DATATYPE or kind is None:
                    return False
                seen |= _DATATYPE
            elif first == 115 and _is(b, key, end, b"shape"):
                count = self._shape()
                if seen & _SHAPE or count < 0:
                    return False
                seen |= _SHAPE
            elif first == 100 and _is(b, key, end, b"data"):
                if seen & _DATA or self._at() != _OPEN_LIST:
                    return False
                seen |= _DATA
                self.i += 1
                if kind is not None:
                    elements = self._elements(kind)
                    if elements < 0:
                        return False
                else:  # read once the datatype is known (no element holds a bracket)
                    data = self.i
                    close = b.find(b"]", data)
                    if close < 0:
                        return False
                    self.i = close + 1
            else:
                return False
            more = self._after(_CLOSE_OBJECT)
            if more < 0:
                return False
            if more == 0:
                break
        if seen != _ALL or kind is None or not 0 < count <= SMALL_ARRAY:
            return False
        if data >= 0:
            after = self.i
            self.i = data
            elements = self._elements(kind)
            self.i = after
        if elements != count or name is None or name in self.inputs:
            return False
        self.inputs.add(name)
        self.decoded += count * kind.itemsize
        return True

    def _elements(self, kind: _Kind) -> int:
        """The list at ``i`` (past its opening bracket), each element of ``kind``: how many,
        or -1."""
        if kind.kind == _INT:
            return self._integers(kind.low, kind.high)
        if kind.kind == _FLOAT:
            return self._floats(kind.itemsize == 4)
        return self._bools()

    def _shape(self) -> int:
        """Dimensions, each a non-negative integer: their product, or -1."""
        if not self._take(_OPEN_LIST):
            return -1
        if self._at() == _CLOSE_LIST:
            self.i += 1
            return 1
        b = self.b
        n = self.n
        count = 1
        while True:
            start = _skip(b, self.i, n)
            i = _digits(b, start, n)
            if i == start or i - start > 18 or (b[start] == _ZERO and i - start > 1):
                return -1
            dim = 0
            k = start
            while k < i:
                dim = dim * 10 + b[k] - _ZERO
                k += 1
            count *= dim
            self.i = i
            more = self._after(_CLOSE_LIST)
            if more < 0:
                return -1
            if more == 0:
                return count

    def _integers(self, low: bytes, high: bytes) -> int:
        """Integers, each within its side's bound (``low`` empty: no minus sign). One loop,
        the usual element (a few digits, a comma, perhaps a space) taking no call."""
        b = self.b
        n = self.n
        i = self.i
        low_most: i64 = len(low)
        high_most: i64 = len(high)
        count: i64 = 0
        while i < n:
            c = b[i]
            if c in (32, 10, 13, 9):
                i += 1
                continue
            negative = c == _MINUS
            if negative:
                i += 1
            start = i
            while i < n:
                c = b[i]
                if c < _ZERO or c > _NINE:
                    break
                i += 1
            digits = i - start
            if digits == 0 or (digits > 1 and b[start] == _ZERO):
                return -1
            most = low_most if negative else high_most
            if digits >= most and (digits > most or b[start:i] > (low if negative else high)):
                return -1  # (an empty low bound: no minus sign)
            count += 1
            while i < n:
                c = b[i]
                if c not in (32, 10, 13, 9):
                    break
                i += 1
            if i >= n:
                return -1
            i += 1
            if c == _CLOSE_LIST:
                self.i = i
                return count
            if c != _COMMA:
                return -1
        return -1

    def _floats(self, single: bool) -> int:
        """Numbers, each finite and, for ``single``, within FP32's range."""
        b = self.b
        n = self.n
        i = self.i
        count = 0
        while True:
            i = start = _skip(b, i, n)
            if i < n and b[i] == _MINUS:
                i += 1
            first = i
            i = _digits(b, i, n)
            if i == first or (i - first > 1 and b[first] == _ZERO):
                return -1
            # an integer of up to 18 digits is finite and within FP32's range
            whole = i - first <= 18
            if i < n and b[i] == _DOT:
                frac = i + 1
                i = _digits(b, frac, n)
                if i == frac:
                    return -1
                whole = False
            if i < n and (b[i] == 101 or b[i] == 69):  # e E
                i += 1
                if i < n and (b[i] == 43 or b[i] == _MINUS):
                    i += 1
                exp = i
                i = _digits(b, i, n)
                if i == exp:
                    return -1
                whole = False
            if not whole:
                value = float(b[start:i])
                if not isfinite(value) or (single and not -_FP32_MAX <= value <= _FP32_MAX):
                    return -1
            count += 1
            i = _skip(b, i, n)
            if i >= n:
                return -1
            c = b[i]
            i += 1
            if c == _CLOSE_LIST:
                self.i = i
                return count
            if c != _COMMA:
                return -1

    def _bools(self) -> int:
        """``true`` and ``false``."""
        b = self.b
        count = 0
        while True:
            c = self._at()
            if c == 116 and b.startswith(b"true", self.i):
                self.i += 4
            elif c == 102 and b.startswith(b"false", self.i):
                self.i += 5
            else:
                return -1
            count += 1
            more = self._after(_CLOSE_LIST)
            if more < 0:
                return -1
            if more == 0:
                return count
