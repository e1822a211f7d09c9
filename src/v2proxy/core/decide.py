"""The one decision whether an /infer body goes to the backend as the client sent it, from data:
the body's wire form and size, whether the frontend rewrites the answer, and the backend's
:class:`~v2proxy.core.ports.RelayFacts` (:func:`relays`); and, for a whole JSON body, the check
that nothing of the proxy applies to it (:func:`relays_as_sent`).

Pure: no I/O. Compiled by mypyc: every small request asks it.
"""

from __future__ import annotations

from typing import Final

from v2proxy.codecs.relay_check import plain_json_request
from v2proxy.core.ports import RelayFacts

#: the wire forms of a body (a raw binary one is never relayed: only decoding gives its shape)
JSON: Final = "json"
BINARY: Final = "binary"
RAW: Final = "raw"
MESSAGE: Final = "message"


def relays(
    form: str, size: int, facts: RelayFacts, *, rewritten: bool = False, learnt: bool = False
) -> bool | None:
    """Whether a body of wire form ``form`` and ``size`` bytes goes to the backend as sent, never
    when the frontend rewrites the answer. None when a fact is unknown: ask again once it is
    ``learnt`` (an unknown capability then relays JSON, which every v2 REST server takes)."""
    if rewritten:
        return False
    if form == JSON:
        if size < facts.json_below:
            return True
        if not facts.json_auto:
            return False
        binary = facts.binary_tensors
        if binary is None:
            return True if learnt else None
        return not binary
    if form == BINARY:
        if not facts.rest:
            return False
        binary = facts.binary_tensors
        if binary is None:
            return False if learnt else None
        return binary
    if form != MESSAGE or not facts.grpc or size >= facts.message_below:
        return False
    decoupled = facts.decoupled
    if decoupled is None:
        return False if learnt else None
    return not decoupled


def relays_as_sent(body: bytes | bytearray, max_input_size: int, max_tensors: int) -> bool:
    """Whether a whole JSON /infer body needs nothing of the proxy, checked without decoding
    (:func:`~v2proxy.codecs.relay_check.plain_json_request`): no stage applies and the full
    decoder would accept it. Never True of a body it cannot rule on, which then takes the decoded
    path, so bad input never reaches the backend."""
    return plain_json_request(body, max_input_size, max_tensors)
