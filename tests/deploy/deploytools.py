"""Helpers of the deployment tests: where helm, checkov and hadolint are, Kubernetes schema
validation.

``make deploy-tools`` (part of ``make test``) installs helm into ``.cache/deploy-tools`` and
checkov into a venv of its own there (``deploy/install_checkov.sh``), and ``make test`` sets
``V2PROXY_DEPLOY_TOOLS`` for pytest: then a missing tool fails the test. Run by hand without that
variable, tests needing helm or checkov are skipped with the command to run instead.
hadolint and kubernetes-validate come with the ``dev`` extra, so they are always required.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "v2proxy"
#: the Kubernetes versions the chart and the webhook's pods are validated against
K8S_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")
#: kinds from CRDs (Prometheus Operator, cert-manager) that kubernetes-validate has no schema for
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
}


def _deploy_tool(relative: str) -> str:
    """The tool at ``relative`` under the deploy tools' folder; a failure naming it under
    ``make test`` (V2PROXY_DEPLOY_TOOLS set), a skip otherwise."""
    env = os.environ.get("V2PROXY_DEPLOY_TOOLS")
    path = Path(env or ROOT / ".cache" / "deploy-tools") / relative
    name = path.name
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    if env:
        pytest.fail(f"{name} missing at {path}: `make deploy-tools` should have installed it")
    pytest.skip(f"{name} not installed: run `make deploy-tools` (or `make test`)")


def helm() -> str:
    return _deploy_tool("helm")


def checkov() -> str:
    """checkov, in its own venv (deploy/install_checkov.sh)."""
    return _deploy_tool("checkov/bin/checkov")


def venv_tool(name: str) -> str:
    found = Path(sys.executable).parent / name
    if found.is_file():
        return str(found)
    which = shutil.which(name)
    if which is None:
        pytest.fail(f"{name} missing: it comes with the dev extra (pip install -e '.[dev]')")
    return which


def run(*args: str, cwd: Path = ROOT) -> str:
    """Runs a command; its output, or a test failure showing what it said.

    The child gets a copy of the environment, never the process's own ``environ``: test_checkov
    runs this from a thread while other tests may ``setenv`` (``putenv`` reallocates ``environ``),
    and subprocess's vfork child reads what it is handed during ``execve``; a reallocated
    ``environ`` there is a read of freed memory (``OSError: [Errno 14] Bad address``)."""
    proc = subprocess.run(
        args,
        check=False,
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def schema_errors(doc: dict[str, Any], versions: tuple[str, ...] = K8S_VERSIONS) -> list[str]:
    """kubernetes-validate --strict of one manifest against each version: the failures."""
    errors = []
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            errors.append(f"{version} {doc.get('kind')} {where}: {exc.message}")
    return errors


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]
