"""Run inside a private network namespace (``unshare --net``) by ``test_shm_remote_gate.py``:
gives the namespace's loopback interface a second, non-loopback address (192.0.2.1, TEST-NET-1,
never routed: nothing leaves the namespace), starts ``v2proxy serve`` with its defaults on
0.0.0.0, registers regions from a local client (127.0.0.1) and then tries every shared-memory
use from a client whose address is 192.0.2.1, over REST and gRPC. Prints one JSON object: what
each attempt got (status and message), and whether the regions' bytes were left untouched.

Usage: python shm_remote_probe.py   (as root, in a fresh network namespace)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

REMOTE = "192.0.2.1"
HTTP, GRPC = 19000, 19001
KEY = f"/v2proxy_remote_probe_{os.getpid()}"
SIZE = 128


def _live(host: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{host}:{HTTP}/v2/health/live", timeout=1) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        fn()
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}
    return {"status": "ok", "message": ""}


def _infer(mod: Any, client: Any, where: str) -> None:
    """simple with INPUT0 (where == "input") or OUTPUT0 (where == "output") in region "r"."""
    i0 = mod.InferInput("INPUT0", [1, 16], "INT32")
    i1 = mod.InferInput("INPUT1", [1, 16], "INT32")
    ones = np.ones((1, 16), dtype=np.int32)
    i1.set_data_from_numpy(ones)
    if where == "input":
        i0.set_shared_memory("r", 64)
        client.infer("simple", [i0, i1])
    else:
        i0.set_data_from_numpy(ones)
        o0 = mod.InferRequestedOutput("OUTPUT0")
        o0.set_shared_memory("r", 64)
        client.infer("simple", [i0, i1], outputs=[o0])


def _plain(mod: Any, client: Any) -> None:
    """An inference naming no region: a remote client may still infer."""
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = mod.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        inputs.append(i)
    out = client.infer("simple", inputs).as_numpy("OUTPUT0")
    assert out.tolist() == [[2] * 16], out


def main() -> None:
    for cmd in (
        ["ip", "link", "set", "lo", "up"],
        ["ip", "addr", "add", f"{REMOTE}/32", "dev", "lo"],
    ):
        subprocess.run(cmd, check=True)
    ports = ("--http-port", str(HTTP), "--grpc-port", str(GRPC))
    proc = subprocess.Popen(
        [sys.executable, "-m", "v2proxy", "serve", *ports],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fd = os.open(f"/dev/shm{KEY}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    results: dict[str, Any] = {}
    try:
        os.ftruncate(fd, SIZE)
        marker = bytes(range(SIZE))
        os.pwrite(fd, marker, 0)
        deadline = time.monotonic() + 30
        while not (_live("127.0.0.1") and _live(REMOTE)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("v2proxy did not start")
            time.sleep(0.05)
        with httpclient.InferenceServerClient(f"127.0.0.1:{HTTP}") as local:
            local.register_system_shared_memory("r", KEY, SIZE)
            results["local_status"] = _attempt(local.get_system_shared_memory_status)
            for kind, mod, url in (
                ("http", httpclient, f"{REMOTE}:{HTTP}"),
                ("grpc", grpcclient, f"{REMOTE}:{GRPC}"),
            ):
                with mod.InferenceServerClient(url) as c:
                    results[f"{kind}_status"] = _attempt(c.get_system_shared_memory_status)
                    results[f"{kind}_status_one"] = _attempt(
                        lambda c=c: c.get_system_shared_memory_status("r")
                    )
                    results[f"{kind}_register"] = _attempt(
                        lambda c=c, k=kind: c.register_system_shared_memory(f"x{k}", KEY, SIZE)
                    )
                    results[f"{kind}_infer_input"] = _attempt(
                        lambda c=c, m=mod: _infer(m, c, "input")
                    )
                    results[f"{kind}_infer_output"] = _attempt(
                        lambda c=c, m=mod: _infer(m, c, "output")
                    )
                    results[f"{kind}_unregister"] = _attempt(
                        lambda c=c: c.unregister_system_shared_memory("r")
                    )
                    results[f"{kind}_plain_infer"] = _attempt(lambda c=c, m=mod: _plain(m, c))
            results["bytes_untouched"] = os.pread(fd, SIZE, 0) == marker
            results["local_after"] = local.get_system_shared_memory_status()
            # the local client still uses its region
            results["local_infer_input"] = _attempt(lambda: _infer(httpclient, local, "input"))
            results["alive"] = proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)
        os.close(fd)
        os.unlink(f"/dev/shm{KEY}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
