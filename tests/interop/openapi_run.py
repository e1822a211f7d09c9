"""Run schemathesis against running v2proxy processes, from the document they serve at
``GET /openapi.json``, and count what happened.

Used by tests/interop/test_openapi_schemathesis.py (a bounded run inside `make test`) and by
`make schemathesis` (``python tests/interop/openapi_run.py``: a longer run in front of the
builtin models, Triton over REST and Triton over gRPC, whose figures go into docs/reliability.md,
schemathesis).

The checks are those that hold for any request, valid or not: no server error
(``not_a_server_error``), every status code, Content-Type, header and body as documented
(``*_conformance``), 405 for methods a path does not serve (``unsupported_method``).
``positive_data_acceptance`` and ``negative_data_rejection`` are left out on purpose: a request
that matches the document's InferRequest schema is still refused by a model whose inputs it
does not name (400), and v2proxy is liberal in what it accepts (unknown keys, any
Content-Type), so neither says anything about a defect here.

Every run tests the document as served, with one change made for the run only: the ``model``
path parameter also draws the names of the target's real models (otherwise nearly every case
stops at 404 Request for unknown model).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "unsupported_method",
    )
)
PHASES = "examples,coverage,fuzzing,stateful"
#: 5xx answers that are no client fault v2proxy could answer itself: (status, pattern of the
#: error text, why). Triton refuses to move its log file over the network and to serve a
#: decoupled model on REST /infer (501), and loads no models in its default model control mode
#: (503, over REST and gRPC); a REST path that matches no route cannot be carried to a gRPC
#: backend (v2proxy's own 501, by design: tests/integration/test_grpc_backend.py)
BACKEND_OWN = [
    (501, r"log file location can not be updated through network protocol", "Triton"),
    (501, r"HTTP end point doesn't support models with decoupled transaction policy", "Triton"),
    (503, r"explicit model load / unload is not allowed if polling is enabled", "Triton"),
    (503, r"backend at \S+ is unavailable for RepositoryModel(Unl|L)oad: explicit", "Triton"),
    (501, r"\S+ /v2/\S* is not available through a gRPC backend", "v2proxy, by design"),
]
#: in front of a real backend, its own 5xx answers are told apart by BACKEND_OWN instead
BACKEND_CHECKS = CHECKS.replace("not_a_server_error,", "")
#: the API groups --restricted-api restricts by default, as the document's tags (shared memory
#: is gated by --client-shm instead)
RESTRICTED_TAGS = ("model-repository", "logging", "trace")


@dataclass
class Figures:
    """What one schemathesis run did and found."""

    target: str
    cases: int = 0
    failures: int = 0
    errored: int = 0
    #: answers with a 5xx status, out of all requests sent (from the HAR log)
    server_errors: int = 0
    #: of those, the ones that are no backend's own answer of BACKEND_OWN: (status, body, request)
    unexpected: list[tuple[int, str, str]] = field(default_factory=list)
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failure_kinds: list[dict[str, Any]] = field(default_factory=list)
    error_kinds: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    exit_code: int = 0
    output: str = ""

    def row(self) -> str:
        return (
            f"| {self.target} | {self.cases} | {self.requests} | {self.failures} |"
            f" {self.server_errors} | {len(self.unexpected)} | {self.errored} |"
            f" {self.seconds:.0f} s |"
        )


def fetch_json(url: str, body: bytes | None = None) -> Any:
    req = urllib.request.Request(url, data=body, method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def model_names(base_url: str) -> list[str]:
    """The target's models, from its repository index (needs --restricted-api none)."""
    index = fetch_json(base_url + "/v2/repository/index", b"{}")
    return sorted({entry["name"] for entry in index})


def document_for_run(document: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """The served document with the ``model`` path parameter also drawing real names."""
    doc = json.loads(json.dumps(document))
    if not models:
        return doc
    params = [doc["components"]["parameters"]["model"]]
    for ops in doc["paths"].values():
        for op in ops.values():
            params += [p for p in op.get("parameters", []) if p.get("name") == "model"]
    for param in params:
        names = [m for m in models if _allowed(m, param["schema"])]
        param["schema"] = {"anyOf": [{"enum": names}, _drawable(param["schema"])]}
    return doc


def _allowed(name: str, schema: dict[str, Any]) -> bool:
    return schema.get("not", {}).get("const") != name


def _drawable(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without ``not`` (which schemathesis' coverage phase does not honour): a name
    excluded by ``not: {const: stats}`` is left out by its length."""
    if "not" not in schema:
        return schema
    excluded = schema["not"]["const"]
    return {"type": "string", "minLength": len(excluded) + 1}


def run(
    base_url: str,
    target: str,
    *,
    models: list[str] | None = None,
    max_examples: int = 5,
    seed: int = 1,
    workers: int = 2,
    phases: str = PHASES,
    tags: tuple[str, ...] = (),
    checks: str = CHECKS,
    request_timeout: float = 30.0,
    timeout: float = 600.0,
    out_dir: Path | None = None,
) -> Figures:
    """One ``st run`` against ``base_url`` (its own /openapi.json), its figures parsed from the
    JSON report and the HAR log."""
    document = fetch_json(base_url + "/openapi.json")
    work = Path(out_dir or tempfile.mkdtemp(prefix="v2proxy-schemathesis-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    schema = work / f"openapi-{target}.json"
    schema.write_text(json.dumps(document_for_run(document, models or [])))
    report, har = work / f"report-{target}.json", work / f"har-{target}.json"
    cmd = [
        str(Path(sys.executable).parent / "st"),
        "run",
        str(schema),
        "--url",
        base_url,
        "--checks",
        checks,
        "--phases",
        phases,
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--workers",
        str(workers),
        "--request-timeout",
        str(request_timeout),
        "--report",
        "json,har",
        "--report-json-path",
        str(report),
        "--report-har-path",
        str(har),
        "--no-color",
    ]
    for tag in tags:
        cmd += ["--include-tag", tag]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=work,  # its .schemathesis/ replay store lands there, not in the tree
    )
    figures = Figures(target, seconds=time.monotonic() - t0, exit_code=proc.returncode)
    figures.output = proc.stdout + proc.stderr
    (work / f"output-{target}.txt").write_text(figures.output)
    if report.exists():
        data = json.loads(report.read_text())
        cases = data.get("test_cases", {})
        figures.cases = int(cases.get("generated", 0))
        figures.failures = int(cases.get("unique_failures", 0))
        figures.errored = int(cases.get("errored", 0))
        figures.failure_kinds = list(data.get("failures", []))
        figures.error_kinds = list(data.get("errors", []))
    if har.exists():
        entries = json.loads(har.read_text()).get("log", {}).get("entries", [])
        figures.statuses = Counter(int(e["response"]["status"]) for e in entries)
        figures.requests = len(entries)
        figures.server_errors = sum(n for s, n in figures.statuses.items() if s >= 500)
        for e in entries:
            status = int(e["response"]["status"])
            if status >= 500:
                text = e["response"].get("content", {}).get("text", "")
                if not _known(status, _error_text(text)):
                    request = f"{e['request']['method']} {e['request']['url']}"
                    figures.unexpected.append((status, text[:300], request))
    return figures


def _known(status: int, text: str) -> bool:
    return any(s == status and re.match(p, text) for s, p, _ in BACKEND_OWN)


def _error_text(text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError:
        return text
    return str(obj.get("error", "")) if isinstance(obj, dict) else text


TABLE_HEAD = (
    "| target | cases | requests | failures | 5xx answers | 5xx not the backend's own |"
    " errored | time |\n"
    "|---|---|---|---|---|---|---|---|"
)


@contextlib.contextmanager
def targets(names: list[str]) -> Iterator[dict[str, str]]:
    """v2proxy processes (``--restricted-api none``) in front of each named target: builtin,
    triton (Triton over REST), triton-grpc; name -> base URL."""
    from peers import launch
    from procs import v2proxy

    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        triton: tuple[str, str] | None = None
        for name in names:
            if name == "builtin":
                backend = "builtin"
            else:
                if triton is None:
                    peers = Path(os.environ.get("V2PROXY_PEERS_DIR") or launch.peers_dir())
                    peer = stack.enter_context(launch.SERVERS["triton"](peers))
                    triton = (peer.base_url, peer.grpc_url)
                backend = f"grpc://{triton[1]}" if name == "triton-grpc" else triton[0]
            p = stack.enter_context(
                v2proxy("serve", "--backend", backend, "--restricted-api", "none", name=name)
            )
            urls[name] = p.base_url
        yield urls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--targets", default="builtin,triton,triton-grpc")
    ap.add_argument("--max-examples", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("schemathesis-report"))
    args = ap.parse_args(argv)
    results = []
    with targets(args.targets.split(",")) as urls:
        for name, url in urls.items():
            fig = run(
                url,
                name,
                models=model_names(url),
                max_examples=args.max_examples,
                seed=args.seed,
                workers=args.workers,
                timeout=3600,
                out_dir=args.out,
                checks=CHECKS if name == "builtin" else BACKEND_CHECKS,
            )
            results.append(fig)
            print(fig.output[-6000:])
            print(f"{name}: statuses {dict(sorted(fig.statuses.items()))}")
            for status, text, request in fig.unexpected:
                print(f"  unexpected {status} {text!r} for {request}")
    print(TABLE_HEAD)
    for fig in results:
        print(fig.row())
    (args.out / "table.md").write_text("\n".join([TABLE_HEAD, *(f.row() for f in results)]) + "\n")
    return 0 if all(f.failures == 0 and not f.unexpected for f in results) else 1


if __name__ == "__main__":
    sys.exit(main())
