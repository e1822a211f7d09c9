"""docs/settings.md is generated from the table of settings (tools/gen_settings_doc.py):
the committed page is what the generator writes now, and it shows every option of ``v2proxy serve
--help`` with the default the help shows."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from v2proxy.ops.config_spec import OPTION_GROUPS, serve_options

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "settings.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_settings_doc", ROOT / "tools" / "gen_settings_doc.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_what_the_generator_writes() -> None:
    written = PAGE.read_text(encoding="utf-8")
    wanted = _generator().render()
    diff = "\n".join(
        difflib.unified_diff(
            written.splitlines(), wanted.splitlines(), "committed", "generated", lineterm=""
        )
    )
    assert written == wanted, (
        "docs/settings.md is stale: run .venv/bin/python tools/gen_settings_doc.py\n" + diff[:4000]
    )


def _help_defaults(command: str) -> dict[str, str]:
    """``v2proxy COMMAND --help`` (one line per option: a wide terminal) -> option -> the text
    of its ``(... default: X)``."""
    env = os.environ | {"COLUMNS": "5000"}
    proc = subprocess.run(
        [sys.executable, "-m", "v2proxy", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    options = proc.stdout.split("\noptions:\n", 1)[1]
    # an option's lines start "  -", its help's next lines deeper; a group's title and its line
    # about it are dropped
    kept = [line for line in options.splitlines() if line.startswith(("  -", "    "))]
    entries = re.split(r"\n(?=  -)", "\n".join(kept))
    found: dict[str, str] = {}
    for entry in entries:
        text = " ".join(entry.split())
        name = text.split()[0].rstrip(",")
        if name == "-h":
            continue
        match = re.search(r"default: ([^()]*)\)$", text)
        assert match, f"{command} --help: {name} shows no default: {text}"
        found[name] = match.group(1)
    return found


def _page_rows() -> dict[str, str]:
    """The page's table of options -> option -> its default (code marks dropped)."""
    section = PAGE.read_text(encoding="utf-8").split("## Options of `v2proxy serve`", 1)[1]
    rows: dict[str, str] = {}
    for line in section.split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `--"):
            continue
        option = cells[0].strip("`").split()[0]
        rows[option] = cells[3].replace("`", "")
    return rows


def test_every_option_of_serve_help_is_on_the_page_with_its_default() -> None:
    shown = _help_defaults("serve")
    rows = _page_rows()
    assert len(shown) > 30
    assert sorted(rows) == sorted(shown)
    assert {o: rows[o] for o in shown if rows[o] != shown[o]} == {}
    # sizes read as sizes, in both
    assert shown["--max-input-size"] == "64 MiB"
    assert shown["--backend-shm-threshold"] == "64 KiB"


def _help_groups(command: str) -> dict[str, list[str]]:
    """``v2proxy COMMAND --help``'s argument groups -> the options under each."""
    env = os.environ | {"COLUMNS": "5000"}
    out = subprocess.run(
        [sys.executable, "-m", "v2proxy", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    ).stdout
    groups: dict[str, list[str]] = {}
    title = ""
    for line in out.split("\noptions:\n", 1)[1].splitlines():
        if line.endswith(":") and not line.startswith(" "):
            title = line[:-1]
            groups[title] = []
        elif line.startswith("  --") and title:
            groups[title].append(line.split()[0])
    return groups


def test_every_setting_is_placed_in_a_group() -> None:
    """A new setting must be put in one of OPTION_GROUPS (its place in --help and on the page)."""
    names = [spec.name for spec in serve_options()]
    placed = [n for g in OPTION_GROUPS for n in g.names]
    assert sorted(placed) == sorted(set(placed)), "a setting is in two groups"
    assert sorted(set(names) - set(placed)) == [], "place these in config_spec.OPTION_GROUPS"
    assert sorted(set(placed) - set(names)) == [], "no such settings"


def test_serve_help_shows_the_groups_of_the_page() -> None:
    groups = _help_groups("serve")
    assert list(groups) == [g.title for g in OPTION_GROUPS]
    assert groups["listening"][:2] == ["--http-port", "--grpc-port"]
    assert groups["backend"][0] == "--backend" and "--config" in groups[OPTION_GROUPS[-1].title]
    page = PAGE.read_text(encoding="utf-8")
    for group in OPTION_GROUPS:
        assert f"\n### {group.title.capitalize()}\n" in page
    assert "other" not in groups
    reference = _help_groups("reference-server")
    assert all("--backend" not in options for options in reference.values())
    assert "listening" in reference


def test_reference_server_defaults_are_the_page_s() -> None:
    """Each option of ``reference-server --help`` has serve's default, or is listed under
    reference-server on the page with its own."""
    serve = _help_defaults("serve")
    page = PAGE.read_text(encoding="utf-8")
    differ = {}
    for option, default in _help_defaults("reference-server").items():
        if serve[option] != default:
            differ[option] = default
            assert f"- `{option}`: `{default}`" in page or f"- `{option}`: {default}" in page
    assert differ == {"--http-port": "8000", "--grpc-port": "8001", "--restricted-api": "none"}
