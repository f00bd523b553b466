"""Print the biggest classes and modules of the package, and check them against the size limits.

    python scripts/sizes.py                 # the 15 biggest classes, every module over 500 lines
    python scripts/sizes.py --min 300 --top 0   # every class over 300 lines
    python scripts/sizes.py --check         # exit 1 while a class is over 400 lines or a module over 500

A class's size is its lines from the `class` statement to its last line (`ast` `end_lineno`), nested
classes counted on their own too; a module's size is its number of lines. The limits are issue 40's:
no class over 400 lines, no module over 500 (issue 68; 500 and 600 before).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASS_LIMIT, MODULE_LIMIT = 400, 500


def modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "node_modules" not in p.parts)


def module_lines(path: Path) -> int:
    data = path.read_bytes()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def classes(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every class in `tree`, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            name = prefix + node.name
            yield name, node.end_lineno - node.lineno + 1
            yield from classes(node, name + ".")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from classes(node, prefix + node.name + ".<locals>.")
        else:
            yield from classes(node, prefix)


def measure(package: Path) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """([(lines, module path, class name)], [(lines, module path)]), biggest first."""
    found_classes, found_modules = [], []
    for path in modules(package):
        rel = path.relative_to(package.parent).as_posix()
        found_modules.append((module_lines(path), rel))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found_classes += [(lines, rel, name) for name, lines in classes(tree)]
    found_classes.sort(key=lambda x: (-x[0], x[1], x[2]))
    found_modules.sort(key=lambda x: (-x[0], x[1]))
    return found_classes, found_modules


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min", type=int, default=0, help="list classes over this many lines (default 0: all)")
    ap.add_argument("--top", type=int, default=15, help="list at most this many classes (0: no limit; default 15)")
    ap.add_argument("--check", action="store_true",
                    help=f"exit 1 when a class is over {CLASS_LIMIT} lines or a module over {MODULE_LIMIT}")
    ap.add_argument("--package", type=Path, default=ROOT / "mfs_nb", help="the package folder (default: mfs_nb)")
    args = ap.parse_args(argv)

    all_classes, all_modules = measure(args.package)
    shown = [c for c in all_classes if c[0] > args.min]
    if args.top > 0:
        shown = shown[:args.top]
    print(f"classes over {args.min} lines, biggest first ({len(shown)} of {len(all_classes)}):")
    for lines, rel, name in shown:
        print(f"  {lines:6d}  {rel}  {name}")
    big_modules = [m for m in all_modules if m[0] > MODULE_LIMIT]
    print(f"modules over {MODULE_LIMIT} lines ({len(big_modules)} of {len(all_modules)}):")
    for lines, rel in big_modules:
        print(f"  {lines:6d}  {rel}")

    big_classes = [c for c in all_classes if c[0] > CLASS_LIMIT]
    named = ", ".join(f"{name} ({lines})" for lines, _, name in big_classes)
    print(f"over the limits: {len(big_classes)} class(es) over {CLASS_LIMIT} lines"
          + (f": {named}" if named else "") + f"; {len(big_modules)} module(s) over {MODULE_LIMIT} lines")
    if args.check and (big_classes or big_modules):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
