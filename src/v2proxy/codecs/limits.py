"""Per-request limits every request decoder applies before it builds tensors (the denial of
service Triton's 2025 hardening closed: requests naming very many outputs, and small bodies that
decode into much larger tensors)."""

from __future__ import annotations

from v2proxy.core.errors import CodecError, PayloadTooLarge

#: the default of ``--max-tensors``
DEFAULT_MAX_TENSORS = 1024


def check_count(count: int, limit: int, what: str) -> None:
    """``what`` ('inputs', 'outputs'): the request names ``count`` of them."""
    if count > limit:
        raise CodecError(
            f"the request names {count} {what}, more than the maximum of {limit} per request."
            " Use --max-tensors to increase the limit."
        )


class DecodedTotal:
    """The running sum of the decoded inputs' bytes of one request, bounded by ``limit``."""

    __slots__ = ("limit", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0

    def add(self, size: int, where: str) -> None:
        """Count ``size`` more bytes, those of ``where`` (an input); refuse past the limit."""
        total = self.total + size
        if total > self.limit:
            raise PayloadTooLarge(
                f"the decoded data of the request's inputs reaches {total} bytes with {where},"
                f" more than the maximum allowed total of {self.limit} bytes. Use"
                " --max-input-size to increase the limit."
            )
        self.total = total
