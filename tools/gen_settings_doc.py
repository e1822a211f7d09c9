"""Write the settings reference, docs/settings.md, from the table of settings
(src/v2proxy/ops/config_spec.py: SETTINGS, CONFIG_OPTION, REFERENCE_SERVER), the ``mindie:`` keys
and the keys of one model of the ``openai:`` section (src/v2proxy/ops/config_sections.py:
MINDIE_KEYS, OPENAI_KEYS). The page is generated: edit those tables (or the prose here), then run

    .venv/bin/python tools/gen_settings_doc.py           # writes the page
    .venv/bin/python tools/gen_settings_doc.py --check   # exit status 1 when it is stale

tests/unit/test_settings_doc.py fails when the committed page differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from v2proxy.ops.config_sections import MINDIE_KEYS, OPENAI_KEYS
from v2proxy.ops.config_spec import (
    CONFIG_OPTION,
    DEFAULTS,
    SETTINGS,
    SettingSpec,
    grouped,
    reference_server_default,
    serve_options,
    show,
)
from v2proxy.ops.config_values import SIZE_UNITS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "settings.md"


def sentence(text: str) -> str:
    """A help text (lowercase first, no stop, as argparse shows it) as a sentence; a first word
    spelt with capitals (gRPC, PEM) is kept."""
    first = text.split(" ", 1)[0]
    return (text[:1].upper() + text[1:] if first.islower() else text) + "."


def para(text: str) -> str:
    """A paragraph wrapped at 100 columns (a list item's next lines indented under its text)."""
    indent = "  " if text.startswith("- ") else ""
    return textwrap.fill(
        text, 100, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def cell(text: str) -> str:
    """A table cell: one line, and no ``|`` (GitHub and Python-Markdown treat an escaped pipe in a
    code span differently; the help texts write choices with commas instead)."""
    if "|" in text or "\n" in text:
        raise ValueError(f"a table cell may hold no '|' nor newline: {text!r}")
    return text


def default_cell(spec: SettingSpec, value: object) -> str:
    """The default as :func:`show` writes it: in code when it is a value one could type."""
    text = show(spec, value)
    if value is None or spec.metavar in ("SIZE", "SECONDS"):
        return text
    return f"`{text}`"


def _options_tables() -> list[str]:
    """One table per group of ``serve --help`` (config_spec.OPTION_GROUPS), in its order."""
    lines: list[str] = []
    for group, members in grouped(serve_options()):
        about = f"{sentence(group.about)}" if group.about else ""
        lines += [f"### {group.title.capitalize()}", "", about, "", *_options_table(members), ""]
    return lines[:-1]


def _options_table(specs: list[SettingSpec]) -> list[str]:
    rows = [
        "| option | environment variable | YAML key | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for spec in specs:
        key = "—" if spec is CONFIG_OPTION else f"`{spec.name}`"
        # a choice's words are in the meaning
        option = f"`{spec.option}`" if "|" in spec.metavar else f"`{spec.option} {spec.metavar}`"
        rows.append(
            f"| {option} | `{spec.env}` | {key} | {cell(default_cell(spec, spec.default))}"
            f" | {cell(sentence(spec.help))} |"
        )
    return rows


def _reference_server() -> list[str]:
    own = ", ".join(f"`{s.option}`" for s in SETTINGS if s.serve_only)
    lines = [
        "## `v2proxy reference-server`",
        "",
        "`v2proxy reference-server` serves the builtin models as a standalone v2 server. It takes"
        f" the options above except the backend's ({own}) and `--config`, reads no environment"
        " variable and no file, and starts from other defaults:",
        "",
    ]
    for spec in SETTINGS:
        if spec.serve_only:
            continue
        value = reference_server_default(spec)
        if value != spec.default:
            lines.append(f"- `{spec.option}`: {default_cell(spec, value)}")
    return lines


def _keys_table(keys: tuple[SettingSpec, ...]) -> list[str]:
    """The table of a section's keys (``mindie:``, one model of ``openai.models``)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for spec in keys:
        rows.append(
            f"| `{spec.name}` | {cell(default_cell(spec, spec.default))}"
            f" | {cell(sentence(spec.help))} |"
        )
    return rows


def _units() -> list[str]:
    decimal = ", ".join(f"`{u}`" for u, n in SIZE_UNITS.items() if u and "I" not in u)
    binary = ", ".join(f"`{u[0]}i`" for u, n in SIZE_UNITS.items() if "I" in u)
    return [
        "## Values and units",
        "",
        f"- **Sizes** (`SIZE`): a number of bytes, or a number with a unit: {decimal} are powers"
        f" of 1000, {binary} powers of 1024; a trailing `B` is optional and case does not matter"
        " (`512K`, `64Mi`, `64 MiB`, `1GB`, `1GiB`, `1.5Gi`). A fraction must make whole bytes."
        " The same text is taken from every source. The defaults below are written with the"
        f" powers of 1024 (64 MiB is {64 * 2**20} bytes; 2 GiB - 1 is {2**31 - 1}).",
        "- **Durations** (`SECONDS`): a positive number of seconds; fractions are allowed (`2.5`).",
        "- **Switches** (`on|off`): `on` or `off`; `true`/`false`, `yes`/`no` and `1`/`0` too.",
        "- **Choices** (`a|b|c`): one of the words listed, in any case.",
        "- **Ports**: 0 to 65535.",
    ]


def render() -> str:
    """The whole page."""
    lines = [
        "# Settings reference",
        "",
        "<!-- Generated by tools/gen_settings_doc.py from src/v2proxy/ops/config_spec.py and"
        " src/v2proxy/ops/config_sections.py; do not edit by hand: edit those, then run"
        " `.venv/bin/python tools/gen_settings_doc.py`. -->",
        "",
        "Every setting of `v2proxy serve` has three names: a command-line option"
        " (`--http-port`), an environment variable `V2PROXY_<NAME>` (`V2PROXY_HTTP_PORT`) and a"
        " key of the YAML file given with `--config FILE` or `V2PROXY_CONFIG` (`http_port:"
        f" {DEFAULTS['http_port']}`; `http-port` is read the same). Where several sources give a"
        " setting, the first of these wins:",
        "",
        "1. the command line,",
        "2. the environment,",
        "3. the YAML file,",
        "4. the defaults below.",
        "",
        "The configuration is read and checked once, at start-up, and every source goes through"
        " the same parser. A bad value, an unknown key anywhere in the file or an unreadable"
        " label file stops the start with one line naming the key and where it came from (exit"
        " status 2), e.g. `v2proxy: --max-body-size=lots: invalid value for 'max_body_size':"
        " expected a size: ...`. An unknown `V2PROXY_*` variable (a misspelt setting, such as"
        " `V2PROXY_BACKEND_TIMOUT`) stops `v2proxy serve` the same way, naming the closest"
        " setting; the only others allowed are `V2PROXY_CONFIG` and those of the project's own"
        " tests and benchmarks, which the [development notes](development.md) list.",
        "",
        *_units(),
        "",
        "## Options of `v2proxy serve`",
        "",
        "`v2proxy serve --help` shows them in the same groups.",
        "",
        *_options_tables(),
        "",
        *_reference_server(),
        "",
        "## The `models:` section",
        "",
        "Per-model settings of the YAML file: `models: {NAME: {outputs: {OUTPUT: {labels:"
        " FILE}}}}` gives output `OUTPUT` of model `NAME` its class labels, used by the"
        " classification extension. A label file is UTF-8 (a byte-order mark is dropped), one"
        " label per line (`\\n` or `\\r\\n`); line *i* is class *i*, so blank lines inside"
        " count, and a file without any label is refused. A relative path is taken from the"
        " working directory when the file exists there, else from the config file's folder. No"
        " other key is allowed under a model or an output.",
        "",
        "```yaml",
        "models:",
        "  classifier:",
        "    outputs:",
        "      SCORES:",
        "        labels: config/labels/classifier.txt",
        "```",
        "",
        "## The `mindie:` section",
        "",
        "How MindIE's native `POST /infer` maps to a v2 model (see the MindIE part of the"
        " [protocol notes](protocol.md)). Keys are spelt with `_` or `-`; any other key is"
        " refused.",
        "",
        *_keys_table(MINDIE_KEYS),
        "",
        "## The `openai:` section",
        "",
        "The model ids of the OpenAI routes (`GET /v1/models`, `POST /v1/completions`,"
        " `POST /v1/chat/completions`) and the v2 model behind each (see the"
        " [OpenAI guide](guides/openai.md)). The section is one key, `models`, a mapping from"
        " each id (what clients send as `model`, listed by `GET /v1/models` in the file's"
        " order) to that id's keys: `openai: models: ID: KEY: VALUE`. It names at least one id;"
        " an id with no keys (`ID:` or `ID: {}`) is served by the v2 model of the same name with"
        " the defaults below. Keys are spelt with `_` or `-`; any other key, beside `models` or"
        " under an id, is refused, and so is `seed_input` with a profile other than `trtllm`."
        " A chat template file is read, compiled and tried on one user message at start-up: a"
        " template that fails stops the start, naming the file (and the line of a syntax"
        " error).",
        "",
        "Without the section the routes serve one id: the v2 model of the `mindie:` section,"
        " under its own name and with its `profile` and `seed_input`, else the model `llm` (the"
        " builtin toy LLM in front of the builtin models); the other keys take their defaults.",
        "",
        "```yaml",
        "openai:",
        "  models:",
        "    llama-3-8b:                 # the id clients send",
        "      model: ensemble           # the v2 model behind it",
        "      profile: trtllm",
        "      chat_template: /models/llama-3-8b/tokenizer_config.json",
        "      max_tokens: 256",
        "    llm:                        # the v2 model llm, under its own name",
        "```",
        "",
        *_keys_table(OPENAI_KEYS),
        "",
    ]
    return "\n".join(_wrapped(lines))


def _wrapped(lines: list[str]) -> list[str]:
    """Prose lines wrapped at 100 columns; table rows, headings and code blocks as they are."""
    out: list[str] = []
    fenced = False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        keep = fenced or line.startswith(("|", "#", "```")) or len(line) <= 100
        out.append(line if keep else para(line))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run tools/gen_settings_doc.py")
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
