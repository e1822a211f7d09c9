"""Helpers of the chart tests (test_chart, test_chart_tls): ``helm template`` of helm/v2proxy
as release ``rel`` (or another) in namespace ``NS`` (``render``, cached per argument list), the
pieces of the rendered manifests (``one``, ``pod_spec``, ``by_name``), their validation
(``assert_valid``: kubernetes-validate for every built-in kind), a container's arguments as
``v2proxy serve`` parses them (``serve_args``), and what helm says when the chart refuses values
(``refusal``)."""

from __future__ import annotations

import subprocess
from functools import cache
from typing import Any

from tests.deploy.deploytools import CHART, CRD_KINDS, documents, helm, run, schema_errors
from v2proxy.cli import parser

NS = "serving"


@cache
def render(*args: str, chart: str = str(CHART), release: str = "rel") -> tuple[dict[str, Any], ...]:
    out = run(helm(), "template", release, chart, "--namespace", NS, *args)
    return tuple(documents(out))


def kinds(docs: tuple[dict[str, Any], ...]) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in docs)


def one(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, (kind, name, kinds(docs))
    return found[0]


def pod_spec(docs: tuple[dict[str, Any], ...], name: str = "rel-v2proxy") -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [i for i in items if i["name"] == name]
    return found


def assert_valid(docs: tuple[dict[str, Any], ...]) -> None:
    errors = []
    for d in docs:
        if (d["apiVersion"], d["kind"]) in CRD_KINDS:
            continue  # no schema in kubernetes-validate; checked field by field below
        errors += schema_errors(d)
    assert errors == []


def serve_args(container: dict[str, Any]) -> dict[str, Any]:
    """The container's arguments as `v2proxy serve` parses them (SystemExit if refused)."""
    assert container["args"][0] == "serve"
    return vars(parser().parse_args(container["args"]))


def refusal(*args: str) -> str:
    """What ``helm template rel CHART ARGS`` prints on stderr; it must fail (the chart refuses
    the values, by its schema or a check of its templates)."""
    proc = subprocess.run(
        [helm(), "template", "rel", str(CHART), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    return proc.stderr
