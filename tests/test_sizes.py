"""scripts/sizes.py reports class and module sizes as `ast` measures them, and `--check` fails while a
class is over 400 lines or a module over 500 (issue 68; issue 40 set 500 and 600)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "sizes.py"
ROW = re.compile(r"^\s+(\d+)\s+(\S+\.py)(?:\s+(\S+))?$")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def class_sizes() -> list[tuple[int, str, str]]:
    """(lines, path, simple name) of every class in the package, measured here on its own."""
    out = []
    for path in (ROOT / "mfs_nb").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                out.append((node.end_lineno - node.lineno + 1, path.relative_to(ROOT).as_posix(), node.name))
    return out


def module_sizes() -> dict[str, int]:
    with_lines = {}
    for path in (ROOT / "mfs_nb").rglob("*.py"):
        with open(path, "rb") as f:
            with_lines[path.relative_to(ROOT).as_posix()] = sum(1 for _ in f)
    return with_lines


def test_lists_the_biggest_classes_and_modules_with_their_real_sizes():
    done = run()
    assert done.returncode == 0, done.stderr
    classes, modules = [], []
    for line in done.stdout.splitlines():
        m = ROW.match(line)
        if m:
            (classes if m.group(3) else modules).append((int(m.group(1)), m.group(2), m.group(3)))

    everything = class_sizes()
    assert len(classes) == min(15, len(everything))
    assert [c[0] for c in classes] == sorted((c[0] for c in everything), reverse=True)[:15]
    for lines, path, name in classes:
        assert (lines, path, name.rsplit(".", 1)[-1]) in everything

    real = module_sizes()
    assert sorted(modules) == sorted((n, p, None) for p, n in real.items() if n > 500)


def test_check_holds_for_the_package_and_fails_for_a_class_or_module_over_the_limit(tmp_path):
    over = any(c[0] > 400 for c in class_sizes()) or any(n > 500 for n in module_sizes().values())
    assert not over, "a class over 400 lines or a module over 500: split it (issue 68)"
    assert run("--check").returncode == 0
    body = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(170))  # 511 lines
    (tmp_path / "big.py").write_text(f"class Big:\n{body}")
    done = run("--check", "--package", str(tmp_path))
    assert done.returncode != 0 and "Big" in done.stdout, done.stdout
    (tmp_path / "big.py").write_text("x = 1\n" * 601)
    done = run("--check", "--package", str(tmp_path))
    assert done.returncode != 0 and "1 module(s) over 500 lines" in done.stdout, done.stdout
