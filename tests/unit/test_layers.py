"""The layer rule (docs/architecture.md, layers), checked in the suite and by `make layers`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_layers.py"


def test_pure_layers_import_no_io() -> None:
    proc = subprocess.run(
        [sys.executable, str(TOOL)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout
    assert "pure layers: clean" in proc.stdout
