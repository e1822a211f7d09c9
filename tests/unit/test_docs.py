"""The documentation: the site under docs/ builds with ``mkdocs build --strict`` (a broken link
or anchor, or a page missing from the nav of mkdocs.yml, fails it), and the code cites only
documents that are in the repository (docs/ pages that exist), never the engineers' notes beside
it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: a document cited by its file name (``NAME.md``, with or without a folder): it must be a file
#: of the repository (a name in quotes is a file the code writes, not a citation)
MD_CITED = re.compile(r"(?<![\w/.\"'-])[\w./-]*[\w-]\.md\b")
#: a section sign cites sections of a document: the RFC its file names, else nothing can
#: tell which document, and the citation is refused
SECTION = "\u00a7"
#: a docs/ page cited by path
DOCS_PATH = re.compile(r"\bdocs/[\w./-]*\.md\b")
SKIPPED_SUFFIXES = {".pyc", ".so", ".bin", ".png"}


def _cited_text() -> list[tuple[Path, str]]:
    """Every text file of src/ and tests/ (not this one), and the README."""
    found = [(ROOT / "README.md", (ROOT / "README.md").read_text(encoding="utf-8"))]
    for folder in ("src", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if (
                not path.is_file()
                or path.suffix in SKIPPED_SUFFIXES
                or "__pycache__" in parts
                or any(part.endswith(".egg-info") for part in parts)
                or path.is_relative_to(ROOT / "tests" / "fuzz" / "corpus")
                or path == Path(__file__).resolve()
            ):
                continue
            found.append((path, path.read_text(encoding="utf-8", errors="replace")))
    return found


def test_site_builds_strict(tmp_path: Path) -> None:
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    command += ["--config-file", str(ROOT / "mkdocs.yml")]
    done = subprocess.run(
        command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert warnings == [], output
    assert (site / "index.html").is_file()
    assert (site / "protocol" / "index.html").is_file()


def _repo_markdown() -> tuple[set[str], set[str]]:
    """The repository's Markdown files: their paths (from the root) and their names."""
    paths = {
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*.md")
        if not set(p.relative_to(ROOT).parts) & {".venv", ".cache", "node_modules", "site"}
    }
    return paths, {p.rsplit("/", 1)[-1] for p in paths}


def test_code_cites_no_document_outside_the_repository() -> None:
    """Every Markdown document the code names is one of the repository's (by path, or by name
    when cited without its folder), and a section sign comes only with an RFC it belongs to."""
    paths, names = _repo_markdown()
    outside = []
    for path, text in _cited_text():
        where = path.relative_to(ROOT)
        for m in MD_CITED.finditer(text):
            cited = m.group(0).lstrip("./")
            known = cited in paths or ("/" not in cited and cited in names)
            if not known and not any(p.endswith("/" + cited) for p in paths):
                outside.append(f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {cited}")
        if SECTION in text and not re.search(r"\bRFC ?\d+", text):
            line = text.count(chr(10), 0, text.index(SECTION)) + 1
            outside.append(f"{where}:{line}: a section (\u00a7) of no document the file names")
    assert outside == [], "cite a page of docs/ instead:\n" + "\n".join(outside)


def test_cited_docs_pages_exist() -> None:
    cited = {
        (m.group(0), str(path.relative_to(ROOT)))
        for path, text in _cited_text()
        for m in DOCS_PATH.finditer(text)
    }
    assert cited, "nothing cites docs/: the pattern no longer matches"
    missing = sorted(f"{where}: {page}" for page, where in cited if not (ROOT / page).is_file())
    assert missing == []
