"""Readers of the binary section of a binary-framed body (docs/protocol.md, binary tensors)."""

from __future__ import annotations

from v2proxy.core.errors import CodecError


class BinaryReader:
    """Hands out consecutive slices of a binary section (views, no copies)."""

    __slots__ = ("_length", "_mv", "_pos")

    def __init__(self, section: memoryview) -> None:
        self._mv = section
        self._pos = 0
        self._length = len(section)

    def _advance(self, size: int, name: str, model: str) -> int:
        """Move past the next ``size`` bytes, which must be there; returns where they start."""
        start = self._pos
        remaining = self._length - start
        if size > remaining:
            raise CodecError(
                f"unexpected size for input '{name}', expecting {size - remaining} additional"
                f" bytes for model '{model}'"
            )
        self._pos = start + size
        return start

    def take(self, size: int, name: str, model: str) -> memoryview:
        start = self._advance(size, name, model)
        return self._mv[start : start + size]

    def finish(self, model: str) -> None:
        if self._pos != self._length:
            raise CodecError(f"unexpected additional input data for model '{model}'")


class SizeOnlyReader(BinaryReader):
    """Checks ``binary_data_size`` values against a binary section of known length that is
    not in memory (its tensors get no data): for requests relayed while their body streams."""

    __slots__ = ()

    def __init__(self, length: int) -> None:
        super().__init__(memoryview(b""))
        self._length = length

    def take(self, size: int, name: str, model: str) -> memoryview:
        self._advance(size, name, model)
        return self._mv
