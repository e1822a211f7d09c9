"""The chart's size values (proxy.backendShmThreshold): a number of bytes or a size with a unit
(64Ki, 1MB), as v2proxy takes them; the schema refuses anything else, and the rendered argument
is accepted by v2proxy with the same number of bytes."""

from __future__ import annotations

import pytest

from tests.deploy.chartlib import pod_spec, refusal, render, serve_args
from v2proxy.ops.config import load_settings


@pytest.mark.parametrize(
    ("setting", "argument", "size"),
    [
        ("--set=proxy.backendShmThreshold=65536", "65536", 65536),
        ("--set=proxy.backendShmThreshold=10000000000", "10000000000", 10**10),
        ("--set=proxy.backendShmThreshold=64Ki", "64Ki", 65536),
        ("--set-string=proxy.backendShmThreshold=1MB", "1MB", 10**6),
        ("--set=proxy.backendShmThreshold=1.5Mi", "1.5Mi", 3 * 2**19),
    ],
)
def test_size_values_take_units(setting: str, argument: str, size: int) -> None:
    (c,) = pod_spec(render(setting))["containers"]
    assert f"--backend-shm-threshold={argument}" in c["args"]
    assert load_settings(serve_args(c), None, env={}).backend_shm_threshold == size


@pytest.mark.parametrize("value", ["lots", "0", "64 Kilo"])
def test_schema_refuses_what_is_not_a_size(value: str) -> None:
    stderr = refusal(f"--set=proxy.backendShmThreshold={value}")
    assert "at '/proxy/backendShmThreshold'" in stderr, stderr
