"""The MindIE frontend's one error translator (docs/protocol.md, MindIE clients: errors): every
error of the tree answered with MindIE's status and ``error_type``."""

from __future__ import annotations

import pytest

from v2proxy.core.errors import (
    BackendError,
    BackendUnavailable,
    BadGateway,
    BodyTooLarge,
    CodecError,
    GatewayTimeout,
    InvalidRequest,
    NotFound,
    ProxyError,
    Unsupported,
)
from v2proxy.frontends.mindie import translate

TIMEOUT = "Engine callback timeout: client timeout"


@pytest.mark.parametrize(
    ("exc", "status", "error_type", "message"),
    [
        (CodecError("Inputs must not be null."), 422, "Input Validation Error", None),
        (InvalidRequest("bad"), 422, "Input Validation Error", None),
        (BackendError("backend refused", 400), 422, "Input Validation Error", None),
        (BackendError("unprocessable", 422), 422, "Input Validation Error", None),
        (NotFound("Request for unknown model: 'x'"), 424, "Generation Error", None),
        (BackendError("not found", 404), 424, "Generation Error", None),
        (Unsupported("decoupled"), 424, "Generation Error", None),
        (
            BackendError("HTTP end point doesn't support decoupled", 501),
            424,
            "Generation Error",
            None,
        ),
        (BackendUnavailable("refused"), 503, "Service Unavailable", None),
        (BackendError("busy", 429), 503, "Service Unavailable", None),
        (BackendError("not ready", 503), 503, "Service Unavailable", None),
        (BackendError("model crashed", 500), 500, "Incomplete Generation", None),
        (BadGateway("truncated answer"), 500, "Incomplete Generation", None),
        (GatewayTimeout("no answer in 60 s"), 500, "Incomplete Generation", TIMEOUT),
        (BodyTooLarge("too big"), 413, "Input Validation Error", None),
    ],
)
def test_translate(exc: ProxyError, status: int, error_type: str, message: str | None) -> None:
    assert translate(exc) == (status, error_type, message or exc.message)
