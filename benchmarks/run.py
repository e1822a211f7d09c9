"""The v2proxy benchmark: every compared system, started here on loopback, in one run.

    .venv/bin/python benchmarks/run.py [--quick] [--only a,c,...] [--v2proxy-args "--workers 2"]

(``make bench`` / ``make bench QUICK=1``.) Starts the v2proxy reference server (the backend),
MLServer (the JSON-only backend of scenario d), nginx (the anchor: a reverse proxy that does no
work) and v2proxy in each configuration of ``V2PROXY_CONFIGS``; sends every request once with
Python and checks the answer (the correctness gate), then loads each (scenario, system) pair with
wrk (REST) or h2load (gRPC); times h-grpc and h-http (``identity_fp32`` on Triton per tensor
size, one request at a time, tritonclient: sizes.py); runs the codec micro-benchmarks; prints a
table and the targets and writes ``benchmarks/results/latest.json`` and ``latest.md``. See
benchmarks/README.md.

A system that fails to start or to answer correctly is reported as "error: ..." and the run goes
on. Every process started here is stopped again (its process group), also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import bodies as bodies_mod
import cpu_summary
import loadgen
import procs
import shm
import sizes as sizes_mod
from procs import HOST, Server

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS_DIR = HERE / "results"
NGINX_TEMPLATE = HERE / "nginx.conf.tmpl"

# --------------------------------------------------------------------------- what is compared

#: v2proxy configurations: name -> `v2proxy serve` arguments. Placeholders: {reference_http},
#: {reference_grpc} (the reference server's ports as host:port), {mlserver_http}, {triton_http},
#: {triton_grpc}.
#: Every one also gets V2PROXY_COMMON, its own --http-port/--grpc-port, and --v2proxy-args from
#: the command line.
V2PROXY_CONFIGS: dict[str, list[str]] = {
    "v2proxy-json": ["--backend", "http://{reference_http}", "--backend-encoding", "json"],
    "v2proxy-binary": ["--backend", "http://{reference_http}", "--backend-encoding", "binary"],
    "v2proxy-grpc": ["--backend", "grpc://{reference_grpc}"],
    "v2proxy-mlserver": ["--backend", "http://{mlserver_http}", "--backend-encoding", "auto"],
    # (g) only: shared memory needs no backend hop (--restricted-api none: nothing in the way)
    "v2proxy-builtin": [
        "--backend",
        "builtin",
        "--restricted-api",
        "model-repository,logging,trace",
    ],
    # (g) in front of the JSON-only MLServer (client shared memory read and written by v2proxy)
    "v2proxy-mlserver-shm": [
        "--backend",
        "http://{mlserver_http}",
        "--backend-encoding",
        "auto",
        "--restricted-api",
        "model-repository,logging,trace",
    ],
    # (g) in front of Triton, binary tensors to it, without and with backend staging (v2proxy's
    # own POSIX regions registered with Triton for inputs and outputs of 64 KiB and more)
    "v2proxy-triton-shm-off": [
        "--backend",
        "http://{triton_http}",
        "--backend-encoding",
        "binary",
        "--backend-shm",
        "off",
        "--restricted-api",
        "model-repository,logging,trace",
    ],
    "v2proxy-triton-shm-auto": [
        "--backend",
        "http://{triton_http}",
        "--backend-encoding",
        "binary",
        "--backend-shm",
        "auto",
        "--restricted-api",
        "model-repository,logging,trace",
    ],
    # in front of Triton (a-triton, b-triton, c-triton)
    "v2proxy-triton-json": ["--backend", "http://{triton_http}", "--backend-encoding", "json"],
    "v2proxy-triton-binary": ["--backend", "http://{triton_http}", "--backend-encoding", "binary"],
    # d-triton: large JSON bodies go to Triton as binary tensors, the client answered in JSON
    "v2proxy-triton-auto": ["--backend", "http://{triton_http}", "--backend-encoding", "auto"],
    # h-grpc: gRPC client -> v2proxy -> Triton's gRPC port (h-http uses v2proxy-triton-binary)
    "v2proxy-triton-grpc": ["--backend", "grpc://{triton_grpc}"],
    # metrics-triton: the same relay with metrics on (the default, said) and off, two processes
    # started alike and used by this scenario only
    "v2proxy-triton-json-metrics": [
        "--backend",
        "http://{triton_http}",
        "--backend-encoding",
        "json",
        "--metrics",
        "on",
    ],
    "v2proxy-triton-json-nometrics": [
        "--backend",
        "http://{triton_http}",
        "--backend-encoding",
        "json",
        "--metrics",
        "off",
    ],
}
#: which backend endpoint a placeholder of V2PROXY_CONFIGS stands for
BACKEND_OF_PLACEHOLDER = {
    "reference_http": "direct",
    "reference_grpc": "direct",
    "mlserver_http": "direct-mlserver",
    "triton_http": "direct-triton",
    "triton_grpc": "direct-triton",
}
#: the floors of a Python proxy, each started in front of the reference server (key) and Triton
#: (key-triton): bytes relayed with no HTTP work (pyrelay.py), and the least an HTTP-aware relay
#: on uvloop + httptools does (floorrelay.py), and that relay with every duty of v2proxy's small
#: relayed /infer done the least way (floorpath.py: the least version of v2proxy's path)
RELAYS = {"py-relay": "pyrelay.py", "floor-relay": "floorrelay.py", "floor-path": "floorpath.py"}
V2PROXY_COMMON = ["--host", HOST, "--event-loop", "uvloop", "--log-level", "warning"]
REFERENCE_COMMON = ["--host", HOST, "--event-loop", "uvloop", "--log-level", "warning"]

#: the fixed concurrency (--concurrency): requests in flight. wrk keeps that many connections
#: open; h2load opens concurrency / GRPC_STREAMS connections with GRPC_STREAMS streams each.
#: Scenarios and targets name it FIXED; the other level measured is 1.
DEFAULT_CONCURRENCY = 16
FIXED = 0
GRPC_STREAMS = 4
WRK_THREADS = 1


@dataclass
class Scenario:
    id: str
    title: str
    body: str
    #: (label in the table, endpoint key)
    systems: list[tuple[str, str]]
    concurrency: tuple[int, ...]
    protocol: str = "http"
    big: bool = False
    #: scenario whose nginx and direct rows are this one's anchors (default: itself)
    anchor: str | None = None
    #: measured in the same rounds as this scenario (its systems take turns with ours)
    rounds_with: str | None = None
    #: measured in ``Durations.many_rounds`` rounds instead of ``rounds`` (a small difference
    #: between two systems on a noisy machine)
    many_rounds: bool = False
    #: at least this many rounds, quick runs included (a summary given as medians of rounds)
    min_rounds: int = 0


SMALL = (FIXED, 1)
SCENARIOS = [
    Scenario(
        "a",
        "small JSON -> JSON",
        "simple_json",
        [
            ("direct", "direct"),
            ("nginx", "nginx"),
            ("py-relay", "py-relay"),
            ("floor-relay", "floor-relay"),
            ("floor-path", "floor-path"),
            ("v2proxy-json", "v2proxy-json"),
        ],
        SMALL,
    ),
    Scenario(
        "b",
        "small JSON client -> binary backend",
        "simple_json",
        [("v2proxy-binary", "v2proxy-binary")],
        SMALL,
        anchor="a",
    ),
    Scenario(
        "c",
        "small binary -> binary",
        "simple_binary",
        [("direct", "direct"), ("nginx", "nginx"), ("v2proxy-binary", "v2proxy-binary")],
        SMALL,
    ),
    Scenario(
        "d-mlserver",
        "1M FP32 JSON -> JSON-only backend (MLServer)",
        "fp32_1m_json",
        [
            ("direct", "direct-mlserver"),
            ("nginx", "nginx-mlserver"),
            ("v2proxy-mlserver", "v2proxy-mlserver"),
        ],
        (1,),
        big=True,
    ),
    Scenario(
        "d-binary",
        "1M FP32 JSON client -> binary backend",
        "fp32_1m_json",
        [("direct", "direct"), ("nginx", "nginx"), ("v2proxy-binary", "v2proxy-binary")],
        (1,),
        big=True,
    ),
    Scenario(
        "e",
        "64 MiB FP32 binary pass-through",
        "fp32_64mib_binary",
        [("direct", "direct"), ("nginx", "nginx"), ("v2proxy-binary", "v2proxy-binary")],
        (1,),
        big=True,
    ),
    Scenario(
        "f-grpc",
        "gRPC client -> REST binary backend",
        "simple_grpc",
        [("direct", "direct"), ("nginx", "nginx"), ("v2proxy-binary", "v2proxy-binary")],
        SMALL,
        protocol="grpc",
    ),
    Scenario(
        "f-rest",
        "REST JSON client -> gRPC backend",
        "simple_json",
        [("v2proxy-grpc", "v2proxy-grpc")],
        SMALL,
        anchor="a",
    ),
    # in front of a real Triton (2.51, python backend, the interop peers' `simple`): CPU per
    # request of each proxy (cpu_summary.py); a-triton's summary is the medians of at least 3
    # rounds, quick runs included
    Scenario(
        "a-triton",
        "Triton: small JSON relayed (JSON -> JSON)",
        "simple_json",
        [
            ("direct", "direct-triton"),
            ("nginx", "nginx-triton"),
            ("py-relay", "py-relay-triton"),
            ("floor-relay", "floor-relay-triton"),
            ("floor-path", "floor-path-triton"),
            ("v2proxy-json", "v2proxy-triton-json"),
        ],
        SMALL,
        min_rounds=3,
    ),
    Scenario(
        "b-triton",
        "Triton: small JSON client -> binary backend",
        "simple_json",
        [("v2proxy-binary", "v2proxy-triton-binary")],
        SMALL,
        anchor="a-triton",
        rounds_with="a-triton",
    ),
    Scenario(
        "c-triton",
        "Triton: small binary pass-through",
        "simple_binary",
        [
            ("direct", "direct-triton"),
            ("nginx", "nginx-triton"),
            ("py-relay", "py-relay-triton"),
            ("floor-relay", "floor-relay-triton"),
            ("v2proxy-binary", "v2proxy-triton-binary"),
        ],
        SMALL,
    ),
    Scenario(
        "d-triton",
        "Triton: 1M FP32 JSON (v2proxy auto: binary tensors to Triton)",
        "fp32_1m_json",
        [
            ("direct", "direct-triton"),
            ("nginx", "nginx-triton"),
            ("v2proxy-auto", "v2proxy-triton-auto"),
            ("v2proxy-json", "v2proxy-triton-json"),
        ],
        (1,),
        big=True,
    ),
    # the cost of --metrics on: the same v2proxy in front of Triton with metrics on and off,
    # taking turns in many rounds (the difference is a few percent; the machine is noisy)
    Scenario(
        "metrics-triton",
        "Triton: small JSON relayed, --metrics on vs off",
        "simple_json",
        [
            ("v2proxy-metrics-on", "v2proxy-triton-json-metrics"),
            ("v2proxy-metrics-off", "v2proxy-triton-json-nometrics"),
        ],
        (FIXED,),
        many_rounds=True,
    ),
]
TRITON_SCENARIOS = ("a-triton", "b-triton", "c-triton", "d-triton", "metrics-triton")


@dataclass
class SizeScenario:
    """A latency-per-size scenario (sizes.py): ``identity_fp32`` on Triton, FP32[n] for each n of
    ``sizes.SIZES``, one request at a time on one connection, through each system."""

    id: str
    title: str
    protocol: str  # "grpc" (tritonclient gRPC) or "http" (tritonclient HTTP, binary both ways)
    #: (label in the table, endpoint key)
    systems: list[tuple[str, str]]


SIZE_SCENARIOS = [
    SizeScenario(
        "h-grpc",
        "Triton identity_fp32 per size, gRPC (tritonclient), one connection",
        "grpc",
        [
            ("direct", "direct-triton"),
            ("nginx", "nginx-triton"),
            ("v2proxy", "v2proxy-triton-grpc"),
        ],
    ),
    SizeScenario(
        "h-http",
        "Triton identity_fp32 per size, HTTP binary tensors both ways (tritonclient), one"
        " connection",
        "http",
        [
            ("direct", "direct-triton"),
            ("nginx", "nginx-triton"),
            ("v2proxy", "v2proxy-triton-binary"),
        ],
    ),
]


@dataclass
class Target:
    id: str
    text: str
    #: ("rps"|"p50"|"mean"|"cpu", (scenario, label, conc), (scenario, label, conc)) or
    #: ("micro", name) or ("shm", label) or ("sizes", scenario): the largest v2proxy / nginx
    #: median latency over the sizes; "cpu" is the proxy's CPU microseconds per request
    metric: tuple[Any, ...]
    op: str  # ">=" or "<="
    threshold: float


TARGETS = [
    Target(
        "a-throughput",
        "(a) small JSON->JSON: throughput at c={c} >= 0.8 x nginx",
        ("rps", ("a", "v2proxy-json", FIXED), ("a", "nginx", FIXED)),
        ">=",
        0.8,
    ),
    Target(
        "a-latency",
        "(a) small JSON->JSON: p50 at c=1 <= 1.25 x nginx",
        ("p50", ("a", "v2proxy-json", 1), ("a", "nginx", 1)),
        "<=",
        1.25,
    ),
    Target(
        "b-throughput",
        "(b) small JSON client -> binary backend: throughput at c={c} >= 0.7 x nginx JSON (a)",
        ("rps", ("b", "v2proxy-binary", FIXED), ("a", "nginx", FIXED)),
        ">=",
        0.7,
    ),
    Target(
        "c-throughput",
        "(c) small binary pass-through: throughput at c={c} >= 0.8 x nginx",
        ("rps", ("c", "v2proxy-binary", FIXED), ("c", "nginx", FIXED)),
        ">=",
        0.8,
    ),
    Target(
        "e-throughput",
        "(e) 64 MiB binary pass-through: throughput at c=1 >= 0.8 x nginx",
        ("rps", ("e", "v2proxy-binary", 1), ("e", "nginx", 1)),
        ">=",
        0.8,
    ),
    Target(
        "d-time",
        "(d) 1M FP32 JSON to MLServer: mean time per request <= 1.1 x direct",
        ("mean", ("d-mlserver", "v2proxy-mlserver", 1), ("d-mlserver", "direct", 1)),
        "<=",
        1.1,
    ),
    Target(
        "f-throughput",
        "(f) gRPC client -> REST binary backend: throughput at c={c} >= 0.7 x nginx grpc_pass",
        ("rps", ("f-grpc", "v2proxy-binary", FIXED), ("f-grpc", "nginx", FIXED)),
        ">=",
        0.7,
    ),
    Target(
        "a-triton-cpu",
        "(a, Triton) small JSON relayed: proxy CPU per request at c={c} <= 2 x nginx",
        ("cpu", ("a-triton", "v2proxy-json", FIXED), ("a-triton", "nginx", FIXED)),
        "<=",
        2.0,
    ),
    Target(
        "a-triton-throughput",
        "(a, Triton) small JSON relayed: throughput at c={c} >= 0.9 x nginx",
        ("rps", ("a-triton", "v2proxy-json", FIXED), ("a-triton", "nginx", FIXED)),
        ">=",
        0.9,
    ),
    Target(
        "a-triton-latency",
        "(a, Triton) small JSON relayed: p50 at c=1 <= 1.3 x nginx",
        ("p50", ("a-triton", "v2proxy-json", 1), ("a-triton", "nginx", 1)),
        "<=",
        1.3,
    ),
    Target(
        "d-triton-time",
        "(d, Triton) 1M FP32 JSON: through v2proxy auto >= 2.5 x faster than straight to Triton",
        ("mean", ("d-triton", "direct", 1), ("d-triton", "v2proxy-auto", 1)),
        ">=",
        2.5,
    ),
    Target(
        "metrics-cost",
        "metrics cost: proxy CPU per small request at c={c}, --metrics on <= 1.05 x off",
        (
            "cpu",
            ("metrics-triton", "v2proxy-metrics-on", FIXED),
            ("metrics-triton", "v2proxy-metrics-off", FIXED),
        ),
        "<=",
        1.05,
    ),
    Target(
        "h-grpc-latency",
        "(h) gRPC identity_fp32 on Triton: median latency at one connection <= 1.5 x nginx"
        " grpc_pass, every size (1K-16M elements)",
        ("sizes", "h-grpc"),
        "<=",
        1.5,
    ),
    Target(
        "h-http-latency",
        "(h) HTTP binary identity_fp32 on Triton: median latency at one connection <= 1.3 x"
        " nginx, every size (1K-16M elements)",
        ("sizes", "h-http"),
        "<=",
        1.3,
    ),
    Target(
        "codec-decode",
        "codec: JSON decode of 1M FP32 >= 2 x faster than orjson.loads + numpy.array",
        ("micro", "JSON decode 1M FP32"),
        ">=",
        2.0,
    ),
    Target(
        "codec-encode",
        "codec: JSON encode of 1M FP32 no slower than orjson.dumps of the array",
        ("micro", "JSON encode 1M FP32"),
        ">=",
        1.0,
    ),
    Target(
        "g-shm",
        "(g) 64 MiB through shared memory >= 5 x faster than the binary HTTP body",
        ("shm", "builtin"),
        ">=",
        5.0,
    ),
    Target(
        "g-shm-triton-off",
        "(g, Triton) 64 MiB through shared memory >= 5 x faster than the binary HTTP body,"
        " --backend-shm off",
        ("shm", "triton-shm-off"),
        ">=",
        5.0,
    ),
    Target(
        "g-shm-triton-auto",
        "(g, Triton) 64 MiB through shared memory >= 5 x faster than the binary HTTP body,"
        " --backend-shm auto (staging)",
        ("shm", "triton-shm-auto"),
        ">=",
        5.0,
    ),
]
#: (g): (label, V2PROXY_CONFIGS key, what the backend is), measured in this order; the MLServer
#: ratio is reported without a target (its JSON hop dominates both ways)
SHM_SYSTEMS = [
    ("builtin", "v2proxy-builtin", "builtin models (v2proxy is the server)"),
    ("mlserver", "v2proxy-mlserver-shm", "MLServer, JSON to it (no shared memory)"),
    ("triton-shm-off", "v2proxy-triton-shm-off", "Triton, binary tensors, --backend-shm off"),
    ("triton-shm-auto", "v2proxy-triton-shm-auto", "Triton, binary tensors, staged (auto)"),
]


@dataclass
class Durations:
    """``small`` and ``big`` are the seconds of one round; every (system, concurrency) of a
    scenario is measured ``rounds`` times, the systems taking turns (see Runner.run)."""

    small: float
    big: float
    warmup: float
    micro_quick: bool
    shm: float
    #: (g): at least this many timed requests each way (MLServer takes ~11 s per request)
    shm_min_runs: int
    rounds: int
    #: rounds of a scenario with ``many_rounds``
    many_rounds: int


FULL = Durations(
    small=2.0,
    big=2.0,
    warmup=1.0,
    micro_quick=False,
    shm=5.0,
    shm_min_runs=3,
    rounds=5,
    many_rounds=15,
)
QUICK = Durations(
    small=1.0,
    big=2.0,
    warmup=1.0,
    micro_quick=True,
    shm=2.0,
    shm_min_runs=1,
    rounds=2,
    many_rounds=4,
)

# --------------------------------------------------------------------------- systems


@dataclass
class Endpoint:
    """Where one compared system listens; ``error`` says why it cannot be measured."""

    key: str
    http_port: int | None = None
    grpc_port: int | None = None
    server: Server | None = None
    cmd: list[str] = field(default_factory=list)
    error: str | None = None
    #: process groups whose CPU time is reported per run (None: not part of this system)
    proxy_pgid: int | None = None
    backend_pgid: int | None = None

    def usable(self) -> str | None:
        if self.error:
            return self.error
        if self.server is not None and not self.server.alive():
            return f"{self.key} is no longer running: {self.server.log_tail()}"
        return None


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _python_server(
    name: str, args: list[str], workdir: Path, http_port: int, grpc_port: int
) -> Server:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return Server(
        name=name,
        cmd=[sys.executable, "-m", "v2proxy", *args],
        log_path=workdir / f"{name}.log",
        ready_urls=[f"http://{HOST}:{http_port}/v2/health/ready"],
        ready_ports=[grpc_port],
        env=env,
    )


def _start(server: Server, stack: contextlib.ExitStack) -> None:
    stack.callback(server.stop)
    server.start()


class Systems:
    """Starts and holds every compared system; stopped by the ExitStack it is given."""

    def __init__(self, workdir: Path, stack: contextlib.ExitStack, args: argparse.Namespace):
        self.workdir = workdir
        self.stack = stack
        self.args = args
        self.endpoints: dict[str, Endpoint] = {}
        self.tools: dict[str, str] = {}

    def start_all(
        self, tools: dict[str, str], need_mlserver: bool, need_triton: bool, timeout: float
    ) -> None:
        self.tools = tools
        ref_http, ref_grpc = procs.free_ports(2)
        ref = _python_server(
            "reference-server",
            [
                "reference-server",
                *REFERENCE_COMMON,
                "--http-port",
                str(ref_http),
                "--grpc-port",
                str(ref_grpc),
                *shlex.split(self.args.reference_args),
            ],
            self.workdir,
            ref_http,
            ref_grpc,
        )
        ref.ready_urls.append(f"http://{HOST}:{ref_http}/v2/models/simple/ready")
        direct = Endpoint("direct", ref_http, ref_grpc, ref, ref.cmd)
        self.endpoints["direct"] = direct
        _start(ref, self.stack)
        direct.backend_pgid = ref.proc.pid if ref.proc else None
        if not ref.wait_ready(timeout):
            direct.error = f"error: reference server did not start: {ref.error}"
            log(direct.error)

        # MLServer and Triton: their own venvs, started by the interop tests' launcher
        mls = self._start_peer("direct-mlserver", "mlserver", need_mlserver, "mlserver_server.py")
        triton = self._start_peer("direct-triton", "triton", need_triton, "triton_models/")

        values = {
            "reference_http": f"{HOST}:{ref_http}",
            "reference_grpc": f"{HOST}:{ref_grpc}",
            "mlserver_http": f"{HOST}:{mls.http_port}",
            "triton_http": f"{HOST}:{triton.http_port}",
            "triton_grpc": f"{HOST}:{triton.grpc_port}",
        }
        proxies: list[tuple[Endpoint, Server]] = []
        for name, template in V2PROXY_CONFIGS.items():
            ep = Endpoint(name)
            self.endpoints[name] = ep
            joined = " ".join(template)
            backend = next(
                (
                    self.endpoints[b]
                    for p, b in BACKEND_OF_PLACEHOLDER.items()
                    if "{" + p + "}" in joined
                ),
                None,
            )
            if backend is not None and backend.error:
                ep.error = f"error: needs {backend.key}: {_bare(backend.error)}"
                continue
            http_port, grpc_port = procs.free_ports(2)
            args = [
                "serve",
                *(a.format(**values) for a in template),
                *V2PROXY_COMMON,
                "--http-port",
                str(http_port),
                "--grpc-port",
                str(grpc_port),
                *shlex.split(self.args.v2proxy_args),
            ]
            server = _python_server(name, args, self.workdir, http_port, grpc_port)
            ep.http_port, ep.grpc_port, ep.server, ep.cmd = http_port, grpc_port, server, server.cmd
            _start(server, self.stack)
            ep.proxy_pgid = server.proc.pid if server.proc else None
            ep.backend_pgid = backend.backend_pgid if backend is not None else None
            proxies.append((ep, server))

        self._start_nginx(direct, mls, triton, timeout)
        for kind, script in RELAYS.items():
            self._start_relay(kind, script, direct, timeout)
            self._start_relay(f"{kind}-triton", script, triton, timeout)

        for ep, server in proxies:
            if not server.wait_ready(timeout):
                ep.error = loadgen.one_line(f"error: did not start: {server.error}", 400)
                log(f"{ep.key}: {ep.error}")

    def _start_peer(self, key: str, name: str, needed: bool, what: str) -> Endpoint:
        """A peer server of tests/interop/peers (``launch.<name>_server``), or an Endpoint
        whose error says why there is none."""
        ep = Endpoint(key)
        self.endpoints[key] = ep
        if not needed:
            ep.error = "not measured in this run"
            return ep
        try:
            launch = procs.import_peer_launch()
            start = getattr(launch, f"{name}_server")
            peer = self.stack.enter_context(start(launch.peers_dir()))
        except Exception as exc:
            ep.error = loadgen.one_line(
                f"error: {name} not available ({type(exc).__name__}): {exc}", 400
            )
            log(ep.error + " (run `make peers`)")
            return ep
        ep.http_port, ep.grpc_port = peer.http_port, peer.grpc_port
        ep.backend_pgid = peer.pid  # started in its own session: its group is its processes
        ep.cmd = [f"{name} (tests/interop/peers/launch.py, {what})", peer.base_url]
        log(f"{name} ready on {peer.http_url} in {peer.startup_s:.1f}s")
        return ep

    def _start_nginx(
        self, direct: Endpoint, mls: Endpoint, triton: Endpoint, timeout: float
    ) -> None:
        ngx_dir = self.workdir / "nginx"
        ngx_dir.mkdir()
        # workers run as "nobody" when the master is root: let them into the folder
        for d in (self.workdir, ngx_dir):
            d.chmod(0o755)
        http_port, grpc_port, mls_port, triton_port, triton_grpc_port, dead_port = procs.free_ports(
            6
        )
        conf = NGINX_TEMPLATE.read_text()
        for key, value in {
            "DIR": str(ngx_dir),
            "WORKERS": str(self.args.nginx_workers),
            "REFERENCE_HTTP": str(direct.http_port or dead_port),
            "REFERENCE_GRPC": str(direct.grpc_port or dead_port),
            "MLSERVER_HTTP": str(mls.http_port or dead_port),
            "TRITON_HTTP": str(triton.http_port or dead_port),
            "TRITON_GRPC": str(triton.grpc_port or dead_port),
            "NGINX_REFERENCE_HTTP": str(http_port),
            "NGINX_REFERENCE_GRPC": str(grpc_port),
            "NGINX_MLSERVER_HTTP": str(mls_port),
            "NGINX_TRITON_HTTP": str(triton_port),
            "NGINX_TRITON_GRPC": str(triton_grpc_port),
        }.items():
            conf = conf.replace(f"@@{key}@@", value)
        conf_path = ngx_dir / "nginx.conf"
        conf_path.write_text(conf)
        cmd = [
            self.tools["nginx"],
            "-e",
            str(ngx_dir / "error.log"),
            "-p",
            str(ngx_dir),
            "-c",
            str(conf_path),
        ]
        ready = [http_port, grpc_port, triton_grpc_port]
        server = Server("nginx", cmd, ngx_dir / "stdout.log", ready_ports=ready)
        if not direct.error:
            server.ready_urls.append(f"http://{HOST}:{http_port}/v2/health/ready")
        nginx = Endpoint("nginx", http_port, grpc_port, server, cmd)
        nginx_mls = Endpoint("nginx-mlserver", mls_port, None, server, cmd)
        nginx_triton = Endpoint("nginx-triton", triton_port, triton_grpc_port, server, cmd)
        self.endpoints["nginx"] = nginx
        self.endpoints["nginx-mlserver"] = nginx_mls
        self.endpoints["nginx-triton"] = nginx_triton
        _start(server, self.stack)
        # the master and its worker(s): one process group
        pgid = server.proc.pid if server.proc else None
        nginx.proxy_pgid = nginx_mls.proxy_pgid = nginx_triton.proxy_pgid = pgid
        nginx.backend_pgid, nginx_mls.backend_pgid = direct.backend_pgid, mls.backend_pgid
        nginx_triton.backend_pgid = triton.backend_pgid
        if not server.wait_ready(timeout):
            err = (ngx_dir / "error.log").read_text(errors="replace")[-400:] if ngx_dir else ""
            nginx.error = loadgen.one_line(f"error: nginx did not start: {server.error} {err}", 400)
            log(nginx.error)
        started_error = nginx.error  # each server block is usable when nginx and its backend are
        for ep, backend in ((nginx, direct), (nginx_mls, mls), (nginx_triton, triton)):
            ep.error = started_error or (
                backend.error and f"error: no backend: {_bare(backend.error)}"
            )

    def _start_relay(self, key: str, script: str, backend: Endpoint, timeout: float) -> None:
        """One of the floors of a Python proxy (RELAYS) in front of ``backend``."""
        (port,) = procs.free_ports(1)
        cmd = [sys.executable, str(HERE / script), "--port", str(port)]
        cmd += ["--backend", f"{HOST}:{backend.http_port}"]
        server = Server(key, cmd, self.workdir / f"{key}.log", ready_ports=[port])
        ep = Endpoint(key, port, None, server, cmd)
        self.endpoints[key] = ep
        if backend.error:
            ep.error = f"error: no backend: {_bare(backend.error)}"
            return
        _start(server, self.stack)
        ep.proxy_pgid = server.proc.pid if server.proc else None
        ep.backend_pgid = backend.backend_pgid
        if not server.wait_ready(timeout):
            ep.error = loadgen.one_line(f"error: {key} did not start: {server.error}", 400)
            log(ep.error)


# --------------------------------------------------------------------------- measuring


@dataclass
class Row:
    scenario: str
    title: str
    system: str
    endpoint: str
    protocol: str
    concurrency: int
    measurement: loadgen.Measurement | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.measurement is not None

    def as_dict(self) -> dict[str, Any]:
        m = self.measurement
        return {
            "scenario": self.scenario,
            "title": self.title,
            "system": self.system,
            "endpoint": self.endpoint,
            "protocol": self.protocol,
            "concurrency": self.concurrency,
            "status": "ok" if self.ok else self.error,
            **(m.as_dict() if m else {}),
        }


def grpc_shape(c: int) -> tuple[int, int]:
    """h2load connections x streams per connection for ``c`` requests in flight."""
    streams = min(c, GRPC_STREAMS)
    return max(1, c // streams), streams


def _concurrency_label(sc: Scenario, c: int) -> str:
    if sc.protocol == "grpc" and c > 1:
        clients, streams = grpc_shape(c)
        return f"{clients}x{streams}"
    return str(c)


class Runner:
    def __init__(
        self,
        systems: Systems,
        rest: dict[str, bodies_mod.Body],
        grpc: dict[str, bodies_mod.GrpcBody],
        durations: Durations,
        workdir: Path,
        fixed: int,
    ):
        self.fixed = fixed
        self.systems = systems
        self.rest = rest
        self.grpc = grpc
        self.d = durations
        self.workdir = workdir
        self.rows: list[Row] = []

    def run(self, scenarios: list[Scenario]) -> None:
        """Each scenario on its own, except that one with ``rounds_with`` is measured in the
        rounds of that scenario (when both run)."""
        ids = {sc.id for sc in scenarios}
        groups: dict[str, list[Scenario]] = {}
        for sc in scenarios:
            lead = sc.rounds_with if sc.rounds_with in ids else sc.id
            groups.setdefault(lead or sc.id, []).append(sc)
        for group in groups.values():
            self._scenarios(group)

    def _scenarios(self, group: list[Scenario]) -> None:
        """Every system of the scenarios passes the correctness gate first; then each (system,
        concurrency) is measured in ``rounds`` short runs, the systems taking turns and the
        first of each round rotating, so that a slow spell of the shared machine hits every
        system alike rather than one. Each row reports the medians of its rounds."""
        live: list[tuple[Scenario, str, Endpoint, list[Row]]] = []
        for sc, (label, key) in ((one, system) for one in group for system in one.systems):
            ep = self.systems.endpoints[key]
            rows = [
                Row(sc.id, sc.title, label, key, sc.protocol, self.fixed if c == FIXED else c)
                for c in sc.concurrency
            ]
            self.rows.extend(rows)
            problem = ep.usable()
            if problem is None:
                problem = self._gate(sc, ep)
                if problem is not None:
                    problem = f"error: correctness gate: {loadgen.one_line(problem)}"
            if problem is not None:
                log(f"({sc.id}) {label}: {problem}")
                for r in rows:
                    r.error = problem
                continue
            live.append((sc, label, ep, rows))
        if not live:
            return
        runs: dict[int, list[loadgen.Measurement]] = {
            id(r): [] for _, _, _, rows in live for r in rows
        }
        rounds = max(
            max(self.d.many_rounds if sc.many_rounds else self.d.rounds, sc.min_rounds)
            for sc in group
        )
        for n in range(rounds):
            shift = n % len(live)
            for sc, label, ep, rows in live[shift:] + live[:shift]:
                duration = self.d.big if sc.big else self.d.small
                for i, row in enumerate(rows):
                    if row.error:
                        continue
                    first = n == 0
                    if first and not sc.big and i == 0 and self.d.warmup:
                        self._load(sc, ep, row.concurrency, self.d.warmup, self.d.warmup)
                    m = self._load(sc, ep, row.concurrency, duration, self.d.warmup if first else 0)
                    if m.error:
                        row.error, row.measurement = f"error: {m.error}", m
                    elif (gone := ep.usable()) is not None:
                        row.error = f"error: {loadgen.one_line(gone)}"
                    else:
                        runs[id(row)].append(m)
                    log(
                        f"({sc.id}) {label} c={_concurrency_label(sc, row.concurrency)}"
                        f" round {n + 1}/{rounds}: "
                        + (
                            row.error
                            or f"{m.rps:.1f} req/s, p50 {_ms(m.p50_ms)} ms, p99 {_ms(m.p99_ms)} ms"
                        )
                    )
        for sc, label, _, rows in live:
            for row in rows:
                if row.error or not runs[id(row)]:
                    continue
                row.measurement = m = loadgen.median_of(runs[id(row)])
                log(
                    f"({sc.id}) {label} c={_concurrency_label(sc, row.concurrency)}: median"
                    f" {m.rps:.1f} req/s (rounds {', '.join(f'{v:.0f}' for v in m.round_rps)}),"
                    f" p50 {_ms(m.p50_ms)} ms"
                )

    def _gate(self, sc: Scenario, ep: Endpoint) -> str | None:
        if sc.protocol == "grpc":
            if ep.grpc_port is None:
                return "no gRPC port"
            return bodies_mod.gate_grpc(
                ep.grpc_port, self.grpc[sc.body], self.systems.tools.get("nghttp")
            )
        assert ep.http_port is not None
        return bodies_mod.gate_rest(ep.http_port, self.rest[sc.body])

    def _load(
        self, sc: Scenario, ep: Endpoint, c: int, duration: float, warmup: float
    ) -> loadgen.Measurement:
        """One load run, with the CPU used meanwhile by the load generator, the proxy and the
        backend (percent of one core over the run's wall time)."""
        groups = {"proxy": ep.proxy_pgid, "backend": ep.backend_pgid}
        before = {k: procs.group_cpu_seconds(g) for k, g in groups.items() if g}
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        m = self._load_tool(sc, ep, c, duration, warmup)
        wall = time.monotonic() - start
        ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = {"loadgen": (ru2.ru_utime + ru2.ru_stime) - (ru.ru_utime + ru.ru_stime)}
        for k, g in groups.items():
            if g and k in before:
                used[k] = procs.group_cpu_seconds(g) - before[k]
        m.cpu_pct = {k: round(100 * v / wall, 1) for k, v in used.items()}
        # CPU per request: the window is the tool's whole run, the count what it completed
        # (with h2load, the warm-up's requests are not counted: use the rows without one)
        if m.requests and not (sc.protocol == "grpc" and warmup):
            m.cpu_us_per_req = {k: round(1e6 * v / m.requests, 1) for k, v in used.items()}
        return m

    def _load_tool(
        self, sc: Scenario, ep: Endpoint, c: int, duration: float, warmup: float
    ) -> loadgen.Measurement:
        tools = self.systems.tools
        if sc.protocol == "grpc":
            body = self.grpc[sc.body]
            clients, streams = grpc_shape(c)
            assert ep.grpc_port is not None
            return loadgen.h2load(
                tools["h2load"],
                ep.grpc_port,
                bodies_mod.GRPC_INFER_PATH,
                body.path,
                body.headers,
                clients,
                streams,
                duration,
                warmup,
                self.workdir / "h2load.log",
            )
        rest = self.rest[sc.body]
        assert ep.http_port is not None
        return loadgen.wrk(
            tools["wrk"],
            ep.http_port,
            rest.url_path,
            rest.path,
            rest.headers,
            c,
            duration,
            threads=WRK_THREADS,
        )

    def find(self, scenario: str, system: str, conc: int) -> Row | None:
        conc = self.fixed if conc == FIXED else conc
        for r in self.rows:
            if (r.scenario, r.system, r.concurrency) == (scenario, system, conc):
                return r
        return None


def _short(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


# --------------------------------------------------------------------------- targets


def _metric(row: Row | None, kind: str) -> float | None:
    if row is None or not row.ok or row.measurement is None:
        return None
    m = row.measurement
    if kind == "cpu":
        return m.cpu_us_per_req.get("proxy")
    return {"rps": m.rps, "p50": m.p50_ms, "mean": m.mean_ms}[kind]


def evaluate_targets(
    runner: Runner,
    micro: dict[str, Any] | None,
    shm_result: dict[str, dict[str, Any]],
    sizes_result: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    out = []
    mc = metrics_cost(runner)
    for t in TARGETS:
        value: float | None = None
        detail = ""
        kind = t.metric[0]
        if kind in ("rps", "p50", "mean", "cpu"):
            ours, anchor = (runner.find(*k) for k in t.metric[1:])
            a, b = _metric(ours, kind), _metric(anchor, kind)
            if a is not None and b:
                value = a / b
                unit = {"rps": "req/s", "p50": "ms p50", "mean": "ms mean", "cpu": "µs CPU/req"}[
                    kind
                ]
                detail = f"{a:.2f} / {b:.2f} {unit}"
            else:
                broken = [r for r in (ours, anchor) if r is None or not r.ok]
                detail = "; ".join(
                    f"{k[1]} ({k[0]}): {r.error if r else 'not measured'}"
                    for k, r in zip(t.metric[1:], (ours, anchor), strict=True)
                    if r in broken
                )
        elif kind == "micro":
            case = next(
                (c for c in (micro or {}).get("cases", []) if c["name"].startswith(t.metric[1])),
                None,
            )
            if case and case.get("speedup"):
                value = case["speedup"]
                detail = (
                    f"{case['alternative_ms']:.2f} ms alternative / {case['v2proxy_ms']:.2f} ms"
                )
            else:
                detail = (case or {}).get("error") or "micro-benchmark not run"
        elif kind == "shm":
            one = shm_result.get(t.metric[1]) or {"status": "not measured in this run"}
            if one.get("speedup"):
                value = one["speedup"]
                detail = (
                    f"{one['body_mean_ms']:.1f} ms body / {one['shm_mean_ms']:.1f} ms shared memory"
                )
            else:
                detail = one.get("status", "not measured")
        elif kind == "sizes":
            value, detail = size_ratio((sizes_result or {}).get(t.metric[1]))
        if t.id == "metrics-cost" and mc is not None and mc["paired_median"] is not None:
            detail += (
                f" ({100 * mc['cost']:+.1f} %); rounds' on/off {mc['paired_min']:.2f}"
                f"-{mc['paired_max']:.2f}, median {mc['paired_median']:.3f}"
            )
        holds: bool | None = None
        if value is not None:
            holds = value >= t.threshold if t.op == ">=" else value <= t.threshold
        verdict = "HOLDS" if holds else ("DOES NOT HOLD" if holds is False else "NOT MEASURED")
        if kind == "shm" and value is None and "not available" in detail:
            verdict = "NOT AVAILABLE"
        out.append(
            {
                "id": t.id,
                "target": t.text.format(c=runner.fixed),
                "threshold": f"{t.op} {t.threshold}",
                "measured": value,
                "holds": holds,
                "verdict": verdict,
                "detail": detail,
            }
        )
    return out


def size_ratio(result: dict[str, dict[str, Any]] | None) -> tuple[float | None, str]:
    """(the largest v2proxy / nginx median latency over the sizes, the ratio of each size), or
    (None, why not) when a size of either is not measured."""
    if not result:
        return None, "not measured in this run"
    ratios, broken = [], []
    for size, by_system in result.items():
        v, n = by_system.get("v2proxy", {}), by_system.get("nginx", {})
        if v.get("status") == "ok" and n.get("status") == "ok" and n["median_ms"]:
            ratios.append((size, v["median_ms"] / n["median_ms"]))
        else:
            bad = v if v.get("status") != "ok" else n
            who = "v2proxy" if bad is v else "nginx"
            broken.append(f"{size} {who}: {bad.get('status', 'not measured')}")
    if broken:
        return None, "; ".join(broken)
    worst = max(r for _, r in ratios)
    return worst, "v2proxy / nginx median: " + ", ".join(f"{s} {r:.2f}" for s, r in ratios)


SIZE_HEADER = (
    "scenario",
    "size",
    "requests",
    "direct ms",
    "nginx ms",
    "v2proxy ms",
    "v2proxy/nginx",
    "nginx/direct",
    "CPU µs/req nginx",
    "CPU µs/req v2proxy",
    "CPU v2proxy/nginx",
    "Triton µs/req direct/nginx/v2proxy",
)


def size_rows(sizes_result: dict[str, Any]) -> list[list[str]]:
    """One row per (scenario, size): the three medians, the ratios, CPU per request."""
    rows = []
    for sc_id, by_size in sizes_result.items():
        for size, by_system in by_size.items():
            d, n, v = (by_system.get(k, {}) for k in ("direct", "nginx", "v2proxy"))

            def med(one: dict[str, Any]) -> str:
                if one.get("status") != "ok":
                    return _short(one.get("status", "not measured"), 60)
                return f"{one['median_ms']:.2f}"

            def ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> str:
                x, y = a.get(key), b.get(key)
                ok = a.get("status") == b.get("status") == "ok"
                return f"{x / y:.2f}" if ok and x is not None and y else "-"

            def us(one: dict[str, Any], key: str) -> str:
                x = one.get(key)
                return "-" if one.get("status") != "ok" or x is None else f"{x:.0f}"

            elements = next((o["elements"] for o in (d, n, v) if "elements" in o), 0)
            rows.append(
                [
                    sc_id,
                    f"{size} ({_size(4 * elements)})",
                    "/".join(str(o.get("requests", 0)) for o in (d, n, v)),
                    med(d),
                    med(n),
                    med(v),
                    ratio(v, n, "median_ms"),
                    ratio(n, d, "median_ms"),
                    us(n, "proxy_us_per_req"),
                    us(v, "proxy_us_per_req"),
                    ratio(v, n, "proxy_us_per_req"),
                    "/".join(us(o, "backend_us_per_req") for o in (d, n, v)),
                ]
            )
    return rows


def _run_sizes(
    systems: Systems, scenarios: list[SizeScenario], rounds: int, quick: bool
) -> dict[str, Any]:
    """Every SizeScenario: scenario id -> sizes.measure's result."""
    out: dict[str, Any] = {}
    for sc in scenarios:
        targets: list[sizes_mod.Target] = []
        failed: dict[str, str] = {}
        for label, key in sc.systems:
            ep = systems.endpoints[key]
            port = ep.grpc_port if sc.protocol == "grpc" else ep.http_port
            problem = ep.usable() or (None if port else f"error: {key} has no {sc.protocol} port")
            if problem is not None or port is None:
                failed[label] = problem or "error"
                log(f"({sc.id}) {label}: {problem}")
                continue
            targets.append(sizes_mod.Target(label, port, ep.proxy_pgid, ep.backend_pgid))
        result = sizes_mod.measure(sc.protocol, targets, rounds, quick, log, sc.id)
        for size, _ in sizes_mod.SIZES:
            for label, why in failed.items():
                result.setdefault(size, {})[label] = {"status": why, "requests": 0}
        out[sc.id] = result
    return out


def metrics_cost(runner: Runner) -> dict[str, Any] | None:
    """The metrics-triton scenario in detail: v2proxy's CPU µs per request with --metrics on
    and off (medians of the rounds), the cost on / off - 1, and the ratio of each round's pair
    (on and off measured one after the other in the same round) with its spread."""
    on = runner.find("metrics-triton", "v2proxy-metrics-on", FIXED)
    off = runner.find("metrics-triton", "v2proxy-metrics-off", FIXED)
    a, b = _metric(on, "cpu"), _metric(off, "cpu")
    if a is None or not b or on is None or off is None:
        return None
    assert on.measurement is not None and off.measurement is not None
    pairs = [
        x / y
        for x, y in zip(on.measurement.round_proxy_us, off.measurement.round_proxy_us, strict=False)
        if x is not None and y
    ]
    return {
        "on_us": a,
        "off_us": b,
        "cost": a / b - 1,
        "on_rounds_us": on.measurement.round_proxy_us,
        "off_rounds_us": off.measurement.round_proxy_us,
        "paired_ratios": [round(r, 4) for r in pairs],
        "paired_median": statistics.median(pairs) if pairs else None,
        "paired_min": min(pairs) if pairs else None,
        "paired_max": max(pairs) if pairs else None,
    }


def metrics_cost_line(mc: dict[str, Any] | None) -> str:
    if mc is None:
        return ""
    text = (
        f"Metrics cost (metrics-triton, c=16): v2proxy {mc['on_us']:.0f} µs CPU/request with"
        f" --metrics on, {mc['off_us']:.0f} with off: {100 * mc['cost']:+.1f} % (medians of"
        f" {len(mc['on_rounds_us'])} rounds)"
    )
    if mc["paired_median"] is not None:
        text += (
            f"; each round's on/off: median {mc['paired_median']:.3f}, range"
            f" {mc['paired_min']:.3f}-{mc['paired_max']:.3f}"
        )
    return text + "."


# --------------------------------------------------------------------------- reporting

COLUMNS = (
    "scenario",
    "system",
    "conc",
    "req/s",
    "req/s rounds min-max",
    "p50 ms",
    "p99 ms",
    "mean ms",
    "rps/nginx",
    "p50/nginx",
    "rps/direct",
    "CPU% gen/proxy/backend",
    "CPU µs/req proxy/backend",
)


def table_rows(runner: Runner, scenarios: dict[str, Scenario]) -> list[list[str]]:
    lines = []
    for r in runner.rows:
        sc = scenarios[r.scenario]
        anchor_sc = sc.anchor or sc.id
        conc = _concurrency_label(sc, r.concurrency)
        if not r.ok:
            lines.append(
                [r.scenario, r.system, conc, _short(r.error or "error"), *[""] * (len(COLUMNS) - 4)]
            )
            continue
        m = r.measurement
        assert m is not None

        def ratio(system: str, kind: str, r: Row = r, anchor_sc: str = anchor_sc) -> str:
            if system == r.system and anchor_sc == r.scenario:
                return ""
            a, b = _metric(r, kind), _metric(runner.find(anchor_sc, system, r.concurrency), kind)
            return "" if a is None or not b else f"{a / b:.2f}"

        lines.append(
            [
                r.scenario,
                r.system,
                conc,
                f"{m.rps:.1f}",
                f"{min(m.round_rps):.0f}-{max(m.round_rps):.0f}" if m.round_rps else "",
                _ms(m.p50_ms),
                _ms(m.p99_ms),
                _ms(m.mean_ms),
                ratio("nginx", "rps"),
                ratio("nginx", "p50"),
                ratio("direct", "rps"),
                "/".join(
                    f"{m.cpu_pct[k]:.0f}" if k in m.cpu_pct else "-"
                    for k in ("loadgen", "proxy", "backend")
                ),
                "/".join(
                    f"{m.cpu_us_per_req[k]:.0f}" if k in m.cpu_us_per_req else "-"
                    for k in ("proxy", "backend")
                ),
            ]
        )
    return lines


def format_text_table(
    header: tuple[str, ...] | list[str], rows: list[list[str]], align: str = "lll"
) -> str:
    """A plain-text table; ``align`` gives l or r per column (missing ones: r). A cell holding
    an error spills over the empty columns after it instead of widening its own."""
    widths = [len(h) for h in header]
    for row in rows:
        spill = any(c.startswith("error") for c in row)
        for i, cell in enumerate(row):
            if not (spill and cell.startswith("error")):
                widths[i] = max(widths[i], len(cell))

    def fmt(row: list[str] | tuple[str, ...]) -> str:
        cells = []
        for i, cell in enumerate(row):
            left = i < len(align) and align[i] == "l"
            cells.append(cell.ljust(widths[i]) if left else cell.rjust(widths[i]))
        return "  ".join(cells).rstrip()

    out = [fmt(header), fmt(["-" * w for w in widths])]
    out += [fmt(r) for r in rows]
    return "\n".join(out)


def md_table(header: tuple[str, ...] | list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def target_rows(targets: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            t["target"],
            "-" if t["measured"] is None else f"{t['measured']:.2f}",
            t["verdict"],
            _short(t["detail"]),
        ]
        for t in targets
    ]


def micro_rows(micro: dict[str, Any] | None) -> list[list[str]]:
    rows = []
    for c in (micro or {}).get("cases", []):
        rows.append(
            [
                c["name"],
                _ms(c.get("v2proxy_ms")),
                _ms(c.get("alternative_ms")),
                "-" if not c.get("speedup") else f"{c['speedup']:.2f}x",
                c.get("error") or f"{c['v2proxy']} vs {c['alternative']}",
            ]
        )
    return rows


def machine_info(tools: dict[str, str]) -> dict[str, Any]:
    def cmd_out(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return (p.stdout + p.stderr).strip()

    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, IndexError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    commit = cmd_out(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    dirty = cmd_out(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"])
    try:
        from importlib.metadata import version

        v2 = version("v2proxy")
    except Exception:
        v2 = "?"
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": commit,
        "src_uncommitted_changes": len(dirty.splitlines()) if dirty else 0,
        "v2proxy_version": v2,
        "nginx": cmd_out([tools["nginx"], "-v"]) if "nginx" in tools else "",
        "wrk": cmd_out([tools["wrk"], "-v"]).splitlines()[0] if "wrk" in tools else "",
        "h2load": cmd_out([tools["h2load"], "--version"]) if "h2load" in tools else "",
    }


# --------------------------------------------------------------------------- main


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short runs (about 2 minutes in all)")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated scenario ids to run (a,b,c,d-mlserver,d-binary,e,f-grpc,f-rest,"
        "a-triton,b-triton,c-triton,d-triton,metrics-triton,g,h-grpc,h-http,micro); default all",
    )
    p.add_argument(
        "--v2proxy-args",
        default=os.environ.get("V2PROXY_BENCH_ARGS", ""),
        help="extra `v2proxy serve` arguments for every configuration, e.g. '--workers 2'"
        " (default $V2PROXY_BENCH_ARGS)",
    )
    p.add_argument(
        "--reference-args",
        default=os.environ.get("V2PROXY_BENCH_REFERENCE_ARGS", ""),
        help="extra `v2proxy reference-server` arguments (default $V2PROXY_BENCH_REFERENCE_ARGS)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"the fixed concurrency of the small scenarios (default {DEFAULT_CONCURRENCY})",
    )
    p.add_argument("--nginx-workers", type=int, default=1, help="nginx worker_processes (1)")
    p.add_argument("--start-timeout", type=float, default=60.0, help="seconds per server start")
    p.add_argument(
        "--output",
        type=Path,
        default=RESULTS_DIR / "latest.json",
        help="results JSON (the Markdown table goes next to it as .md)",
    )
    return p.parse_args(argv)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run_micro(quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "micro.py"), "--json", *(["--quick"] if quick else [])]
    try:
        rc, out, err = procs.run_tool(cmd, timeout=300)
    except OSError as exc:
        return {"error": str(exc), "cases": []}
    if rc != 0:
        return {"error": f"micro.py rc={rc}: {err.strip()[-500:]}", "cases": []}
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if err.strip():
        result["stderr"] = err.strip()[-2000:]
    return result


def _run_shm_one(
    systems: Systems, key: str, body: bodies_mod.Body, seconds: float, min_runs: int
) -> dict[str, Any]:
    ep = systems.endpoints.get(key)
    if ep is None or ep.usable() is not None or ep.http_port is None:
        why = ep.usable() if ep else f"{key} not configured"
        return {"status": f"error: {_bare(why or '')}"}
    why_not = shm.probe(ep.http_port)
    if why_not is not None:
        return {"status": f"not available (v2proxy: {why_not})"}
    try:
        result: dict[str, Any] = shm.measure(ep.http_port, body, seconds, min_runs)
    except Exception as exc:
        return {"status": loadgen.one_line(f"error: {type(exc).__name__}: {exc}", 400)}
    result["status"] = "ok"
    return result


def _run_shm(
    systems: Systems, rest: dict[str, bodies_mod.Body], seconds: float, min_runs: int
) -> dict[str, dict[str, Any]]:
    """(g) for every system of SHM_SYSTEMS, one after the other: label -> shm.measure's result
    (or {"status": why not})."""
    out: dict[str, dict[str, Any]] = {}
    for label, key, _ in SHM_SYSTEMS:
        out[label] = _run_shm_one(systems, key, rest["fp32_64mib_binary"], seconds, min_runs)
        log(f"(g) {label}: {out[label]['status']}")
    return out


def shm_rows(shm_result: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for label, _, what in SHM_SYSTEMS:
        r = shm_result.get(label)
        if r is None:
            continue
        if r.get("speedup"):
            rows.append(
                [
                    label,
                    what,
                    f"{r['body_mean_ms']:.1f}",
                    f"{r['shm_mean_ms']:.1f}",
                    f"{r['speedup']:.2f}",
                    f"{r['body_requests']}/{r['shm_requests']}",
                ]
            )
        else:
            rows.append([label, what, _short(r.get("status", "not measured")), "", "", ""])
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    durations = QUICK if args.quick else FULL
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    scenarios = [s for s in SCENARIOS if not only or s.id in only]
    run_micro = not only or "micro" in only
    run_shm = not only or "g" in only
    size_scenarios = [s for s in SIZE_SCENARIOS if not only or s.id in only]
    t0 = time.monotonic()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)

    keys = {k for s in scenarios for _, k in s.systems}
    need_mls = run_shm or any("mlserver" in k for k in keys)
    need_triton = run_shm or bool(size_scenarios) or any("triton" in k for k in keys)
    missing = _missing_peers(need_mls, need_triton)
    if missing:
        for line in missing:  # whole, never cut to the terminal's width
            log(f"cannot run the benchmark: {line}")
        log("the benchmarks compare v2proxy with MLServer and Triton: build them with `make peers`")
        return 2
    try:
        tools = procs.ensure_tools(log)
    except RuntimeError as exc:
        log(f"cannot run the benchmark: {exc}")
        return 2
    nghttp = procs.tool_path("nghttp")
    if nghttp:
        tools["nghttp"] = nghttp
    # the commit and the state of src/ when the servers start, which is the code measured
    # (others may commit while a 10-minute run goes on)
    info = machine_info(tools)

    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="v2proxy-bench-"))
        stack.callback(_rmtree, workdir)
        log(f"work folder {workdir}; building request bodies")
        rest = bodies_mod.build_rest_bodies(workdir, args.quick)
        grpc = bodies_mod.build_grpc_bodies(workdir)

        log("starting the systems")
        systems = Systems(workdir, stack, args)
        systems.start_all(tools, need_mls, need_triton, args.start_timeout)
        for key, ep in systems.endpoints.items():
            status = ep.error or f"http {ep.http_port}, grpc {ep.grpc_port}"
            log(f"  {key}: {status}")

        runner = Runner(systems, rest, grpc, durations, workdir, args.concurrency)
        runner.run(scenarios)

        shm_result: dict[str, dict[str, Any]] = {}
        if run_shm:
            log("(g) shared memory")
            shm_result = _run_shm(systems, rest, durations.shm, durations.shm_min_runs)
        sizes_result: dict[str, Any] = {}
        if size_scenarios:
            log("(h) latency per size")
            sizes_result = _run_sizes(systems, size_scenarios, durations.rounds, args.quick)
        endpoints = {
            k: {"cmd": ep.cmd, "status": ep.error or "ok"} for k, ep in systems.endpoints.items()
        }
    # servers are stopped: the micro-benchmarks get the machine to themselves
    micro: dict[str, Any] | None = None
    if run_micro:
        log("codec micro-benchmarks")
        micro = _run_micro(durations.micro_quick)

    targets = evaluate_targets(runner, micro, shm_result, sizes_result)
    cpu = cpu_summary.summarize(runner.find, [s.id for s in scenarios], [args.concurrency, 1])
    mc = metrics_cost(runner)
    elapsed = time.monotonic() - t0
    by_id = {s.id: s for s in SCENARIOS}
    rows = table_rows(runner, by_id)
    report = {
        "machine": info,
        "quick": args.quick,
        "elapsed_s": round(elapsed, 1),
        "settings": {
            "durations_s": vars(durations),
            "concurrency": args.concurrency,
            "grpc_clients_x_streams": list(grpc_shape(args.concurrency)),
            "wrk_threads": WRK_THREADS,
            "nginx_workers": args.nginx_workers,
            "v2proxy_args": args.v2proxy_args,
            "reference_args": args.reference_args,
        },
        "systems": endpoints,
        "bodies": {
            k: {"bytes": b.size, "model": b.model, "what": b.description}
            for k, b in {**rest, **grpc}.items()
        },
        "results": [r.as_dict() for r in runner.rows],
        "targets": targets,
        "cpu_per_request_triton": cpu,
        "metrics_cost": mc,
        "micro": micro,
        "shared_memory": shm_result,
        "latency_per_size": sizes_result,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")

    all_bodies: dict[str, Any] = {**rest, **grpc}
    legend_header = ["scenario", "what", "request"]
    legend = [
        [
            sc.id,
            sc.title,
            f"{all_bodies[sc.body].description} ({_size(all_bodies[sc.body].size)},"
            f" {'gRPC' if sc.protocol == 'grpc' else 'REST'})",
        ]
        for sc in scenarios
    ] + [[sc.id, sc.title, SIZES_REQUEST] for sc in size_scenarios]
    micro_header = ["codec case", "v2proxy ms", "alternative ms", "speedup", "what"]
    target_header = ["target", "measured", "verdict", "detail"]
    shm_header = ["(g) in front of", "backend", "body ms", "shm ms", "body/shm", "requests b/s"]
    shm_title = (
        "(g) 64 MiB FP32 in and out, binary HTTP body vs client shared memory (mean time per"
        " request, one at a time):"
    )
    g_rows = shm_rows(shm_result)
    h_rows = size_rows(sizes_result)
    per_round = sizes_mod.PER_ROUND_QUICK if args.quick else sizes_mod.PER_ROUND
    h_title = (
        "(h) identity_fp32 on Triton, one request at a time on one connection: median latency"
        f" of {', '.join(f'{durations.rounds * k} ({s})' for s, k in per_round.items())}"
        f" requests per system in {durations.rounds} rounds taking turns; CPU per request"
        " from /proc over the same requests:"
    )
    triton_rounds = max(durations.rounds, _min_rounds("a-triton"))
    cpu_title = (
        "CPU per request in front of Triton (proxy process group, /proc utime+stime over the"
        " run / requests completed), req/s and p50: medians of the rounds (a-triton and"
        f" b-triton: {triton_rounds}, c-triton: {durations.rounds}; the systems taking turns);"
        " x nginx: median / nginx's median; per round: the range of the ratios to nginx's in"
        " the same round:"
    )
    text = [
        "",
        f"v2proxy benchmark ({'quick' if args.quick else 'full'}) on {info['nproc']} x"
        f" {info['cpu_model']}, commit {info['git_commit'][:10]}"
        + (
            f" + {info['src_uncommitted_changes']} uncommitted src files"
            if info["src_uncommitted_changes"]
            else ""
        ),
        "",
        format_text_table(legend_header, legend, "lll"),
        "",
        *([format_text_table(COLUMNS, rows), ""] if rows else []),
        *(
            [cpu_title, format_text_table(cpu_summary.HEADER, cpu_summary.rows(cpu)), ""]
            if cpu
            else []
        ),
        *([metrics_cost_line(mc), ""] if mc else []),
        *([shm_title, format_text_table(shm_header, g_rows, "llrrrr"), ""] if g_rows else []),
        *([h_title, format_text_table(SIZE_HEADER, h_rows, "ll"), ""] if h_rows else []),
        format_text_table(micro_header, micro_rows(micro), "lrrrl") if micro else "",
        "",
        format_text_table(target_header, target_rows(targets), "lrll"),
        "",
        f"finished in {elapsed:.0f} s; results in {args.output}",
    ]
    print("\n".join(text))

    md = [
        f"Benchmark ({'quick' if args.quick else 'full'} run, {info['date']}): {info['nproc']} x"
        f" {info['cpu_model']}, kernel {info['kernel']}, commit `{info['git_commit'][:10]}`"
        + (
            f" with {info['src_uncommitted_changes']} uncommitted src files"
            if info["src_uncommitted_changes"]
            else ""
        )
        + f"; wrk -t{WRK_THREADS} -c{args.concurrency}, h2load"
        f" {'x'.join(map(str, grpc_shape(args.concurrency)))} (connections x streams),"
        f" every row the median of {durations.rounds} rounds (metrics-triton:"
        f" {durations.many_rounds}; a-triton and b-triton: {triton_rounds}) of"
        f" {durations.small:g} s (small bodies) or"
        f" {durations.big:g} s (large ones), the systems of a scenario taking turns.",
        "",
        md_table(legend_header, legend),
        "",
        *([md_table(COLUMNS, rows), ""] if rows else []),
        *([cpu_title, "", md_table(cpu_summary.HEADER, cpu_summary.rows(cpu)), ""] if cpu else []),
        *([metrics_cost_line(mc), ""] if mc else []),
        *([shm_title, "", md_table(shm_header, g_rows), ""] if g_rows else []),
        *([h_title, "", md_table(SIZE_HEADER, h_rows), ""] if h_rows else []),
        md_table(micro_header, micro_rows(micro)) if micro else "",
        "",
        md_table(target_header, target_rows(targets)),
        "",
    ]
    args.output.with_suffix(".md").write_text("\n".join(md))
    return 0


def _missing_peers(mlserver: bool, triton: bool) -> list[str]:
    """Why each peer server the run needs cannot start (its venv is not built), in full."""
    launch = procs.import_peer_launch()
    out = []
    for name, needed in (("mlserver", mlserver), ("triton", triton)):
        if needed:
            try:
                launch.check_venv(name, name, launch.peers_dir(), launch.READY_FILES[name])
            except launch.PeerUnavailable as exc:
                out.append(str(exc))
    return out


SIZES_REQUEST = (
    "identity_fp32 FP32[n], n = "
    + ", ".join(label for label, _ in sizes_mod.SIZES)
    + " (4 KiB-64 MiB), OUTPUT0 requested"
)


def _min_rounds(scenario: str) -> int:
    return next(s.min_rounds for s in SCENARIOS if s.id == scenario)


def _bare(error: str) -> str:
    """An error text without its leading "error: " (when it is wrapped in another)."""
    return error.removeprefix("error: ")


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; every started process was stopped")
        sys.exit(130)
