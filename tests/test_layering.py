"""The package's layering, read from the source's imports (every one, including those inside
functions; those under `if TYPE_CHECKING:` only name types: they count for cycles only):

- the pure modules touch no storage, network or notebook: they import none of the store, the model
  client, the embedder, the notebook or the session, and no third-party library that does;
- only the `store/` package imports LanceDB or pyarrow;
- only the front ends (`notebook/`, `bench/`, `cli`, `replay`, `demo`, `importer`, `mcp_server`, the package
  root's lazy export)
  import the `session` package;
- no two modules import each other, directly or through others, not even to name a type;
- no module takes a private (`_name`) name from another: what another module needs is public.

`docs/architecture.md` says the same in words and lists every module; a test here holds it to that."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import mfs_nb

ROOT = Path(mfs_nb.__file__).parent
DOCS = ROOT.parent / "docs" / "architecture.md"

# the memory logic that the property tests exercise: text in, text out
PURE = {"events", "layers.view", "window.tokens", "window.usage", "recall.tools", "layers.clearing", "layers.facts", "layers.segments", "layers.origin", "window.meter",
        "recall.ranking", "recall.dates", "layers.fact_track", "layers.knowledge", "layers.workset", "lang", "recall.rows", "commands.transcripts", "commands.accounts", "redaction", "compaction.coldrange",
        "compaction.consolidation", "compaction.terminal", "compaction.summary_check"}
# what a pure module may not reach, inside the package or outside it
IMPURE_PACKAGES = ("store", "session", "notebook", "ui", "bench", "models.llm", "models.offline", "models.embed", "recall.indexer", "recall.searcher",
                   "layers.track", "layers.snapshots", "store.quiet", "models.offprocess", "models._encoder_child", "commands.cli", "store.doctor", "commands.export", "commands.replay", "commands.demo", "models.cost", "commands.importer", "commands.mcp_server",
                   "models.prompt_cache", "host", "compaction.compactor", "compaction.lease", "compaction.protocol")
IMPURE_LIBRARIES = ("lancedb", "pyarrow", "litellm", "IPython", "ipywidgets", "anywidget", "requests", "httpx",
                    "urllib", "socket", "sentence_transformers", "torch", "boto3", "mcp", "uvicorn", "starlette")
FRONT_ENDS = ("notebook", "bench", "commands.cli", "commands.replay", "commands.demo", "commands.importer", "commands.mcp_server", "")  # "" is the package root's lazy export


def module_name(rel: str) -> str:
    """`store/core.py` → `store.core`; `store/__init__.py` → `store`; `__init__.py` → ``."""
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def sources() -> dict[str, str]:
    return {module_name(p.relative_to(ROOT).as_posix()): p.read_text(encoding="utf-8")
            for p in sorted(ROOT.rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:`."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def imports(name: str, text: str, modules: set[str], types: bool = False) -> tuple[set[str], set[str]]:
    """(modules of this package, top-level outside libraries) that module `name` imports at run time, or
    with `types` those that only name types too."""
    tree = ast.parse(text)
    skip = set() if types else _type_checking_only(tree)
    parts = name.split(".") if name else []  # the package root's relative imports start at the root
    package = parts if _is_package(name, text, modules) else parts[:-1]
    inside: set[str] = set()
    outside: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mfs_nb":
                    inside.add(alias.name.removeprefix("mfs_nb").lstrip("."))
                else:
                    outside.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "mfs_nb":
                target = (node.module or "").removeprefix("mfs_nb").lstrip(".")
            else:
                outside.add((node.module or "").split(".")[0])
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                inside.add(sub if sub in modules else target)
    return {m for m in inside if m in modules and m != name}, outside


def private_imports(text: str) -> list[str]:
    """`from <a module of the package> import _name` statements: what another module needs is public."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "mfs_nb"):
            names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if names:
                out.append(f"from {'.' * node.level}{node.module or ''} import {', '.join(names)}")
    return out


def _is_package(name: str, text: str, modules: set[str]) -> bool:
    return any(m.startswith(name + ".") for m in modules) or name == ""


def graph(srcs: dict[str, str], types: bool = False) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = set(srcs)
    inside, outside = {}, {}
    for name, text in srcs.items():
        inside[name], outside[name] = imports(name, text, modules, types)
    return inside, outside


def _under(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots if r) or ("" in roots and module == "")


def violations(srcs: dict[str, str]) -> list[str]:
    """Every broken rule, one line each (empty when the layering holds)."""
    inside, outside = graph(srcs)
    out = []
    for name in sorted(PURE & set(srcs)):
        for target in sorted(inside[name]):
            if _under(target, IMPURE_PACKAGES):
                out.append(f"pure module {name} imports {target}")
        for lib in sorted(outside[name] & set(IMPURE_LIBRARIES)):
            out.append(f"pure module {name} imports {lib}")
    for name in sorted(srcs):
        if not _under(name, ("store",)):
            for lib in sorted(outside[name] & {"lancedb", "pyarrow"}):
                out.append(f"{name or 'mfs_nb'} imports {lib}: only the store package does")
        if not _under(name, FRONT_ENDS) and not _under(name, ("session",)):
            for target in sorted(inside[name]):
                if _under(target, ("session",)):
                    out.append(f"{name or 'mfs_nb'} imports {target}: only the front ends use the Session")
    for name in sorted(srcs):
        for line in private_imports(srcs[name]):
            out.append(f"{name or 'mfs_nb'} imports a private name: {line}")
    # a cycle: a module that reaches itself, imports that only name types included (package roots
    # re-exporting their own parts are left out)
    inside = graph(srcs, types=True)[0]
    for name in sorted(srcs):
        seen, stack = set(), [t for t in inside[name] if not _under(name, (t,))]
        while stack:
            node = stack.pop()
            if node == name:
                out.append(f"{name} imports itself through other modules")
                break
            if node in seen or _under(name, (node,)):
                continue
            seen.add(node)
            stack += [t for t in inside.get(node, ()) if not _under(node, (t,))]
    return out


def test_the_package_keeps_its_layers():
    assert violations(sources()) == []


def test_the_check_fails_when_a_pure_module_reaches_the_store_or_the_session():
    srcs = sources()
    broken = dict(srcs)
    broken["layers.view"] = srcs["layers.view"] + "\n\ndef _leak():\n    from ..store import Store\n    return Store\n"
    assert "pure module layers.view imports store" in violations(broken)
    broken = dict(srcs)
    broken["layers.segments"] = "import lancedb\n" + srcs["layers.segments"]
    found = violations(broken)
    assert "pure module layers.segments imports lancedb" in found
    assert "layers.segments imports lancedb: only the store package does" in found
    broken = dict(srcs)
    broken["compaction.coldrange"] = "from ..session import Session\n" + srcs["compaction.coldrange"]
    found = violations(broken)
    assert "compaction.coldrange imports session: only the front ends use the Session" in found
    assert "pure module compaction.coldrange imports session" in found
    broken = dict(srcs)  # a cycle hidden inside a function
    broken["events"] = srcs["events"] + "\n\ndef _late():\n    from .layers.view import project\n    return project\n"
    assert "events imports itself through other modules" in violations(broken)
    broken = dict(srcs)  # a private name taken from another module
    broken["layers.view"] = "from ..window.tokens import _CLASS\n" + srcs["layers.view"]
    assert "layers.view imports a private name: from ..window.tokens import _CLASS" in violations(broken)
    broken = dict(srcs)  # a cycle through an import that only names a type
    broken["window.tokens"] = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..layers.view import SendView\n"
                               + srcs["window.tokens"])
    assert "window.tokens imports itself through other modules" in violations(broken)
    # imports that only name types do not break the layers
    broken = dict(srcs)
    broken["layers.view"] = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..store import Store\n"
                      + srcs["layers.view"])
    assert violations(broken) == []


ROW = re.compile(r"^\| `([a-z0-9_.]+)` \| (.*) \| ([^|]*) \|$", re.M)


def imports_cell(name: str, inside: dict[str, set[str]]) -> str:
    """The table's imports column for `name`: the package's modules it imports at run time (its own
    parts shown as such), else "stdlib and outside libraries only"."""
    deps = sorted(inside[name])
    own = [d for d in deps if d.startswith(name + ".")] if name else []
    rest = [d for d in deps if d not in own]
    cell = ", ".join(f"`{d}`" for d in rest)
    if own:
        cell = (cell + "; " if cell else "") + "its parts"
    return cell or "—"


def architecture_rows(text: str, inside: dict[str, set[str]] | None = None) -> str:
    """docs/architecture.md with every table row's imports column as the source says."""
    inside = graph(sources())[0] if inside is None else inside
    def row(m: re.Match) -> str:
        name = _listed(m[1])
        return f"| `{m[1]}` | {m[2]} | {imports_cell(name, inside)} |" if name in inside else m[0]
    return ROW.sub(row, text)


def _listed(cell: str) -> str:
    """A table row's module: `__init__` is the package root."""
    return "" if cell == "__init__" else cell


def test_every_module_is_in_the_architecture_page_with_its_imports():
    """`python tests/test_layering.py --write` rewrites the imports column from the source."""
    text = DOCS.read_text(encoding="utf-8")
    listed = {_listed(m[1]) for m in ROW.finditer(text)}
    missing = sorted(m for m in sources() if m and m not in listed)
    assert missing == [], f"modules not in docs/architecture.md's table: {missing}"
    inside = graph(sources())[0]
    stale = [m[1] for m in ROW.finditer(text) if m[0] != architecture_rows(m[0], inside)]
    assert stale == [], f"imports column out of date for {stale}: run python tests/test_layering.py --write"
    gone = sorted(listed - set(sources()))
    assert gone == [], f"docs/architecture.md lists modules that are not in the package: {gone}"



def test_no_comment_points_outside_the_repository():
    """Design references point at docs/architecture.md; a clone has no ../shared."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"DESIGN(\.md)?\s*§|\bDESIGN\.md\b|\bseed\s*0\d\d|\.\./shared/(DESIGN|STYLE|seeds)", line):
                found.append(f"{path.relative_to(ROOT)}:{i}")
    assert found == []



# Classes still built as a chain of mixins over shared state (issue 68 turns them into collaborators, one
# package at a time): the list only shrinks, and the test fails when it does not say exactly what is left.
CHAINS_LEFT = {
    "session.intake.Intake", "session.memory.Memory", "session.planner.CallPlanner", "session.turn.Session",
    "store.Store", "notebook.magics.MfsMagics",
}


def project_bases() -> dict[str, list[str]]:
    """Every class of the package whose MRO holds more than one project class besides itself, protocols
    and exceptions left out (an exception's kinds are a hierarchy on purpose: `except LLMError` catches
    `PromptTooLong`): name -> those classes."""
    import importlib
    import inspect
    import typing

    out = {}
    for name in sorted(sources()):
        if not name or name.endswith(("__main__", "_encoder_child")):
            continue
        module = importlib.import_module(f"mfs_nb.{name}")
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__ or issubclass(cls, BaseException):
                continue
            mine = [b.__qualname__ for b in cls.__mro__[1:]
                    if b.__module__.startswith("mfs_nb") and not getattr(b, "_is_protocol", False)
                    and b is not typing.Generic]
            if len(mine) > 1:
                out[f"{name}.{cls.__qualname__}"] = mine
    return out


def test_no_class_is_a_chain_of_project_classes_but_those_still_to_be_taken_apart():
    assert set(project_bases()) == CHAINS_LEFT


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--write"]:
        DOCS.write_text(architecture_rows(DOCS.read_text(encoding="utf-8")), encoding="utf-8")
