"""Start the real peer model servers (KServe, MLServer, Triton) for interop tests.

Standard library only: this module is imported from the main test
environment and never imports kserve, mlserver or pytriton itself. Each server
runs as a subprocess from its own venv (made by ``setup_peers.sh``)::

    from tests.interop.peers import launch   # or however the tests import it

    with launch.kserve_server(launch.peers_dir()) as peer:
        peer.http_url   # "127.0.0.1:PORT"  (no scheme, tritonclient style)
        peer.grpc_url   # "127.0.0.1:PORT"
        peer.pid

Every server listens on 127.0.0.1 only, on free ports picked here, and log
into a temporary file (kept, and its tail shown, when start-up fails). On
exit the server's whole process group gets SIGTERM, then SIGKILL.

Environment:
    V2PROXY_PEERS_DIR            where the venvs live (default <repo>/.cache/peers)
    V2PROXY_PEER_START_TIMEOUT   seconds to wait for readiness (default 90)
    V2PROXY_PEER_LOG_DIR         keep server logs in this folder instead of a
                                 temporary one that is removed on exit

``python launch.py kserve|mlserver|triton`` starts one server and keeps it running
until Ctrl-C (handy for poking at it with curl).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
SETUP_SCRIPT = HERE / "setup_peers.sh"
STAMP_NAME = ".v2proxy-peer-stamp"  # written by setup_peers.sh
TRITON_MODELS = HERE / "triton_models"  # Triton's model repository (python backend)

DEFAULT_START_TIMEOUT = 90.0
STOP_GRACE_S = 5.0
READY_MODEL = "simple"

PathLike = Union[str, "os.PathLike[str]"]


class PeerUnavailable(RuntimeError):
    """The peer's venv is missing: run setup_peers.sh (tests may skip on this)."""


class PeerStartError(RuntimeError):
    """The peer server died or did not become ready in time."""


def peers_dir() -> Path:
    """Folder holding the peer venvs: $V2PROXY_PEERS_DIR or <repo>/.cache/peers."""
    env = os.environ.get("V2PROXY_PEERS_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return REPO_ROOT / ".cache" / "peers"


def ensure_peers(directory: PathLike | None = None) -> Path:
    """Run setup_peers.sh for ``directory`` (quick no-op when up to date)."""
    d = Path(directory) if directory is not None else peers_dir()
    proc = subprocess.run(
        ["bash", str(SETUP_SCRIPT), str(d)],
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if proc.returncode != 0:
        raise PeerUnavailable(f"setup_peers.sh failed (rc={proc.returncode}):\n{proc.stdout}")
    return d.resolve()


@dataclass
class PeerServer:
    name: str
    http_port: int
    grpc_port: int
    pid: int
    log_path: Path
    startup_s: float = 0.0
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.http_url}"

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(data.splitlines()[-lines:])


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held together while picking)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# Never route loopback probes through an http(s)_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def _child_env() -> dict:
    env = dict(os.environ)
    # The peer venv must not see the main test venv's paths.
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        env.pop(k, None)
    env["V2PROXY_PEER_PARENT_PID"] = str(os.getpid())  # servers exit when we die
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group led by proc.pid, SIGKILL it after ``grace``."""
    pgid = proc.pid  # started with start_new_session=True: pgid == pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        # poll() reaps the leader, so an empty group means everything is gone.
        if proc.poll() is not None and not _group_alive(pgid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=grace)


#: builds a server's command line and extra environment: (venv, http port, grpc port)
Command = Callable[[Path, int, int], tuple[list[str], dict[str, str]]]


def _script(script: str) -> Command:
    """A peer written in Python: ``VENV/bin/python SCRIPT --http-port P --grpc-port G``."""

    def command(venv: Path, http_port: int, grpc_port: int) -> tuple[list[str], dict[str, str]]:
        return [
            str(venv / "bin" / "python"),
            str(HERE / script),
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
        ], {}

    return command


def _triton_command(venv: Path, http_port: int, grpc_port: int) -> tuple[list[str], dict[str, str]]:
    """tritonserver from the tree setup_peers.sh prepared in VENV/tritonserver, serving
    triton_models/ on loopback, without its metrics port."""
    tree = venv / "tritonserver"
    libs = (tree / "LIBS_DIR").read_text().strip()
    env = {
        # the bundled shared libraries; the python backend stub runs the models with the
        # venv's python, found first on PATH
        "LD_LIBRARY_PATH": os.pathsep.join(
            p for p in (libs, os.environ.get("LD_LIBRARY_PATH", "")) if p
        ),
        "PATH": os.pathsep.join((str(venv / "bin"), os.environ.get("PATH", ""))),
    }
    cmd = [
        str(tree / "bin" / "tritonserver"),
        f"--model-repository={TRITON_MODELS}",
        f"--backend-directory={tree / 'backends'}",
        f"--cache-directory={tree / 'caches'}",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        "--allow-metrics=false",
        "--allow-sagemaker=false",
        "--allow-vertex-ai=false",
        "--exit-timeout-secs=3",
        "--log-verbose=0",
    ]
    return cmd, env


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel SIGTERM the child when the launching process dies
    (Linux prctl PR_SET_PDEATHSIG), looked up before the fork so that the child only makes
    one libc call. The Python peers watch V2PROXY_PEER_PARENT_PID themselves; tritonserver
    cannot."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return preexec


#: what each peer's venv holds once complete (its name, the file setup_peers.sh makes last)
READY_FILES = {
    "kserve": "bin/python",
    "mlserver": "bin/python",
    "triton": "tritonserver/backends/python/triton_python_backend_stub",
}


def check_venv(
    name: str, venv_name: str, directory: PathLike | None = None, ready_file: str = "bin/python"
) -> Path:
    """The peer's venv, complete; else PeerUnavailable naming the command that builds it."""
    d = Path(directory) if directory is not None else peers_dir()
    venv = Path(d) / venv_name
    # setup_peers.sh writes the stamp only after a successful install.
    if not ((venv / ready_file).exists() and (venv / STAMP_NAME).is_file()):
        raise PeerUnavailable(
            f"{name}: no complete venv at {venv}; "
            f"run: make peers (or bash {SETUP_SCRIPT.relative_to(REPO_ROOT)} {d})"
        )
    return venv


@contextlib.contextmanager
def _peer(
    name: str,
    venv_name: str,
    command: Command,
    directory: PathLike | None,
    timeout: float | None,
    ready_file: str = "bin/python",
    die_with_parent: bool = False,
    ports: tuple[int, int] | None = None,
) -> Iterator[PeerServer]:
    d = Path(directory) if directory is not None else peers_dir()
    venv = check_venv(name, venv_name, d, ready_file)
    if timeout is None:
        timeout = float(os.environ.get("V2PROXY_PEER_START_TIMEOUT", DEFAULT_START_TIMEOUT))

    keep_dir = os.environ.get("V2PROXY_PEER_LOG_DIR")
    work = Path(tempfile.mkdtemp(prefix=f"v2proxy-{name}-"))
    if keep_dir:
        Path(keep_dir).mkdir(parents=True, exist_ok=True)
        log_path = Path(keep_dir) / f"{name}-{os.getpid()}-{int(time.time() * 1000)}.log"
    else:
        log_path = work / f"{name}.log"

    http_port, grpc_port = ports or _free_ports(2)
    cmd, extra_env = command(venv, http_port, grpc_port)
    started = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(work),  # MLServer reads .env / writes scratch in cwd
            env={**_child_env(), **extra_env},
            start_new_session=True,
            preexec_fn=_parent_death_signal() if die_with_parent else None,  # noqa: PLW1509
        )
    server = PeerServer(name, http_port, grpc_port, proc.pid, log_path, process=proc)
    up = False
    try:
        base = server.base_url
        deadline = started + timeout
        while True:
            rc = proc.poll()
            if rc is not None:
                raise PeerStartError(
                    f"{name} exited with rc={rc} during start-up; "
                    f"log {log_path}:\n{server.log_tail()}"
                )
            if (
                _http_status(f"{base}/v2/health/ready") == 200
                and _http_status(f"{base}/v2/models/{READY_MODEL}/ready") == 200
            ):
                break
            if time.monotonic() > deadline:
                raise PeerStartError(
                    f"{name} not ready after {timeout:.1f}s (pid {proc.pid}); "
                    f"log {log_path}:\n{server.log_tail()}"
                )
            time.sleep(0.2)
        server.startup_s = time.monotonic() - started
        up = True
        yield server
    finally:
        _stop(proc)
        # A failed start keeps its temp dir, so the log path in the error stays valid.
        if keep_dir or up:
            shutil.rmtree(work, ignore_errors=True)


def kserve_server(
    peers_dir: PathLike | None = None,
    timeout: float | None = None,
    ports: tuple[int, int] | None = None,
):
    """Context manager: a KServe ModelServer with simple, simple_identity, identity_fp32
    (``ports``: HTTP and gRPC, else free ones)."""
    return _peer("kserve", "kserve", _script("kserve_server.py"), peers_dir, timeout, ports=ports)


def mlserver_server(
    peers_dir: PathLike | None = None,
    timeout: float | None = None,
    ports: tuple[int, int] | None = None,
):
    """Context manager: an MLServer with simple, simple_identity, identity_fp32."""
    script = _script("mlserver_server.py")
    return _peer("mlserver", "mlserver", script, peers_dir, timeout, ports=ports)


def triton_server(
    peers_dir: PathLike | None = None,
    timeout: float | None = None,
    ports: tuple[int, int] | None = None,
):
    """Context manager: a Triton Inference Server (2.51, python backend) serving triton_models/:
    the builtin reference models simple, simple_string, simple_identity, identity_fp32,
    classifier and the decoupled llm, and the toy LLM ensemble with TensorRT-LLM's tensors."""
    return _peer(
        "triton",
        "triton",
        _triton_command,
        peers_dir,
        timeout,
        ready_file=READY_FILES["triton"],
        die_with_parent=True,
        ports=ports,
    )


@contextlib.contextmanager
def mindie_sim(timeout: float = 30.0) -> Iterator[tuple[int, int]]:
    """The MindIE stand-in (mindie_sim.py, run by this Python: it needs only aiohttp), on a free
    port until the block ends: yields (port, pid). MindIE itself needs Ascend hardware."""
    (port,) = _free_ports(1)
    log = Path(tempfile.mkstemp(prefix="mindie-sim-", suffix=".log")[1])
    script = str(Path(__file__).resolve().parent / "mindie_sim.py")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, script, "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while _http_status(f"http://127.0.0.1:{port}/health") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise PeerStartError(f"the MindIE simulator did not start:\n{_tail(log, 40)}")
            time.sleep(0.05)
        yield port, proc.pid
    finally:
        _stop(proc)
        log.unlink(missing_ok=True)


SERVERS = {"kserve": kserve_server, "mlserver": mlserver_server, "triton": triton_server}


def _main(argv: list[str]) -> int:
    """``launch.py NAME [--http-port P --grpc-port G]``: one peer in the foreground (``make
    backend-NAME`` runs it on 8000/8001) until Ctrl-C."""
    import argparse

    ap = argparse.ArgumentParser(prog="launch.py", description=_main.__doc__)
    ap.add_argument("name", choices=sorted(SERVERS))
    ap.add_argument("--http-port", type=int, default=0, help="default: a free port")
    ap.add_argument("--grpc-port", type=int, default=0, help="default: a free port")
    args = ap.parse_args(argv)
    free = iter(_free_ports(2))
    ports = (args.http_port or next(free), args.grpc_port or next(free))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stops the peer as Ctrl-C does
    try:
        server = SERVERS[args.name](peers_dir(), ports=ports)
        peer = server.__enter__()
    except (PeerUnavailable, PeerStartError) as exc:
        print(f"launch.py: {exc}", file=sys.stderr)
        return 1
    try:
        print(
            f"{peer.name} ready on http://{peer.http_url} and grpc://{peer.grpc_url}"
            f" (pid {peer.pid}, {peer.startup_s:.1f} s; log {peer.log_path}); Ctrl-C stops it",
            flush=True,
        )
        while peer.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
