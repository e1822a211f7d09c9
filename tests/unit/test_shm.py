"""Shared-memory bounds, keys, peers, the registry's reference counts and the pipeline stage
(v2proxy.core.stages.shm, v2proxy.shm.registry, v2proxy.shm.system), table-driven, on real POSIX
shared-memory objects (each unlinked at the end)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import posix_ipc
import pytest

from v2proxy.core.errors import AlreadyExists, InvalidRequest, NotFound, ProxyError
from v2proxy.core.model import Datatype, InferRequest, InferResponse, RequestedOutput, Tensor
from v2proxy.core.stages.shm import SIZE_MAX, WITH_BINARY, check_client, is_local, locate, resolve
from v2proxy.frontends.grpc_shm import peer_host
from v2proxy.ops.metrics import Counter
from v2proxy.shm.registry import Registry
from v2proxy.shm.system import normal_key

N = "r"


@pytest.mark.parametrize(
    ("region", "offset", "size", "message"),
    [
        (128, 0, 128, None),
        (128, 64, 64, None),
        (128, 127, 1, None),
        (128, 0, 0, None),
        (128, 128, 0, f"Invalid offset for shared memory region: '{N}'"),
        (128, 2**64 - 32, 16, f"Invalid offset for shared memory region: '{N}'"),
        (128, 2**63 - 1, 1, f"Invalid offset for shared memory region: '{N}'"),
        (128, 0, 129, f"Invalid offset + byte size for shared memory region: '{N}'"),
        (128, 64, 2**63, f"Invalid offset + byte size for shared memory region: '{N}'"),
        (
            128,
            64,
            SIZE_MAX,
            f"Integer overflow detected: byte_size ({SIZE_MAX}) + offset (64) exceeds maximum"
            f" value ({SIZE_MAX}) for region '{N}'",
        ),
    ],
)
def test_locate(region: int, offset: int, size: int, message: str | None) -> None:
    if message is None:
        locate(N, region, offset, size)
        return
    with pytest.raises(InvalidRequest) as err:
        locate(N, region, offset, size)
    assert err.value.message == message


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("/k", "/k"),
        ("k", "/k"),
        ("///k", "/k"),
        ("/", None),
        ("///", None),
        ("", None),
        ("/a/b", None),
        ("/..", None),
        ("/.", None),
        ("/a\x00b", None),
        ("/" + "x" * 256, None),
        ("/triton_python_backend_shm_region_x", "reserved"),
        ("///triton_python_backend_shm_region_x", "reserved"),
        ("/v2proxy-0123-0", "reserved"),
        ("v2proxy-x", "reserved"),
        ("/r2\ud800x", None),  # a lone surrogate: posix_ipc died of it (SIGSEGV)
        ("\udfff", None),
        ("/" + "\u00e9" * 128, None),  # 256 bytes of UTF-8
        ("/" + "\u00e9" * 127, "/" + "\u00e9" * 127),  # 254: fits NAME_MAX
    ],
)
def test_normal_key(key: str, expected: str | None) -> None:
    if expected is not None and expected != "reserved":
        assert normal_key(N, key) == expected
        return
    with pytest.raises(InvalidRequest) as err:
        normal_key(N, key)
    assert key.strip("/") == "" or key.strip("/") not in err.value.message  # never echoed
    word = "reserved prefix" if expected == "reserved" else "invalid shm key"
    assert word in err.value.message


@pytest.mark.parametrize(
    ("peer", "host", "local"),
    [
        ("ipv4:127.0.0.1:5000", "127.0.0.1", True),
        ("ipv4:127.8.9.1:5000", "127.8.9.1", True),
        ("ipv4:10.0.0.1:5000", "10.0.0.1", False),
        ("ipv6:[::1]:5000", "::1", True),
        ("ipv6:%5B::1%5D:5000", "::1", True),
        ("ipv6:[::ffff:127.0.0.1]:5000", "::ffff:127.0.0.1", True),
        ("ipv6:[2001:db8::1]:5000", "2001:db8::1", False),
        ("unix:/tmp/sock", None, True),
        ("weird", "", False),
        ("", "", False),
    ],
)
def test_peer_locality(peer: str, host: str | None, local: bool) -> None:
    assert peer_host(peer) == host
    assert is_local(host) is local


def test_client_shm_modes() -> None:
    check_client("on", "10.0.0.1")
    check_client("local", "127.0.0.1")
    check_client("local", None)
    with pytest.raises(ProxyError, match="--client-shm local") as err:
        check_client("local", "10.0.0.1")
    assert err.value.http_status == 403
    with pytest.raises(ProxyError, match="--client-shm off") as err:
        check_client("off", "127.0.0.1")
    assert err.value.http_status == 501


@pytest.fixture
def obj() -> Iterator[tuple[str, posix_ipc.SharedMemory]]:
    key = f"/v2proxy_unit_{os.getpid()}"
    mem = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=4 * 4096)
    try:
        yield key, mem
    finally:
        mem.close_fd()
        mem.unlink()


def test_registry_register_status_and_refusals(obj: tuple[str, Any]) -> None:
    key, _ = obj
    gauges = (Counter(), Counter())
    reg = Registry(gauges=gauges)
    reg.register("a", key, 0, 128)
    reg.register("b", key, 4096 + 3, 100)  # not page-aligned: accepted
    assert reg.status("") == [
        {"name": "a", "key": key, "offset": 0, "byte_size": 128},
        {"name": "b", "key": key, "offset": 4099, "byte_size": 100},
    ]
    assert (gauges[0].value, gauges[1].value) == (2, 228)
    with pytest.raises(AlreadyExists, match="'a' already in manager"):
        reg.register("a", key, 0, 1)
    for offset, size in ((0, 4 * 4096 + 1), (1, 4 * 4096), (4 * 4096, 1), (4 * 4096 + 1, 0)):
        with pytest.raises(InvalidRequest) as err:
            reg.register("c", key, offset, size)
        assert err.value.message == "failed to register shared memory region 'c': invalid args"
    with pytest.raises(InvalidRequest, match="address spaceInvalid argument"):
        reg.register("c", key, 0, 0)
    with pytest.raises(InvalidRequest) as err:  # Triton: 500 for the client's fault
        reg.register("c", "/v2proxy_unit_no_such_object", 0, 1)
    assert err.value.http_status == 400
    assert "no_such_object" not in err.value.message
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'c'"):
        reg.status("c")
    reg.unregister("nope")  # a no-op
    reg.unregister("")
    assert reg.status("") == []
    assert (gauges[0].value, gauges[1].value) == (0, 0)


def test_registry_defers_unregister_while_in_use(obj: tuple[str, Any]) -> None:
    key, _ = obj
    reg = Registry()
    reg.register("a", key, 0, 64)
    region = reg.acquire("a")
    reg.unregister("a")
    assert [r["name"] for r in reg.status("")] == ["a"]  # still listed while in use
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'a'"):
        reg.acquire("a")  # no new users
    with pytest.raises(AlreadyExists):
        reg.register("a", key, 0, 64)
    region.write(0, b"\7")  # still mapped for the request that holds it
    assert bytes(region.read(0, 1)) == b"\7"
    reg.release(region)
    assert reg.status("") == []
    with pytest.raises(InvalidRequest, match="no longer usable"):
        region.read(0, 1)  # unmapped with the last user: never touched after
    reg.register("a", key, 0, 64)  # the name is free again
    reg.close()


def test_truncated_object_is_refused_not_touched(obj: tuple[str, Any]) -> None:
    key, mem = obj
    reg = Registry()
    reg.register("a", key, 4096, 64)
    region = reg.acquire("a")
    region.check()
    os.ftruncate(mem.fd, 4096)
    with pytest.raises(InvalidRequest, match="no longer usable"):
        region.check()
    # the copies themselves fault safely (no SIGBUS): a 400 naming the region
    for touch in (lambda: region.read(0, 64), lambda: region.write(0, b"x" * 64)):
        with pytest.raises(InvalidRequest, match="region 'a' is no longer usable"):
            touch()
    reg.release(region)
    reg.close()


def test_region_names_must_be_text(obj: tuple[str, Any]) -> None:
    reg = Registry()
    with pytest.raises(InvalidRequest, match="name is not valid UTF-8"):
        reg.register("a\ud800", obj[0], 0, 64)
    assert reg.status("") == []


def test_registry_bound(obj: tuple[str, Any]) -> None:
    reg = Registry(max_regions=2)
    reg.register("a", obj[0], 0, 64)
    reg.register("b", obj[0], 0, 64)
    with pytest.raises(InvalidRequest) as err:
        reg.register("c", obj[0], 0, 64)
    assert err.value.http_status == 400
    assert "already has 2 regions registered" in err.value.message
    reg.unregister("a")
    reg.register("c", obj[0], 0, 64)
    reg.close()


def _request(inputs: list[Tensor], outputs: list[RequestedOutput] | None) -> InferRequest:
    return InferRequest("simple", inputs, outputs)


def _shm(name: str, size: int, offset: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "shared_memory_region": name,
        "shared_memory_byte_size": size,
        "shared_memory_offset": offset,
        **extra,
    }


def test_resolve_views_writes_and_releases(obj: tuple[str, Any]) -> None:
    key, _ = obj
    reg = Registry()
    reg.register("in", key, 0, 128)
    reg.register("out", key, 4096, 128)
    a = np.arange(16, dtype="<i4")
    held = reg.acquire("in")
    held.write(64, a.tobytes())
    reg.release(held)
    req = _request(
        [Tensor("INPUT0", Datatype.INT32, (1, 16), b"", _shm("in", 64, 64, x=1))],
        [RequestedOutput("OUTPUT0", _shm("out", 128, binary_data=False))],
    )
    use = resolve(req, reg, peer=None)
    assert use is not None
    assert req.inputs[0].parameters == {"x": 1}
    assert isinstance(req.inputs[0].data, memoryview)
    assert bytes(req.inputs[0].data) == a.tobytes()
    assert req.outputs is not None and req.outputs[0].parameters == {}
    assert reg.users("in") == reg.users("out") == 1
    out = Tensor("OUTPUT0", Datatype.INT32, (1, 16), (a * 2).tobytes(), {"p": 1})
    use.write_outputs(InferResponse("simple", [out]))
    assert out.in_shm and out.data == b"" and out.parameters == {}
    assert bytes(reg.acquire("out").read(0, 64)) == (a * 2).tobytes()
    use.release()
    assert reg.users("out") == 1  # only the acquire above
    reg.close()


@pytest.mark.parametrize(
    ("inputs", "outputs", "error", "message"),
    [
        ([_shm("in", 64)], [], InvalidRequest, None),  # ok (size checked below)
        ([_shm("in", 128)], [], InvalidRequest,
         "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 128"),
        ([_shm("nope", 64)], [], NotFound, "Unable to find shared memory region: 'nope'"),
        ([_shm("in", 64, 128)], [], InvalidRequest,
         "Invalid offset for shared memory region: 'in'"),
        ([], [_shm("out", 64, binary_data=True)], InvalidRequest, WITH_BINARY),
        ([], [_shm("out", 64, classification=1)], InvalidRequest,
         "Output can't set both 'shared_memory_region' and 'classification'"),
        ([{"shared_memory_region": 3}], [], InvalidRequest, "expected string_param"),
        ([_shm("in", -1)], [], InvalidRequest, "expected a non-negative integer"),
    ],
)  # fmt: skip
def test_resolve_errors_release_everything(
    obj: tuple[str, Any],
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    error: type[ProxyError],
    message: str | None,
) -> None:
    key, _ = obj
    reg = Registry()
    reg.register("in", key, 0, 128)
    reg.register("out", key, 0, 128)
    req = _request(
        [Tensor("INPUT0", Datatype.INT32, (1, 16), b"", p) for p in inputs],
        [RequestedOutput("OUTPUT0", p) for p in outputs],
    )
    if message is None:
        use = resolve(req, reg, peer=None)
        assert use is not None
        use.release()
    else:
        with pytest.raises(error) as err:
            resolve(req, reg, peer=None)
        assert message in err.value.message
    assert reg.users("in") == reg.users("out") == 0
    reg.close()


def test_output_too_small(obj: tuple[str, Any]) -> None:
    key, _ = obj
    reg = Registry()
    reg.register("out", key, 0, 128)
    req = _request([], [RequestedOutput("OUTPUT0", _shm("out", 32))])
    use = resolve(req, reg, peer=None)
    assert use is not None
    with pytest.raises(ProxyError) as err:
        use.write_outputs(
            InferResponse("simple", [Tensor("OUTPUT0", Datatype.INT32, (16,), b"\0" * 64)])
        )
    assert err.value.http_status == 500
    assert err.value.message == (
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be"
        " at least 64 bytes to hold the results"
    )
    use.release()
    reg.close()
