"""``--client-shm local`` (the default) against a client on another address: in a private
network namespace (``unshare --net``, as root) whose loopback interface also holds 192.0.2.1,
``shm_remote_probe.py`` registers a region from 127.0.0.1 and then tries every shared-memory use
from 192.0.2.1 over REST and gRPC: status (all, and one), register, an inference reading the
region as an input, one writing it as an output, unregister. Each is refused (403 /
PERMISSION_DENIED) naming the gate, the region's bytes are untouched, the local client keeps its
region, and the remote client may still infer without shared memory. No packet leaves the
namespace."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("shm_remote_probe.py")
GATE = "Client shared memory is allowed only from loopback or a unix socket"


def test_non_loopback_client_is_refused_every_shm_use() -> None:
    assert shutil.which("unshare") and shutil.which("ip"), "needs util-linux and iproute2"
    proc = subprocess.run(
        ["unshare", "--net", sys.executable, str(PROBE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["local_status"]["status"] == "ok"
    for op in ("status", "status_one", "register", "infer_input", "infer_output", "unregister"):
        http, grpc = got[f"http_{op}"], got[f"grpc_{op}"]
        assert http["status"] == "403", (op, http)
        assert grpc["status"] == "StatusCode.PERMISSION_DENIED", (op, grpc)
        for answer in (http, grpc):
            assert GATE in answer["message"], (op, answer)
    assert got["http_plain_infer"]["status"] == got["grpc_plain_infer"]["status"] == "ok"
    assert got["bytes_untouched"] is True
    assert [r["name"] for r in got["local_after"]] == ["r"]
    assert got["local_infer_input"]["status"] == "ok"
    assert got["alive"] is True


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
