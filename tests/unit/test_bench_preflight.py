"""``benchmarks/run.py`` without the peer servers stops at once: exit status 2 and, whole
(never cut to the terminal's width), the command that builds them; and its results folder is
ignored by git, so a run leaves ``git status`` clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_without_the_peers_exits_non_zero_with_its_whole_hint(tmp_path: Path) -> None:
    env = os.environ | {"V2PROXY_PEERS_DIR": str(tmp_path), "COLUMNS": "40"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    for peer in ("mlserver", "triton"):
        assert (
            f"cannot run the benchmark: {peer}: no complete venv at {tmp_path / peer}; run: make"
            f" peers (or bash tests/interop/peers/setup_peers.sh {tmp_path})\n"
        ) in proc.stderr
    assert not (tmp_path / "benchmarks").exists()


def test_the_results_folder_is_ignored_by_git() -> None:
    names = ["benchmarks/results/latest.md", "benchmarks/results/latest.json"]
    names += ["benchmarks/results/soak.md", "benchmarks/results/soak.json"]
    proc = subprocess.run(
        ["git", "check-ignore", *names], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.stdout.split() == names
    tracked = subprocess.run(
        ["git", "ls-files", "benchmarks/results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert tracked.stdout == ""
