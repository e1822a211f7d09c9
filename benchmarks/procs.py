"""Processes of the benchmark: installing the load tools, starting servers, stopping them.

Every server is started in its own session (process group) and stopped by signalling that
group: SIGTERM, then SIGKILL after a grace period. On Linux the harness also asks the kernel to
SIGTERM each direct child if the harness itself dies (``PR_SET_PDEATHSIG``), so a SIGKILLed run
leaves nothing behind. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

HOST = "127.0.0.1"
DEBIAN_PACKAGES = ("nginx-light", "wrk", "nghttp2-client")
TOOLS = {"nginx": "nginx-light", "wrk": "wrk", "h2load": "nghttp2-client"}
STOP_GRACE_S = 5.0

# Loopback probes never go through an http(s)_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def tool_path(name: str) -> str | None:
    """The tool on PATH or in the sbin folders a non-root PATH may lack (nginx)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/sbin", "/sbin", "/usr/local/sbin"):
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def ensure_tools(log: Callable[[str], None]) -> dict[str, str]:
    """Paths of nginx, wrk and h2load, installing their Debian packages when absent.

    ``apt-get update`` runs only when the first install attempt fails (stale lists). Raises
    RuntimeError with what to do when the packages cannot be installed (not root, no apt)."""
    missing = [pkg for tool, pkg in TOOLS.items() if tool_path(tool) is None]
    if missing:
        cmd_text = "apt-get install -y --no-install-recommends " + " ".join(missing)
        prefix: list[str] = []
        if os.geteuid() != 0:
            if shutil.which("sudo") and _run_quiet(["sudo", "-n", "true"]) == 0:
                prefix = ["sudo", "-n"]
            else:
                raise RuntimeError(
                    f"missing {', '.join(missing)} and not running as root: run"
                    f" `sudo {cmd_text}` once, then run the benchmark again"
                )
        if shutil.which("apt-get") is None:
            raise RuntimeError(f"missing {', '.join(missing)} and no apt-get: install them")
        log(f"installing Debian packages: {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", *missing]
        if _run_quiet(install, env) != 0:
            log("apt-get install failed; running apt-get update and retrying")
            _run_quiet([*prefix, "apt-get", "update"], env)
            if _run_quiet(install, env, show_failure=True) != 0:
                raise RuntimeError(f"`{cmd_text}` failed")
    paths = {}
    for tool, package in TOOLS.items():
        path = tool_path(tool)
        if path is None:
            raise RuntimeError(f"{tool} still not found after installing {package}")
        paths[tool] = path
    return paths


def _run_quiet(
    cmd: Sequence[str], env: dict[str, str] | None = None, show_failure: bool = False
) -> int:
    proc = subprocess.run(
        list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False
    )
    if proc.returncode != 0 and show_failure:
        sys.stderr.write(proc.stdout.decode(errors="replace")[-4000:])
    return proc.returncode


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (all held while picking)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """Status of a GET, or None when nothing answers (or something that is not HTTP/1.x does:
    another process's gRPC server that took the port first)."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return None


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group led by ``proc`` (started in a new session), SIGKILL it after
    ``grace`` seconds if anything of it is still alive."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(pgid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


@dataclass
class Server:
    """A started server process; ``ready_urls`` must all answer 200 before it is used."""

    name: str
    cmd: list[str]
    log_path: Path
    ready_urls: list[str] = field(default_factory=list)
    ready_ports: list[int] = field(default_factory=list)
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    error: str | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl, no locks taken
            )

    def wait_ready(self, timeout: float) -> bool:
        """Poll until every ready URL answers 200 and every ready port accepts; on failure
        ``error`` says why (with the log's tail) and False is returned."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        pending_urls = list(self.ready_urls)
        pending_ports = list(self.ready_ports)
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self.error = f"{self.name} exited with rc={rc} during start-up: {self.log_tail()}"
                return False
            pending_urls = [u for u in pending_urls if http_status(u) != 200]
            pending_ports = [p for p in pending_ports if not port_open(p)]
            if not pending_urls and not pending_ports:
                return True
            if time.monotonic() > deadline:
                what = ", ".join([*pending_urls, *(f"port {p}" for p in pending_ports)])
                self.error = (
                    f"{self.name} not ready after {timeout:.0f}s ({what}): {self.log_tail()}"
                )
                return False
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_bytes()[-8192:].decode("utf-8", "replace")
        except OSError as exc:
            return f"<no log: {exc}>"
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(tail) if tail else "<empty log>"


def run_tool(
    cmd: Sequence[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run a load generator to completion in its own process group; (rc, stdout, stderr).

    The group is killed if the run times out or the harness is interrupted meanwhile."""
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl, no locks taken
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc, grace=1.0)
        out, err = proc.communicate()
        return 124, out.decode(errors="replace"), err.decode(errors="replace") + "\n<timed out>"
    except BaseException:
        stop_group(proc, grace=1.0)
        raise
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def group_stats(pgid: int) -> Iterator[tuple[str, list[bytes]]]:
    """(pid, the /proc/PID/stat fields after the parenthesised command name: state ppid pgrp
    ... utime(14) stime(15) ...) of every live process in process group ``pgid``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it ended meanwhile
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid:
            yield entry.name, fields


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid`` (from
    /proc/PID/stat; processes that already exited are not counted)."""
    total = sum(int(fields[11]) + int(fields[12]) for _, fields in group_stats(pgid))
    return total / _CLK_TCK


#: the interop tests' launcher of the peer servers (MLServer, KServe), in their own venvs
LAUNCH_PY = Path(__file__).resolve().parent.parent / "tests" / "interop" / "peers" / "launch.py"


def import_peer_launch() -> ModuleType:
    """The interop tests' peer launcher, loaded from its file (benchmarks do not import tests
    as a package)."""
    spec = importlib.util.spec_from_file_location("v2proxy_bench_peer_launch", LAUNCH_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
