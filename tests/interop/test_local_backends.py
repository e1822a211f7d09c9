"""docs/guides/local-backend.md with the real peers: ``make backend-NAME`` runs
``tests/interop/peers/launch.py NAME --http-port 8000 --grpc-port 8001`` (tests/unit/
test_doc_commands.py checks that); here the same command on free ports, v2proxy in front of it,
and the page's curl, whose answer is the one the page shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from peers.launch import _free_ports, _stop
from procs import v2proxy

from tests.doc_blocks import block

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/guides/local-backend.md"

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("name", ["triton", "kserve", "mlserver"])
def test_a_peer_started_as_the_page_says_answers_as_it_shows(name: str) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    http, grpc = _free_ports(2)
    command = [sys.executable, "tests/interop/peers/launch.py", name]
    command += ["--http-port", str(http), "--grpc-port", str(grpc)]
    peer = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ,
        start_new_session=True,  # stopped as a group, as _stop expects
    )
    try:
        assert peer.stdout is not None and peer.stderr is not None
        ready = peer.stdout.readline()
        assert ready.startswith(f"{name} ready on http://127.0.0.1:{http} and grpc://"), (
            ready + peer.stderr.read()
        )
        with v2proxy("serve", "--backend", f"http://127.0.0.1:{http}") as proxy:
            code = block(PAGE, "ref-infer").replace("localhost:9000", f"localhost:{proxy.port}")
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", code],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
        answer = done.stdout.rstrip("\n")
        if name == "triton":
            assert answer == block(PAGE, "ref-infer", output=True)
            return
        shown = json.loads(block(PAGE, "peer-infer", output=True))
        got = json.loads(answer)
        assert "id" in got and "parameters" in got  # as the page says
        assert [o["data"] for o in got["outputs"]] == [o["data"] for o in shown["outputs"]]
        if name == "mlserver":  # exactly the answer shown, but for its id
            assert answer.replace(got["id"], shown["id"]) == json.dumps(
                shown, separators=(",", ":")
            )
    finally:
        _stop(peer)
        for stream in (peer.stdout, peer.stderr):
            if stream is not None:
                stream.close()
