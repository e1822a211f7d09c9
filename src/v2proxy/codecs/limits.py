"""Per-request limits every request decoder applies before it builds tensors (the denial of
service Triton's 2025 hardening closed: requests naming very many outputs, and small bodies that
decode into much larger tensors).

- :func:`check_count`: at most ``--max-tensors`` inputs, and at most as many requested outputs,
  per inference request; checked on the list's length, before any entry is looked at.
- :class:`DecodedTotal`: the sum of the bytes of all inputs *decoded* from a textual or typed
  form (JSON ``data`` arrays, gRPC typed ``contents``) stays within ``--max-input-size``, so
  that a body of many small arrays cannot decode into more than one input may. A fixed-size
  tensor is counted from its shape before its data is decoded; a BYTES tensor once decoded.
  Binary and raw tensor data are views of the body itself (no expansion; ``--max-body-size``,
  ``--grpc-max-message-size`` bound them) and are not counted.

Both refusals are 400 / INVALID_ARGUMENT naming the tensor at fault, the limit and the option
that sets it. Pure: no I/O.
"""

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
