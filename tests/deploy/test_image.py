"""The container image without a container engine: hadolint on the Dockerfile, its shape (multi-
stage, slim Python 3.11, non-root, entry point, CUDA extra behind an argument, health check),
and its install steps — deploy/install_image.sh, which the Dockerfile runs — run into a fresh
venv from a wheel of this tree; the venv then serves, and the image's HEALTHCHECK command
passes against it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.deploy.deploytools import ROOT, run, venv_tool
from v2proxy import __version__

DOCKERFILE = ROOT / "Dockerfile"
SCRIPT = ROOT / "deploy" / "install_image.sh"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_passes() -> None:
    out = run(venv_tool("hadolint"), "--no-color", "--failure-threshold", "info", str(DOCKERFILE))
    assert out == ""


def test_dockerfile_shape() -> None:
    ins = instructions()
    froms = [a for i, a in ins if i == "FROM"]
    assert froms == ["${BUILD_IMAGE} AS build", "${PYTHON_IMAGE}"]  # multi-stage
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm") in ins
    # the C module is compiled in the full image of the same Python and Debian release
    assert ("ARG", "BUILD_IMAGE=python:3.11-bookworm") in ins
    second = [n for n, (i, _) in enumerate(ins) if i == "FROM"][1]
    final = ins[second:]  # the final stage
    assert ("USER", "10001:10001") in final
    assert ("ENTRYPOINT", '["v2proxy"]') in final and ("CMD", '["serve"]') in final
    # nothing is built or installed in the final stage: the venv is copied from the build
    assert ("COPY", "--from=build /opt/v2proxy /opt/v2proxy") in final
    runs = [a for i, a in final if i == "RUN"]
    assert runs and not any(w in r for r in runs for w in ("pip", "apt-get", "gcc"))
    build = ins[:second]
    assert ("ARG", 'EXTRAS=""') in build
    (install,) = [a for i, a in build if i == "RUN"]
    assert "install_image.sh wheel" in install and "install_image.sh venv" in install
    assert '"${EXTRAS}"' in install
    healthcheck = [a for i, a in final if i == "HEALTHCHECK"]
    assert len(healthcheck) == 1 and "/v2/health/live" in healthcheck[0]


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and line[0] != "#"
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    # every file the Dockerfile copies from the context is let through
    copied = set()
    for i, args in instructions():
        if i == "COPY" and not args.startswith("--from"):
            copied |= set(args.split()[:-1])
    assert {c.rstrip("/").removeprefix("./") for c in copied} == allowed


def healthcheck_command() -> list[str]:
    (hc,) = [a for i, a in instructions() if i == "HEALTHCHECK"]
    cmd: list[str] = json.loads(hc.split(" CMD ", 1)[1])
    return cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(1200)  # two pip runs from the network, each bounded at 600 s below
def test_install_script_in_a_fresh_venv(tmp_path: Path) -> None:
    # the build context as .dockerignore leaves it: the files the Dockerfile copies
    src = tmp_path / "src-tree"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "constraints.txt", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    env = {**os.environ, "PYTHON": sys.executable, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)

    def script(*args: str) -> str:
        proc = subprocess.run(
            ["bash", str(SCRIPT), *args],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    # offline-capable: the wheel is built with this venv's setuptools
    script("wheel", str(src), str(tmp_path / "wheels"), "--no-build-isolation")
    (wheel,) = (tmp_path / "wheels").glob("v2proxy-*.whl")
    venv = tmp_path / "venv"
    out = script("venv", str(venv), str(wheel), str(src / "constraints.txt"))
    assert out.strip().endswith(f"v2proxy {__version__}")
    # no installer left in the image's venv
    assert not (venv / "bin" / "pip").exists()
    assert not list((venv / "lib").glob("python3.*/site-packages/pip"))

    http, grpc = free_port(), free_port()
    proc = subprocess.Popen(
        [str(venv / "bin" / "v2proxy"), "serve", f"--http-port={http}", f"--grpc-port={grpc}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        hc = healthcheck_command()
        assert hc[0] == "python"
        hc_env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "V2PROXY_HTTP_PORT": str(http)}
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(hc, check=False, env=hc_env, capture_output=True, timeout=10)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"HEALTHCHECK never passed: {done.stderr!r}")
            time.sleep(0.2)
        body = {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [2] * 16},
            ]
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{http}/v2/models/simple/infer", json.dumps(body).encode()
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            outputs = {o["name"]: o["data"] for o in json.load(resp)["outputs"]}
        assert outputs == {"OUTPUT0": [3] * 16, "OUTPUT1": [-1] * 16}
    finally:
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, log
    # and the health check fails once it is gone
    assert subprocess.run(hc, check=False, env=hc_env, capture_output=True).returncode != 0
