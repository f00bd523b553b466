"""The wheel carries everything the installed package needs: widgets, prompts, the CLI entry point."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_front_end_files_and_prompts(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = next(tmp_path.glob("mfs_nb-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for front in (ROOT / "widgets").iterdir():
        assert f"mfs_nb/widgets/{front.name}" in names
    assert "mfs_nb/prompts/system.md" in names and "mfs_nb/data/o200k_cjk.txt" in names
    assert "mfs_nb/models/_encoder_child.py" in names  # run by path (offprocess), never imported: nothing else would notice
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mfs-nb = mfs_nb.commands.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    assert not any(n.startswith(("tests/", "examples/")) for n in names)
