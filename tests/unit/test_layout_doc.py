"""The "Layout" sections of docs/architecture.md (the whole tree) and README.md (its first level)
are generated from the source (tools/gen_layout.py): each committed block is what the generator
writes now, so a module added, moved or renamed, or a
docstring whose first sentence changed, fails here until the block is rewritten."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_layout", ROOT / "tools" / "gen_layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layout_block_is_what_the_generator_writes() -> None:
    gen = _generator()
    page = PAGE.read_text(encoding="utf-8")
    wanted = gen.page_with(gen.render(), page)
    diff = "\n".join(
        difflib.unified_diff(
            page.splitlines(), wanted.splitlines(), "committed", "generated", lineterm=""
        )
    )
    assert page == wanted, (
        "docs/architecture.md's layout is stale: run .venv/bin/python tools/gen_layout.py"
        " --write\n" + diff[:4000]
    )


def test_the_block_lists_every_package_within_the_line_length() -> None:
    gen = _generator()
    block = gen.render()
    lines = block.splitlines()[1:-1]
    too_long = [line for line in lines if len(line) > gen.WIDTH]
    assert too_long == []
    names = {line.split()[0] for line in lines}
    packages = {p.parent.name + "/" for p in (ROOT / "src" / "v2proxy").rglob("__init__.py")}
    assert packages - {"v2proxy/"} <= names
    assert {"regions.py", "stages/", "headers.py", "config.py", "tests/", "Dockerfile"} <= names


def test_a_stale_block_is_found() -> None:
    gen = _generator()
    page = PAGE.read_text(encoding="utf-8")
    stale = gen.page_with("```\nsrc/v2proxy/\n```\n", page)
    assert stale != page
    assert gen.page_with(gen.render(), stale) == gen.page_with(gen.render(), page)


def test_the_readme_block_is_the_first_level_of_the_tree() -> None:
    gen = _generator()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    overview = gen.render_overview()
    assert readme == gen.page_with(overview, readme), (
        "README.md's layout is stale: run .venv/bin/python tools/gen_layout.py --write"
    )
    tree = gen.render().splitlines()
    packages = overview.splitlines()[2:-1]  # after the fence and the root's line
    assert packages and all(line in tree for line in packages)  # the tree's own lines
    assert [line.split()[0] for line in packages][:3] == ["core/", "codecs/", "ops/"]
    assert "pipeline.py" not in overview  # the first level only
