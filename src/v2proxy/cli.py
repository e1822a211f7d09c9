"""Command-line parsing only: ``v2proxy serve``, ``v2proxy reference-server`` and ``v2proxy
inject`` (the admission webhook; its options live in v2proxy.inject.command)."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from v2proxy import __version__
from v2proxy.inject.command import add_parser as add_inject_parser
from v2proxy.ops.config import load_settings
from v2proxy.ops.config_sections import ConfigError
from v2proxy.ops.config_spec import (
    DEFAULTS,
    REFERENCE_SERVER,
    SETTINGS,
    SettingSpec,
    grouped,
    reference_server_default,
    serve_options,
    show,
)

#: what a size option takes (v2proxy.ops.config_values.byte_size: K, M, G powers of 1000, Ki, Mi, Gi
#: powers of 1024, B optional)
_SIZE = "bytes, or with a unit: 512K, 64Mi, 1G, 1GiB"


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line ``v2proxy: <message>`` (exit status 2) instead of
    the usage followed by the error; the subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        self.exit(2, f"v2proxy: {line} (see {self.prog} --help)\n")


def did_you_mean(word: str, known: Sequence[str]) -> str:
    """``did you mean --http-port or --grpc-port?`` for ``--port``, or ``""``: the closest of
    ``known`` to ``word`` (an option, a key)."""
    score = {k: difflib.SequenceMatcher(None, word, k).ratio() for k in known}
    best = max(score.values(), default=0.0)
    close = [k for k in known if score[k] >= max(0.6, best - 0.02)][:2]  # ties: both
    return f"did you mean {' or '.join(close)}?" if close else ""


def _unrecognized(command: argparse.ArgumentParser, extra: list[str]) -> NoReturn:
    """Refuse what ``command``'s parser did not know, naming the closest option of each word."""
    known = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
    words = [w.split("=", 1)[0] for w in extra if w.startswith("--")]
    hints = [(w, h) for w in words if (h := did_you_mean(w, known))]
    shown = hints[0][1] if len(hints) == 1 else "; ".join(f"{w}: {h}" for w, h in hints)
    command.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({shown})" * bool(hints)))


def option_help(spec: SettingSpec, default: Any) -> str:
    """The help of ``spec``'s option: its meaning, then ``(default: ...)`` rendered from
    ``default`` (a SIZE option says its units first)."""
    units = f"{_SIZE}; " if spec.metavar == "SIZE" else ""
    return f"{spec.help} ({units}default: {show(spec, default)})"


def _add(p: argparse._ActionsContainer, spec: SettingSpec, default: Any) -> None:
    """``spec``'s option, taken as text (None: not given), parsed later by load_settings."""
    extra: dict[str, Any] = {"nargs": "?", "const": spec.bare} if spec.bare is not None else {}
    p.add_argument(spec.option, metavar=spec.metavar, help=option_help(spec, default), **extra)


class _TopFormatter(argparse.RawDescriptionHelpFormatter):
    """The top help: the description and epilog as written, each command on one line."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=26, width=100)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        for command in getattr(action, "_choices_actions", ()):  # indented 4 under COMMAND
            self._action_max_length = max(self._action_max_length, len(command.dest) + 6)


_TOP_HELP = """\
v2proxy: a sidecar that makes every KServe v2 / Open Inference Protocol client
work with every model server (Triton, KServe ModelServer, MLServer, ...). It
sits beside the model server and transcodes between JSON, binary tensors, raw
bodies and gRPC, adds what the backend lacks (classification, binary tensors)
and exports Prometheus metrics on /metrics."""

_TOP_EPILOG = """\
Each command lists its own options:
  v2proxy serve --help              the proxy's options; each is also a YAML key
                                    of --config FILE and a variable V2PROXY_<NAME>
                                    (all listed in docs/settings.md)
  v2proxy reference-server --help   the standalone server's (HTTP 8000, gRPC 8001)
  v2proxy inject --help             the admission webhook's

Try it: 'v2proxy serve' serves the builtin demo models on :9000 (REST) and
:9001 (gRPC); 'v2proxy reference-server', then 'v2proxy serve --backend
http://127.0.0.1:8000', puts the proxy in front of a separate v2 server."""


def _add_groups(
    p: argparse.ArgumentParser,
    specs: tuple[SettingSpec, ...],
    default: Callable[[SettingSpec], Any],
) -> None:
    """``specs``' options in argument groups (v2proxy.ops.config_spec.OPTION_GROUPS)."""
    for group, members in grouped(specs):
        section = p.add_argument_group(group.title, group.about or None)
        for spec in members:
            _add(section, spec, default(spec))


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog="v2proxy",
        formatter_class=_TopFormatter,
        description=_TOP_HELP,
        epilog=_TOP_EPILOG,
    )
    top.add_argument("--version", action="version", version=f"v2proxy {__version__}")
    sub = top.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the proxy in front of a model server",
        description="Run the proxy in front of a model server. Every option is also a YAML key"
        f" of --config FILE (http_port: {DEFAULTS['http_port']}) and an environment variable"
        " (V2PROXY_HTTP_PORT); command line > environment > file > defaults (all listed, with"
        " their environment variables and YAML keys, in docs/settings.md). A SIZE is"
        " a number of bytes or a number with a unit: K, M, G, T are powers of 1000, Ki, Mi, Gi,"
        " Ti powers of 1024, B optional (512K, 64Mi, 1GB, 1GiB), in every source. Any other"
        " V2PROXY_* variable stops the start (a misspelt setting), except V2PROXY_CONFIG and"
        " those of v2proxy's own tests and benchmarks (docs/development.md), which are ignored.",
    )
    _add_groups(serve, serve_options(), lambda spec: spec.default)

    ref = sub.add_parser(
        "reference-server",
        help="the builtin models as a standalone v2 server (HTTP 8000, gRPC 8001)",
        description="Serve the builtin reference models as a standalone v2 server (REST with"
        " binary tensors, gRPC). Environment variables are not read.",
    )
    shared = tuple(spec for spec in SETTINGS if not spec.serve_only)
    _add_groups(ref, shared, reference_server_default)
    add_inject_parser(sub, __version__)
    return top


def _subcommands(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, by name."""
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    parsed, extra = top.parse_known_args(argv)
    args = vars(parsed)
    command = args.pop("command")
    if extra:
        _unrecognized(_subcommands(top)[command], extra)
    if command == "inject":
        from v2proxy.inject.command import main as inject_main

        return inject_main(args, __version__)
    try:
        if command == "reference-server":
            settings = load_settings(args, None, env={}, **REFERENCE_SERVER)
        else:
            settings = load_settings(args, args.get("config"))
    except ConfigError as exc:
        print(f"v2proxy: {exc}", file=sys.stderr)
        return 2
    from v2proxy.app import run

    run(settings, env_names=command != "reference-server")
    return 0
