"""Settings: precedence CLI > env > YAML > defaults, validated once with one clear line."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from v2proxy.cli import parser
from v2proxy.core.restricted import DEFAULT_GROUPS, RestrictedPolicy
from v2proxy.ops.config import OTHER_VARIABLES, PARSERS, BackendTarget, Settings, load_settings
from v2proxy.ops.config_sections import MINDIE_KEYS, ConfigError, MindieSettings
from v2proxy.ops.config_spec import DEFAULTS, SETTINGS

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_product_contract() -> None:
    s = load_settings({}, None, env={})
    assert s.backend == BackendTarget("builtin")
    assert (s.http_port, s.host, s.backend_encoding) == (9000, "0.0.0.0", "auto")
    assert s.max_input_size == 64 * 1024 * 1024
    assert s.event_loop == "uvloop"
    assert (s.client_shm, s.backend_shm) == ("local", "auto")
    assert s.restricted == RestrictedPolicy(DEFAULT_GROUPS, None)
    assert s.restricted.groups == {"model-repository", "logging", "trace"}
    assert dict(s.models) == {}
    assert s.mindie is None


def test_defaults_come_from_the_table_of_settings() -> None:
    """Settings' defaults are the table's (v2proxy.ops.config_spec.SETTINGS), and every setting is a
    field of Settings or one of those built from several; the same for mindie:."""
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    built = {"restricted_api", "restricted_api_header", "tls_cert", "tls_key", "tls_client_ca"}
    built |= {"backend_ca", "backend_cert", "backend_key"}
    defaults = Settings()
    for spec in SETTINGS:
        if spec.name in built:
            assert spec.name not in fields
            continue
        assert getattr(defaults, spec.name) == spec.default, spec.name
    assert set(fields) - {s.name for s in SETTINGS} == {
        "server_name",
        "restricted",
        "models",
        "mindie",
        "openai",
        "tls",
        "backend_tls",
    }
    assert defaults.restricted.groups == DEFAULTS["restricted_api"]
    for spec in MINDIE_KEYS[1:]:
        assert getattr(MindieSettings("m"), spec.name) == spec.default, spec.name
    assert MINDIE_KEYS[0].name == "model"  # required: no default


def test_precedence(tmp_path: Path) -> None:
    (tmp_path / "config" / "labels").mkdir(parents=True)
    (tmp_path / "config" / "labels" / "x.txt").write_text("cat\ndog\n")
    cfg = tmp_path / "v2proxy.yaml"
    cfg.write_text(
        "backend: http://127.0.0.1:8080\nhttp_port: 9100\nbackend-encoding: json\n"
        "client_shm: off\nrestricted_api: none\n"
        "models:\n  densenet:\n    outputs:\n      fc6_1: {labels: config/labels/x.txt}\n"
    )
    env = {"V2PROXY_HTTP_PORT": "9200", "V2PROXY_HOST": "127.0.0.1"}
    s = load_settings({"http_port": 9300, "host": None}, str(cfg), env=env)
    assert s.http_port == 9300  # CLI wins
    assert s.host == "127.0.0.1"  # env beats default
    assert s.backend == BackendTarget("http", "http://127.0.0.1:8080")  # file
    assert s.backend_encoding == "json"
    assert s.client_shm == "off"  # YAML's bare `off` is false: read as "off"
    assert s.restricted.groups == frozenset()
    out = s.models["densenet"].outputs["fc6_1"]
    assert out.labels == ("cat", "dog")
    assert out.labels_path == str(tmp_path / "config" / "labels" / "x.txt")
    env["V2PROXY_CLIENT_SHM"] = "on"
    s = load_settings({}, str(cfg), env=env)
    assert s.http_port == 9200  # env beats file
    assert s.client_shm == "on"
    s = load_settings({"client_shm": "local"}, str(cfg), env=env)
    assert s.client_shm == "local"
    s = load_settings({"backend": "grpc://127.0.0.1:8001"}, None, env={})
    assert s.backend == BackendTarget("grpc", "127.0.0.1:8001")
    assert (s.grpc_port, s.grpc_max_message_size) == (9001, 2**31 - 1)


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"backend": "ftp://x"}, "--backend=ftp://x: invalid value for 'backend'"),
        (
            {"backend": "grpc://127.0.0.1"},
            "has no port: give host:port, e.g. grpc://127.0.0.1:8001",
        ),
        ({"http_port": 70000}, "for 'http_port': must be a port number"),
        ({"backend_encoding": "xml"}, "must be one of auto, json, binary"),
        ({"max_input_size": 0}, "for 'max_input_size': must be at least 1 byte"),
        ({"event_loop": "trio"}, "must be one of uvloop, asyncio"),
        ({"backend_timeout": "inf"}, "for 'backend_timeout': must be a positive number"),
        ({"client_shm": "yes"}, "for 'client_shm': must be one of off, local, on"),
        ({"backend_shm": "cuda"}, "for 'backend_shm': must be one of off, system, auto"),
        ({"restricted_api": "logging,admin"}, "unknown API group 'admin' (known: health,"),
        ({"restricted_api_header": "x-key"}, "for 'restricted_api_header': must be KEY=VALUE"),
    ],
)
def test_bad_values_stop_with_one_line(cli: dict[str, object], message: str) -> None:
    """Each bad value stops the start with one line naming where it came from."""
    with pytest.raises(ConfigError) as info:
        load_settings(cli, None, env={})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_restricted_settings_from_every_source(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("restricted_api: [logging, TRACE]\nrestricted-api-header: X-Admin=s3cret\n")
    s = load_settings({}, str(cfg), env={})
    assert s.restricted == RestrictedPolicy(frozenset({"logging", "trace"}), ("x-admin", "s3cret"))
    assert "s3cret" not in repr(s)  # settings may be logged
    env = {"V2PROXY_RESTRICTED_API": "", "V2PROXY_RESTRICTED_API_HEADER": "k=v"}
    s = load_settings({}, str(cfg), env=env)
    assert s.restricted == RestrictedPolicy(frozenset(), ("k", "v"))
    s = load_settings({"restricted_api": "statistics"}, str(cfg), env=env)
    assert s.restricted.groups == {"statistics"}
    with pytest.raises(ConfigError) as info:
        load_settings({"restricted_api_header": "bad name=s3cret"}, None, env={})
    assert "s3cret" not in str(info.value)


def test_bad_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nonsense_key: 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'nonsense_key'"):
        load_settings({}, str(cfg), env={})
    cfg.write_text("http_prot: 9000\n")
    with pytest.raises(ConfigError) as info:
        load_settings({}, str(cfg), env={})
    assert str(info.value) == f"{cfg}: unknown setting 'http_prot' (did you mean 'http_port'?)"
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings({}, str(tmp_path / "missing.yaml"), env={})


LABELS_OK = "models: {m: {outputs: {o: {labels: l.txt}}}}\n"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("models: [a]\n", "models: must be a mapping of model names, not a list"),
        (
            "models:\n  m:\n  outputs: {}\n",
            "models.m: must be a mapping of model settings, not null",
        ),
        ("models: {m: {output: {}}}\n", "models.m.output: unknown key (known: outputs)"),
        (
            "models: {m: {outputs: [o]}}\n",
            "models.m.outputs: must be a mapping of output names, not a list",
        ),
        (
            "models: {m: {outputs: {o: {}}}}\n",
            "models.m.outputs.o.labels: missing (the path of a label file)",
        ),
        (
            "models: {m: {outputs: {o: {labels: l.txt, top: 3}}}}\n",
            "models.m.outputs.o.top: unknown key (known: labels)",
        ),
        (
            "models: {m: {outputs: {o: {labels: 3}}}}\n",
            "models.m.outputs.o.labels: must be the path of a label file",
        ),
        (
            "models: {m: {outputs: {o: {labels: x.txt}}}}\n",
            "models.m.outputs.o.labels: cannot read 'x.txt': No such file or directory"
            " (looked in the working directory and in {dir})",
        ),
        (
            "models: {m: {outputs: {o: {labels: sub}}}}\n",
            "models.m.outputs.o.labels: cannot read 'sub': Is a directory",
        ),
        ("mindie: ensemble\n", "mindie: must be a mapping of MindIE settings, not a string"),
        ("mindie: {profile: vllm}\n", "mindie.model: missing (the v2 model that serves /infer)"),
        ("mindie: {model: ''}\n", "mindie.model: must be a non-empty string (got '')"),
        (
            "mindie: {model: m, profile: tgi}\n",
            "mindie.profile: must be one of trtllm, vllm, generate (got 'tgi')",
        ),
        (
            "mindie: {model: m, tokenizer: x}\n",
            "mindie.tokenizer: unknown key (known: max_input_chars, max_new_tokens, model,"
            " profile, seed_input, timeout)",
        ),
        ("mindie: {model: m, timeout: 0}\n", "mindie.timeout: must be an integer 1..65535 (got 0)"),
        (
            "mindie: {model: m, max_new_tokens: 2.5}\n",
            "mindie.max_new_tokens: expected an integer (got 2.5)",
        ),
        (
            "mindie: {model: m, profile: vllm, seed_input: seed}\n",
            "mindie.seed_input: only applies to profile 'trtllm'",
        ),
    ],
)
def test_bad_sections_stop_with_one_line_naming_the_key(
    tmp_path: Path, yaml_text: str, message: str
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml_text)
    (tmp_path / "sub").mkdir()
    with pytest.raises(ConfigError) as info:
        load_settings({}, str(cfg), env={})
    assert str(info.value) == f"{cfg}: " + message.format(dir=tmp_path)


@pytest.mark.parametrize(
    ("content", "labels"),
    [
        (b"a\nb\nc\n", ("a", "b", "c")),
        (b"a\nb\nc", ("a", "b", "c")),
        (b"a\r\nb\r\n", ("a", "b")),
        (b"\xef\xbb\xbfchat\nchien\n", ("chat", "chien")),  # BOM dropped
        (b"a\n\nc\n", ("a", "", "c")),  # a blank line keeps the indexes aligned
        (" caf\u00e9 au lait \n\u732b\n".encode(), (" caf\u00e9 au lait ", "\u732b")),
    ],
)
def test_label_files(tmp_path: Path, content: bytes, labels: tuple[str, ...]) -> None:
    (tmp_path / "l.txt").write_bytes(content)
    (tmp_path / "config.yaml").write_text(LABELS_OK)
    s = load_settings({}, str(tmp_path / "config.yaml"), env={})
    assert s.models["m"].outputs["o"].labels == labels


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "'l.txt' holds no labels"),
        (b"\n\r\n", "'l.txt' holds no labels"),
        (b"ok\n\xff\n", "'l.txt' is not UTF-8 text (byte 0xff at offset 3)"),
    ],
)
def test_bad_label_files(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "l.txt").write_bytes(content)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(LABELS_OK)
    with pytest.raises(ConfigError) as info:
        load_settings({}, str(cfg), env={})
    assert str(info.value) == f"{cfg}: models.m.outputs.o.labels: {message}"


def test_label_path_working_directory_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, cwd = tmp_path / "etc", tmp_path / "cwd"
    folder.mkdir()
    cwd.mkdir()
    (folder / "config.yaml").write_text(LABELS_OK)
    (folder / "l.txt").write_text("from-config-folder\n")
    monkeypatch.chdir(cwd)
    s = load_settings({}, str(folder / "config.yaml"), env={})
    assert s.models["m"].outputs["o"].labels == ("from-config-folder",)
    (cwd / "l.txt").write_text("from-cwd\n")
    s = load_settings({}, "../etc/config.yaml", env={})
    assert s.models["m"].outputs["o"].labels == ("from-cwd",)
    assert s.models["m"].outputs["o"].labels_path == str(cwd / "l.txt")
    absolute = tmp_path / "abs.txt"
    absolute.write_text("abs\n")
    (folder / "config.yaml").write_text(
        f"models: {{m: {{outputs: {{o: {{labels: {absolute}}}}}}}}}"
    )
    s = load_settings({}, str(folder / "config.yaml"), env={})
    assert s.models["m"].outputs["o"].labels == ("abs",)


def test_settings_are_frozen_and_mindie_defaults(tmp_path: Path) -> None:
    (tmp_path / "l.txt").write_text("a\n")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(LABELS_OK + "mindie:\n  model: ensemble\n  max-new-tokens: 64\n  models: {}\n")
    with pytest.raises(ConfigError, match=r"mindie\.models: unknown key"):
        load_settings({}, str(cfg), env={})
    cfg.write_text(LABELS_OK + "mindie:\n  model: ensemble\n  max-new-tokens: 64\n")
    s = load_settings({}, str(cfg), env={})
    assert s.mindie == MindieSettings("ensemble", "trtllm", 64, 4 * 1024 * 1024, 600, "seed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.mindie.model = "x"  # type: ignore[misc, union-attr]
    with pytest.raises(TypeError):
        s.models["n"] = s.models["m"]  # type: ignore[index]
    with pytest.raises(TypeError):
        s.models["m"].outputs["p"] = s.models["m"].outputs["o"]  # type: ignore[index]
    cfg.write_text("models:\nmindie:\n")  # empty sections are no sections
    s = load_settings({}, str(cfg), env={})
    assert (dict(s.models), s.mindie) == ({}, None)


def test_example_config_uses_every_key() -> None:
    example = ROOT / "config" / "example.yaml"
    s = load_settings({}, str(example), env={})
    assert s.models["classifier"].outputs["SCORES"].labels[:2] == ("zero", "one")
    assert s.mindie is not None and s.mindie.model == "llm"
    text = example.read_text()
    missing = [k for k in PARSERS if f"{k}:" not in text]
    assert missing == []


def test_serve_help_lists_every_option() -> None:
    serve = parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    help_text = serve.format_help()
    for key in PARSERS:
        assert "--" + key.replace("_", "-") in help_text, key
    for action in serve._actions:
        if action.option_strings and action.dest not in ("help", "config"):
            assert action.help and "default" in action.help, action.dest


def test_reference_server_restricts_nothing_by_default() -> None:
    proc = _serve("reference-server", "--restricted-api", "nope")
    assert proc.returncode == 2
    assert "unknown API group 'nope'" in proc.stderr


def test_cli_rejects_bad_config_with_exit_2() -> None:
    proc = _serve("serve", "--backend", "ftp://nowhere")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(
        "v2proxy: --backend=ftp://nowhere: invalid value for 'backend': must be 'builtin',"
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("env", "V2PROXY_HTTP_PORT=xyz: invalid value for 'http_port': expected an integer"),
        ("file", "c.yaml: http_port=xyz: invalid value for 'http_port': expected an integer"),
        ("cli", "--http-port=xyz: invalid value for 'http_port': expected an integer"),
    ],
)
def test_a_bad_value_names_its_source(tmp_path: Path, source: str, message: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("http_port: xyz\n" if source == "file" else "grpc_port: 9001\n")
    env = {"V2PROXY_HTTP_PORT": "xyz"} if source == "env" else {}
    cli = {"http_port": "xyz"} if source == "cli" else {}
    with pytest.raises(ConfigError) as info:
        load_settings(cli, str(cfg), env=env)
    assert str(info.value).endswith(message)
    assert str(info.value).startswith(str(cfg) if source == "file" else message[:8])


def test_a_secret_is_never_shown() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({}, None, env={"V2PROXY_RESTRICTED_API_HEADER": "s3cret"})
    assert str(info.value).startswith("V2PROXY_RESTRICTED_API_HEADER=***: invalid value")
    assert "s3cret" not in str(info.value)


# ------------------------------------------------------------------ sizes and command-line errors

SIZE_KEYS = ("max_input_size", "max_body_size", "grpc_max_message_size", "backend_shm_threshold")


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1024", 1024),
        ("512K", 512_000),
        ("512k", 512_000),
        ("1KiB", 1024),
        ("64Mi", 64 * 2**20),
        ("64 MiB", 64 * 2**20),
        ("1G", 10**9),
        ("1GB", 10**9),
        ("1GiB", 2**30),
        ("1.5Gi", 3 * 2**29),
        ("100B", 100),
        (" 2M ", 2_000_000),
        (4096, 4096),
    ],
)
@pytest.mark.parametrize("key", SIZE_KEYS)
@pytest.mark.parametrize("source", ["cli", "env", "file"])
def test_sizes_take_units_in_every_source(
    tmp_path: Path, source: str, key: str, text: str | int, size: int
) -> None:
    """K, M, G: powers of 1000; Ki, Mi, Gi (and KiB, MiB, GiB): powers of 1024; B optional."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"{key}: {text}\n" if source == "file" else "")
    env = {f"V2PROXY_{key.upper()}": str(text)} if source == "env" else {}
    cli = {key: text} if source == "cli" else {}
    assert getattr(load_settings(cli, str(cfg), env=env), key) == size


@pytest.mark.parametrize(
    ("key", "text", "message"),
    [
        ("max_body_size", "lots", "expected a size: an integer number of bytes, or a number with"),
        ("max_body_size", "1.5", "1.5 is not a whole number of bytes"),
        ("max_body_size", "1.0001K", "1.0001K is not a whole number of bytes"),
        ("max_input_size", "-1", "expected a size"),
        ("max_input_size", "1 GiBs", "expected a size"),
        ("backend_shm_threshold", "0Mi", "must be at least 1 byte"),
        ("max_input_size", True, "expected a size"),
        (
            "grpc_max_message_size",
            "2Gi",
            "must be at most 2147483647 bytes (2 GiB - 1: gRPC's largest message)",
        ),
    ],
)
def test_bad_sizes_name_the_setting(key: str, text: str | bool, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({key: text}, None, env={})
    option = "--" + key.replace("_", "-")
    assert str(info.value).startswith(f"{option}={text}: invalid value for '{key}': ")
    assert message in str(info.value)


def test_size_options_from_the_command_line() -> None:
    """`--max-body-size 1GB` and friends get through argparse to the size parser (argparse's
    type=int refused them with its usage)."""
    args = vars(
        parser().parse_args(
            ["serve", "--max-body-size", "1GB", "--max-input-size=64Mi", "--http-port", "9100"]
        )
    )
    s = load_settings(args, None, env={})
    assert (s.max_body_size, s.max_input_size, s.http_port) == (10**9, 64 * 2**20, 9100)


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m v2proxy ARGS`` (with ``env``, else this process's), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "v2proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["serve", "--max-body-size", "lots"],
            "v2proxy: --max-body-size=lots: invalid value for 'max_body_size': expected a size:",
        ),
        (
            ["serve", "--http-port", "xyz"],
            "v2proxy: --http-port=xyz: invalid value for 'http_port': expected an integer",
        ),
        (
            ["serve", "--backend-timeout", "soon"],
            "v2proxy: --backend-timeout=soon: invalid value for 'backend_timeout': expected a"
            " positive number",
        ),
        (
            ["serve", "--client-shm", "maybe"],
            "v2proxy: --client-shm=maybe: invalid value for 'client_shm': must be one of off,"
            " local, on",
        ),
        (
            ["reference-server", "--log-level", "loud"],
            "v2proxy: --log-level=loud: invalid value for 'log_level': must be one of debug,",
        ),
        (["serve", "--no-such-option"], "v2proxy: unrecognized arguments: --no-such-option"),
        (
            ["serve", "--port", "9000"],
            "v2proxy: unrecognized arguments: --port 9000 (did you mean --http-port or"
            " --grpc-port?) (see v2proxy serve --help)",
        ),
        (
            ["serve", "--port=9000", "--wrkers", "2"],
            "v2proxy: unrecognized arguments: --port=9000 --wrkers 2 (--port: did you mean"
            " --http-port or --grpc-port?; --wrkers: did you mean --workers?) (see v2proxy"
            " serve --help)",
        ),
        (
            ["reference-server", "--http-prot", "8000"],
            "v2proxy: unrecognized arguments: --http-prot 8000 (did you mean --http-port?) (see"
            " v2proxy reference-server --help)",
        ),
        (["serve", "--http-port"], "v2proxy: argument --http-port: expected one argument"),
        (
            ["serve", "--max-shm-regions", "x"],
            "v2proxy: --max-shm-regions=x: invalid value for 'max_shm_regions'",
        ),
        (["inject", "--tls-cert", "c.pem"], "v2proxy: the following arguments are required:"),
    ],
)
def test_a_bad_command_line_is_one_line(args: list[str], line: str) -> None:
    """Exit status 2 and one line naming the option, without argparse's usage."""
    proc = _serve(*args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "usage:" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(line), proc.stderr


def test_top_help_lists_the_commands_and_where_their_options_are() -> None:
    proc = _serve("--help")
    assert proc.returncode == 0 and proc.stderr == ""
    for command in ("serve", "reference-server", "inject"):
        assert re.search(rf"\n    {command} +\w", proc.stdout), proc.stdout  # a line each
        assert f"  v2proxy {command} --help " in proc.stdout
    assert "docs/settings.md" in proc.stdout


def test_help_is_unchanged() -> None:
    proc = _serve("serve", "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: v2proxy serve [-h]")
    assert "--max-body-size SIZE" in proc.stdout and "--client-shm off|local|on" in proc.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "backend: builtin\nrestricted_api: [logging, trace\n",
            "at line 3, column 1: expected ',' or ']', but got '<stream end>' (while parsing a"
            " flow sequence that starts at line 2, column 17)",
        ),
        ("http_port: 1\n  grpc_port: 2\n", "at line 2, column 12: mapping values are not allowed"),
        ("mindie:\n\t- model\n", "at line 2, column 1: found character '\\t' that cannot"),
        ("host: a\nserver_name: \x01\n", "at line 2, column 14: character #x0001 is not allowed"),
    ],
)
def test_invalid_yaml_names_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    """Where the file stops being YAML, lines and columns from 1, as editors count them."""
    cfg = tmp_path / "x.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings({}, str(cfg), env={})
    assert str(info.value).startswith(f"config file {cfg} is not valid YAML {message}")
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ the environment


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "V2PROXY_BACKEND_TIMOUT",
            "V2PROXY_BACKEND_TIMOUT: unknown environment variable (did you mean"
            " V2PROXY_BACKEND_TIMEOUT? v2proxy reads V2PROXY_<OPTION> for each option of 'v2proxy"
            " serve --help', e.g. V2PROXY_HTTP_PORT, and V2PROXY_CONFIG)",
        ),
        (
            "V2PROXY_CONFG",
            "V2PROXY_CONFG: unknown environment variable (did you mean V2PROXY_CONFIG?",
        ),
        ("V2PROXY_LOGFORMAT", "(did you mean V2PROXY_LOG_FORMAT?"),
        ("V2PROXY_WORKERZ", "(did you mean V2PROXY_WORKERS?"),
        ("V2PROXY_COLOUR", "V2PROXY_COLOUR: unknown environment variable (v2proxy reads"),
    ],
)
def test_an_unknown_v2proxy_variable_is_refused(name: str, message: str) -> None:
    """A misspelt setting stops the start, naming it (was: silently ignored); not its value."""
    with pytest.raises(ConfigError) as info:
        load_settings({}, None, env={"PATH": "/bin", name: "s3cret"})
    assert message in str(info.value) and str(info.value).startswith(f"{name}: unknown")
    assert "s3cret" not in str(info.value) and "\n" not in str(info.value)


def test_other_variables_of_the_project_are_ignored() -> None:
    env = {name: "x" for name in OTHER_VARIABLES - {"V2PROXY_CONFIG"}}
    env |= {"V2PROXY_HTTP_PORT": "9100", "HOME": "/root", "v2proxy_lower": "x"}
    assert load_settings({}, None, env=env).http_port == 9100


def test_the_development_page_lists_the_other_variables() -> None:
    """They left ``serve --help`` for docs/development.md, which names each of them."""
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(V2PROXY_\w+)` \|", page, re.M))
    assert listed == OTHER_VARIABLES - {"V2PROXY_CONFIG"}


def test_every_v2proxy_variable_the_project_names_is_known() -> None:
    """Every V2PROXY_* name in the repository (code, Makefile, chart, docs) is a setting or one
    of OTHER_VARIABLES: a new tool's variable, inherited by the servers its tests start, would
    stop them. V2PROXY_CONFIGS and V2PROXY_COMMON are Python names of benchmarks/run.py;
    V2PROXY_BACKEND_TIMOUT is the docs' example of a misspelt setting that stops the start."""
    known = {f"V2PROXY_{key.upper()}" for key in PARSERS} | OTHER_VARIABLES
    known |= {"V2PROXY_CONFIGS", "V2PROXY_COMMON", "V2PROXY_BACKEND_TIMOUT"}
    pattern = r"V2PROXY_[A-Z0-9_]+(?![\w*])"  # not a prefix such as V2PROXY_PEER* in a comment
    found: dict[str, str] = {}
    for folder in ("src", "tests", "benchmarks", "tools", "deploy", "helm", "config", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if (
                not path.is_file()
                or path.suffix in (".pyc", ".so", ".png", ".bin")
                or ".egg-info" in str(path)
                or path == Path(__file__)
            ):
                continue
            for name in re.findall(pattern, path.read_text(errors="replace")):
                found.setdefault(name, str(path.relative_to(ROOT)))
    for name in ("Makefile", "Dockerfile", "README.md"):
        for found_name in re.findall(pattern, (ROOT / name).read_text()):
            found.setdefault(found_name, name)
    assert {name: where for name, where in found.items() if name not in known} == {}


def test_serve_refuses_a_misspelt_variable_and_reference_server_reads_none() -> None:
    env = os.environ | {"V2PROXY_BACKEND_TIMOUT": "5"}
    proc = _serve("serve", "--http-port", "x", env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "v2proxy: V2PROXY_BACKEND_TIMOUT: unknown environment variable (did you mean"
    )
    assert proc.stderr.count("\n") == 1
    proc = _serve("reference-server", "--http-port", "x", env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("v2proxy: --http-port=x: invalid value for 'http_port'")


# ------------------------------------------------------------------ the backend's URL


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1", "has no port: give host:port, e.g. http://127.0.0.1:8000"),
        ("grpc://triton.svc/", "has no port: give host:port, e.g. grpc://triton.svc:8001"),
        ("mindies://[::1]", "has no port: give host:port, e.g. mindies://[::1]:1025"),
        ("grpcs://h:abc", "port 'abc' is not a port number 1..65535 (e.g. grpcs://h:8001)"),
        ("https://h:0", "port '0' is not a port number 1..65535 (e.g. https://h:8000)"),
        ("http://h:70000", "port '70000' is not a port number 1..65535 (e.g. http://h:8000)"),
        ("tcp://h:1", "must be 'builtin', http://host:port or https://host:port"),
        # several endpoints: each with its port, each once, never for MindIE
        ("grpc://a:8001,b", "has no port: give host:port, e.g. grpc://b:8001"),
        ("http://a:8000,,b:8000", "has an empty host in '': e.g. http://host:8000"),
        ("http://a:8000,b:x", "port 'x' is not a port number 1..65535 (e.g. http://b:8000)"),
        ("grpc://a:8001,a:8001", "names one host:port more than once"),
        ("mindie://a:1025,b:1025", "names several host:port: a MindIE backend is one server"),
    ],
)
def test_a_backend_url_without_a_port_says_so(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"backend": url}, None, env={})
    assert str(info.value).startswith(f"--backend={url}: invalid value for 'backend': {message}")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("builtin", "builtin"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("https://triton:8443", "https://triton:8443"),
        ("grpc://127.0.0.1:8001", "grpc://127.0.0.1:8001"),
        ("grpcs://triton:8001", "grpcs://triton:8001"),
        ("mindie://127.0.0.1:1025", "mindie://127.0.0.1:1025"),
        ("mindies://[::1]:1025", "mindies://[::1]:1025"),
        ("grpc://10.0.0.1:8001,10.0.0.2:8001", "grpc://10.0.0.1:8001,10.0.0.2:8001"),
        ("http://a:8000,[::1]:8000/v/", "http://a:8000,[::1]:8000/v"),
    ],
)
def test_the_backend_is_shown_with_its_scheme(url: str, shown: str) -> None:
    """What the start-up line shows (grpc and mindie URLs are kept as host:port)."""
    assert load_settings({"backend": url}, None, env={}).backend.display == shown
