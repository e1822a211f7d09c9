"""System shared memory against hostile clients, and out of the box, through v2proxy processes
(each started as a user starts it, checked alive and serving afterwards):

- keys no library may see (a lone surrogate, NUL, over NAME_MAX, reserved prefixes), symbolic
  links and directories under ``/dev/shm``: 400 naming the region, never a crash or a 500;
- a client truncating its object in a loop while inferences read and write its region: every
  answer is 200 or a 400 naming the region, and the process never dies of SIGBUS;
- ``--max-shm-regions`` (and its cut to a quarter of the open-file limit): registrations beyond
  it get 400, and the proxy keeps accepting connections and answering probes;
- tritonclient's shm flows (HTTP and gRPC) through ``v2proxy serve --backend URL`` with no other
  option (shared memory is gated by ``--client-shm local``, not by the restricted groups).

The non-loopback client is in ``test_shm_remote_gate.py``. Every object made here is unlinked.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from peers.launch import _free_ports, _http_status, _stop
from procs import Proc, v2proxy
from test_shared_memory import simple_shm_flow

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _key(name: str) -> str:
    return f"/v2proxy_hostile_{os.getpid()}_{name}"


def post(proxy: Proc, path: str, body: bytes, timeout: float = 30.0) -> tuple[int, Any]:
    req = urllib.request.Request(proxy.base_url + path, data=body, method="POST")
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            raw = resp.read()
            return int(resp.status), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def alive_and_serving(proxy: Proc) -> None:
    os.kill(proxy.pid, 0)  # ProcessLookupError when it died
    assert _http_status(f"{proxy.base_url}/v2/health/live") == 200
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        ]
    }
    status, out = post(proxy, "/v2/models/simple/infer", json.dumps(body).encode())
    assert status == 200
    assert out["outputs"][0]["data"] == [i + 1 for i in range(16)]


@pytest.fixture(scope="module")
def proxy() -> Iterator[Proc]:
    """``v2proxy serve`` with its defaults (builtin models, --client-shm local)."""
    with v2proxy("serve", name="shm-hostile") as p:
        yield p


@contextlib.contextmanager
def shm_object(name: str, size: int) -> Iterator[tuple[str, int]]:
    """A POSIX object of ``size`` bytes: (key, fd); unlinked at the end."""
    key = _key(name)
    fd = os.open(f"/dev/shm{key}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        yield key, fd
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm{key}")


def register(proxy: Proc, name: str, body: bytes) -> tuple[int, Any]:
    return post(proxy, f"/v2/systemsharedmemory/region/{name}/register", body)


# ---------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    ("key_json", "message"),
    [
        ('"/a\\u0000b"', "invalid shm key"),
        (json.dumps("/" + "k" * 256), "invalid shm key"),
        ('"/"', "invalid shm key"),
        ('"/a/b"', "invalid shm key"),
        ('"/triton_python_backend_shm_region_1"', "reserved prefix"),
        ('"/v2proxy-0123456789abcdef-0"', "reserved prefix 'v2proxy-'"),
        ('"v2proxy-x"', "reserved prefix 'v2proxy-'"),
    ],
)
def test_bad_keys_are_refused_and_the_proxy_lives(proxy: Proc, key_json: str, message: str) -> None:
    body = f'{{"key": {key_json}, "byte_size": 16}}'.encode()
    status, err = register(proxy, "r2", body)
    assert status == 400, err
    assert message in err["error"]
    assert err["error"].startswith("cannot register shared memory region 'r2'")
    alive_and_serving(proxy)


@pytest.mark.parametrize("key_json", ['"r2\\ud800x"', '"\\ud800"', '"/\\udfff"'])
def test_lone_surrogate_key_is_refused_and_the_proxy_lives(proxy: Proc, key_json: str) -> None:
    """A key holding a lone surrogate killed the process with SIGSEGV inside posix_ipc."""
    body = f'{{"key": {key_json}, "byte_size": 16}}'.encode()
    status, err = register(proxy, "r2", body)
    assert status == 400, err
    assert "'key'" in err["error"] or "invalid shm key" in err["error"], err
    alive_and_serving(proxy)


def test_nul_key_over_grpc(proxy: Proc) -> None:
    """gRPC strings are UTF-8 checked by protobuf (no lone surrogate gets through); a key with a
    NUL is INVALID_ARGUMENT."""
    with (
        grpcclient.InferenceServerClient(proxy.grpc_url) as c,
        pytest.raises(Exception) as info,
    ):
        c.register_system_shared_memory("g", "/a\0b", 16)
    assert "INVALID_ARGUMENT" in str(info.value.status())
    assert "invalid shm key" in info.value.message()
    alive_and_serving(proxy)


def test_links_and_directories_are_client_errors(proxy: Proc) -> None:
    with shm_object("target", 4096) as (key, _):
        link = _key("link")
        folder = _key("dir")
        os.symlink(f"/dev/shm{key}", f"/dev/shm{link}")
        os.mkdir(f"/dev/shm{folder}")
        try:
            for k, why in ((link, "symbolic link"), (folder, "directory")):
                status, err = register(proxy, "x", json.dumps({"key": k, "byte_size": 16}).encode())
                assert status == 400, err
                assert why in err["error"] and "'x'" in err["error"]
                assert k not in err["error"]  # keys are never echoed
                with (
                    grpcclient.InferenceServerClient(proxy.grpc_url) as c,
                    pytest.raises(Exception) as info,
                ):
                    c.register_system_shared_memory("x", k, 16)
                assert "INVALID_ARGUMENT" in str(info.value.status())
                assert why in info.value.message()
        finally:
            os.unlink(f"/dev/shm{link}")
            os.rmdir(f"/dev/shm{folder}")
    alive_and_serving(proxy)


# ---------------------------------------------------------------------- truncation under use


def test_truncating_a_region_in_use_never_crashes_the_proxy(proxy: Proc) -> None:
    """16 MiB region read (input) and written (output) by identity_fp32 while another thread
    truncates and restores the object as fast as it can (this killed the proxy with SIGBUS
    within about a second)."""
    n = 2 * 1024 * 1024  # FP32 elements: 8 MiB in, 8 MiB out
    size = 8 * n
    with (
        httpclient.InferenceServerClient(proxy.url, network_timeout=60) as c,
        shm_object("trunc", size) as (key, fd),
    ):
        data = np.arange(n, dtype=np.float32)
        os.pwrite(fd, data.tobytes(), 0)
        c.register_system_shared_memory("trunc", key, size)
        stop = threading.Event()

        def truncate() -> None:
            while not stop.is_set():
                os.ftruncate(fd, 4096)
                os.ftruncate(fd, size)

        worker = threading.Thread(target=truncate)
        worker.start()
        answers: dict[int, int] = {}
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                i = httpclient.InferInput("INPUT0", [n], "FP32")
                i.set_shared_memory("trunc", 4 * n)
                o = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
                o.set_shared_memory("trunc", 4 * n, offset=4 * n)
                try:
                    c.infer("identity_fp32", [i], outputs=[o])
                    answers[200] = answers.get(200, 0) + 1
                except Exception as exc:  # tritonclient's InferenceServerException
                    message = str(exc)
                    assert "shared memory region 'trunc'" in message, message
                    assert "no longer usable" in message or "Invalid offset" in message, message
                    answers[400] = answers.get(400, 0) + 1
        finally:
            stop.set()
            worker.join()
        assert sum(answers.values()) >= 5, answers
        assert answers.get(400, 0) >= 1, answers  # the race was really run
        alive_and_serving(proxy)
        # once the object stays whole, the region works again, element by element
        os.pwrite(fd, data.tobytes(), 0)
        i = httpclient.InferInput("INPUT0", [n], "FP32")
        i.set_shared_memory("trunc", 4 * n)
        o = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        o.set_shared_memory("trunc", 4 * n, offset=4 * n)
        c.infer("identity_fp32", [i], outputs=[o])
        got = np.frombuffer(os.pread(fd, 4 * n, 4 * n), dtype=np.float32)
        np.testing.assert_array_equal(got, data)
        c.unregister_system_shared_memory("trunc")


# ---------------------------------------------------------------------- descriptors and bounds


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def limited_proxy(nofile: int, *args: str) -> Iterator[Proc]:
    """``v2proxy serve ARGS`` under an open-file limit of ``nofile`` (soft and hard)."""
    port, grpc_port = _free_ports(2)
    log = Path(tempfile.mkstemp(prefix="shm-fds-", suffix=".log")[1])

    cmd = [f"--nofile={nofile}:{nofile}", sys.executable, "-m", "v2proxy", "serve", *args]
    cmd = ["prlimit", *cmd, "--host", "127.0.0.1"]
    cmd += ["--http-port", str(port), "--grpc-port", str(grpc_port)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while _http_status(f"http://127.0.0.1:{port}/v2/health/live") != 200:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield Proc("shm-fds", port, grpc_port, proc.pid, log)
    finally:
        _stop(proc)
        log.unlink(missing_ok=True)


def test_regions_are_bounded_and_cost_one_descriptor_each() -> None:
    """Under a 128-file limit the bound is cut to 32; each region holds one descriptor; the
    33rd registration is a 400; new connections and probes are still answered."""
    with (
        limited_proxy(128) as p,
        shm_object("many", 4096) as (key, _),
        httpclient.InferenceServerClient(p.url) as c,
    ):
        c.get_system_shared_memory_status()  # the client's connection is open from here on
        before = _fds(p.pid)
        c.register_system_shared_memory("r0", key, 64)
        assert _fds(p.pid) == before + 1
        for i in range(1, 32):
            c.register_system_shared_memory(f"r{i}", key, 64)
        body = json.dumps({"key": key, "byte_size": 64}).encode()
        status, err = register(p, "r32", body)
        assert status == 400
        assert err["error"] == (
            "cannot register shared memory region 'r32': v2proxy already has 32 regions"
            " registered, the most it allows (--max-shm-regions); unregister some first"
        )
        # many new connections at once still get answers
        with contextlib.ExitStack() as stack:
            socks = [
                stack.enter_context(socket.create_connection(("127.0.0.1", p.port)))
                for _ in range(40)
            ]
            for s in socks:
                s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            for s in socks:
                s.settimeout(10)
                assert s.recv(64).startswith(b"HTTP/1.1 200")
        c.unregister_system_shared_memory()
        assert _fds(p.pid) == before
        alive_and_serving(p)


def test_max_shm_regions_option() -> None:
    with (
        v2proxy("serve", "--max-shm-regions", "2", name="shm-max") as p,
        shm_object("max", 4096) as (key, _),
        grpcclient.InferenceServerClient(p.grpc_url) as c,
    ):
        c.register_system_shared_memory("a", key, 64)
        c.register_system_shared_memory("b", key, 64)
        with pytest.raises(Exception) as info:
            c.register_system_shared_memory("c", key, 64)
        assert "INVALID_ARGUMENT" in str(info.value.status())
        assert "already has 2 regions registered" in info.value.message()
        c.unregister_system_shared_memory()
        c.register_system_shared_memory("c", key, 64)  # room again
        c.unregister_system_shared_memory()


# ---------------------------------------------------------------------- out of the box


@pytest.fixture(scope="module")
def sidecar() -> Iterator[Proc]:
    """A reference v2 server, and ``v2proxy serve --backend`` in front of it, nothing else."""
    with (
        v2proxy("reference-server", name="shm-ref") as ref,
        v2proxy("serve", "--backend", ref.base_url, name="shm-sidecar") as p,
    ):
        yield p


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_tritonclient_shm_flow_with_defaults(sidecar: Proc, kind: str) -> None:
    """simple_{http,grpc}_shm_client.py against a proxy started with only --backend."""
    simple_shm_flow(sidecar, kind)
