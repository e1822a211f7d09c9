"""Settings: precedence CLI > env > YAML > defaults, validated once with one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from v2proxy.config import BackendTarget, ConfigError, load_settings


def test_defaults_are_the_product_contract() -> None:
    s = load_settings({}, None, env={})
    assert s.backend == BackendTarget("builtin")
    assert (s.http_port, s.host, s.backend_encoding) == (9000, "0.0.0.0", "auto")
    assert s.max_input_size == 64 * 1024 * 1024
    assert s.event_loop == "uvloop"


def test_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "v2proxy.yaml"
    cfg.write_text(
        "backend: http://127.0.0.1:8080\nhttp_port: 9100\nbackend-encoding: json\n"
        "models:\n  densenet:\n    outputs:\n      fc6_1: {labels: config/labels/x.txt}\n"
    )
    env = {"V2PROXY_HTTP_PORT": "9200", "V2PROXY_HOST": "127.0.0.1"}
    s = load_settings({"http_port": 9300, "host": None}, str(cfg), env=env)
    assert s.http_port == 9300  # CLI wins
    assert s.host == "127.0.0.1"  # env beats default
    assert s.backend == BackendTarget("http", "http://127.0.0.1:8080")  # file
    assert s.backend_encoding == "json"
    assert s.models["densenet"]["outputs"]["fc6_1"]["labels"] == "config/labels/x.txt"
    s = load_settings({}, str(cfg), env=env)
    assert s.http_port == 9200  # env beats file
    s = load_settings({"backend": "grpc://127.0.0.1:8001"}, None, env={})
    assert s.backend == BackendTarget("grpc", "127.0.0.1:8001")
    assert (s.grpc_port, s.grpc_max_message_size) == (9001, 2**31 - 1)


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"backend": "ftp://x"}, "invalid value 'ftp://x' for 'backend'"),
        ({"backend": "grpc://127.0.0.1"}, "grpc://host:port"),
        ({"http_port": 70000}, "for 'http_port': must be a port number"),
        ({"backend_encoding": "xml"}, "must be one of auto, json, binary"),
        ({"max_input_size": 0}, "must be a positive integer"),
        ({"event_loop": "trio"}, "must be one of uvloop, asyncio"),
    ],
)
def test_bad_values_stop_with_one_line(cli: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(cli, None, env={})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nonsense_key: 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'nonsense_key'"):
        load_settings({}, str(cfg), env={})
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings({}, str(tmp_path / "missing.yaml"), env={})


def test_cli_rejects_bad_config_with_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "v2proxy", "serve", "--backend", "ftp://nowhere"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("v2proxy: invalid value 'ftp://nowhere' for 'backend'")
