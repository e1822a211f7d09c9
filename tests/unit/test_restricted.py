"""Restricted API groups: parsing, defaults, and the header check (Triton's 403 text)."""

from __future__ import annotations

from typing import Any

import pytest

from v2proxy._proto.service import SERVICE
from v2proxy.core.errors import Forbidden, ProxyError
from v2proxy.core.restricted import (
    DEFAULT_GROUPS,
    GROUPS,
    RestrictedPolicy,
    parse_groups,
    parse_header,
)
from v2proxy.frontends.grpc_routes import HEALTH_SERVICE, RPCS

#: which group each RPC belongs to in Triton (grpc_server.cc): every group has an RPC
TRITON_GRPC_GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        (None, frozenset()),
        ("", frozenset()),
        ("none", frozenset()),
        (" None ", frozenset()),
        ("logging", {"logging"}),
        ("Logging, TRACE ,", {"logging", "trace"}),
        (["model-repository", "shared-memory"], {"model-repository", "shared-memory"}),
        (",".join(sorted(GROUPS)), GROUPS),
    ],
)
def test_parse_groups(text: Any, groups: frozenset[str]) -> None:
    assert parse_groups(text) == groups


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("admin", "unknown API group 'admin'"),
        ("logging,none", "unknown API group 'none'"),
        ("logging;trace", "unknown API group 'logging;trace'"),
        ("model_repository", "unknown API group 'model_repository'"),
    ],
)
def test_parse_groups_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_groups(text)


@pytest.mark.parametrize(
    ("text", "header"),
    [
        (None, None),
        ("", None),
        ("X-Admin-Key=s3cret", ("x-admin-key", "s3cret")),
        (" k = v=w ", ("k", "v=w")),  # split at the first '='; spaces around dropped
    ],
)
def test_parse_header(text: Any, header: tuple[str, str] | None) -> None:
    assert parse_header(text) == header


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x-key", "must be KEY=VALUE"),
        ("=value", "must be KEY=VALUE"),
        ("x-key=", "must be KEY=VALUE"),
        ("x key=v", "'x key' is not a valid header name"),
        ("x-key=caf\u00e9", "printable ASCII"),
        ("x-key=a\nb", "printable ASCII"),
    ],
)
def test_parse_header_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_header(text)


def test_defaults_and_tables() -> None:
    policy = RestrictedPolicy()
    assert (
        policy.groups
        == DEFAULT_GROUPS
        == {
            "model-repository",
            "logging",
            "trace",
        }
    )
    assert not policy.restricts("shared-memory")  # --client-shm local gates it
    assert policy.header is None
    assert set(TRITON_GRPC_GROUPS.values()) == GROUPS
    assert RestrictedPolicy.parse("none", "") == RestrictedPolicy(frozenset(), None)
    assert policy.restricts("logging") and not policy.restricts("inference")


def test_the_grpc_method_table_groups_the_rpcs_as_triton() -> None:
    """The gRPC frontend's method table (``v2proxy.frontends.grpc_routes``) gives every RPC of
    the inference service Triton's group, and the health service's the ``health`` group."""
    own = {name: row.group for name, row in RPCS.items() if row.service == SERVICE}
    assert own == TRITON_GRPC_GROUPS
    health = {name: row.group for name, row in RPCS.items() if row.service == HEALTH_SERVICE}
    assert health == {"Check": "health", "Watch": "health"}


def test_forbidden_is_403_and_permission_denied() -> None:
    assert issubclass(Forbidden, ProxyError)
    assert (Forbidden.http_status, Forbidden.grpc_code) == (403, "PERMISSION_DENIED")


KEYED = RestrictedPolicy(frozenset({"logging", "trace"}), ("x-admin-key", "s3cret"))
OPEN = RestrictedPolicy(frozenset(), None)
CLOSED = RestrictedPolicy(frozenset({"logging"}), None)
EXPECTING = "This API is restricted, expecting header 'x-admin-key'"
REFUSED = (
    "This API is restricted: 'logging' is refused unless --restricted-api-header KEY=VALUE"
    " is set and the request carries that header"
)


@pytest.mark.parametrize(
    ("policy", "group", "headers", "error"),
    [
        # unrestricted groups pass whatever the headers
        (KEYED, "inference", {}, None),
        (KEYED, "metadata", [], None),
        (OPEN, "logging", {}, None),
        (OPEN, "model-repository", [(b"x", b"y")], None),
        # the right header, in every form a frontend has it
        (KEYED, "logging", {"x-admin-key": "s3cret"}, None),
        (KEYED, "trace", {"X-Admin-Key": "s3cret"}, None),  # name case-insensitive
        (KEYED, "logging", [(b"X-ADMIN-KEY", b"s3cret")], None),  # raw HTTP header pairs
        (KEYED, "logging", [("x-admin-key", "s3cret")], None),  # gRPC metadata tuple
        (KEYED, "logging", ((b"host", b"h"), (b"x-admin-key", b" s3cret ")), None),  # OWS
        (KEYED, "logging", [("x-admin-key", "no"), ("x-admin-key", "s3cret")], None),
        # missing or wrong
        (KEYED, "logging", {}, EXPECTING),
        (KEYED, "logging", {"x-other": "s3cret"}, EXPECTING),
        (KEYED, "logging", {"x-admin-key": "S3CRET"}, EXPECTING),  # value exact
        (KEYED, "logging", {"x-admin-key": "s3cret2"}, EXPECTING),
        (KEYED, "logging", {"x-admin-key": ""}, EXPECTING),
        (KEYED, "logging", [(b"x-admin-key", b"s3cre")], EXPECTING),
        (KEYED, "trace", {"x-admin-key": "s3cr\u00e9t"}, EXPECTING),
        (KEYED, "logging", [(b"x-admin-key-bin", b"s3cret")], EXPECTING),
        # no header configured: refused to everyone, naming the option
        (CLOSED, "logging", {}, REFUSED),
        (CLOSED, "logging", {"x-admin-key": "s3cret"}, REFUSED),
    ],
)
def test_check(policy: RestrictedPolicy, group: str, headers: Any, error: str | None) -> None:
    if error is None:
        policy.check(group, headers)
        return
    with pytest.raises(Forbidden) as info:
        policy.check(group, headers)
    assert info.value.message == error
    assert "s3cret" not in info.value.message


def test_repr_hides_the_value() -> None:
    assert "s3cret" not in repr(KEYED)
    assert "x-admin-key" in repr(KEYED)


def test_policy_is_frozen() -> None:
    with pytest.raises(AttributeError):
        KEYED.groups = frozenset()  # type: ignore[misc]
