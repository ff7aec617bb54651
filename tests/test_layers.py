"""No two modules of chatbox import each other (the layers of docs/architecture.md point one way).

Every import statement counts: at the top, under `if TYPE_CHECKING:`, and inside functions
(a lazy import is still a dependency). `from chatbox.x import y` counts as importing the
submodule `chatbox.x.y` where y is one, else the module `chatbox.x`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "chatbox"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (resolving relative imports)."""
    if node.level == 0:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The chatbox modules this module imports, anywhere in its body."""
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, path, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def mutual_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if a < b and a in graph.get(b, set())
    )


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "chatbox"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from chatbox.other import Thing\n"
        "def f():\n    import chatbox.sub\n"
    )
    (pkg / "other.py").write_text("from chatbox.sub import leaf\n")
    known = {"chatbox", "chatbox.sub", "chatbox.sub.leaf", "chatbox.other"}
    paths = {
        "chatbox.sub": pkg / "sub" / "__init__.py",
        "chatbox.sub.leaf": pkg / "sub" / "leaf.py",
        "chatbox.other": pkg / "other.py",
    }
    graph = {n: imports_of(n, p, known) for n, p in paths.items()}
    assert graph == {
        "chatbox.sub": {"chatbox.sub.leaf"},
        "chatbox.sub.leaf": {"chatbox.other", "chatbox.sub"},
        "chatbox.other": {"chatbox.sub.leaf"},
    }
    assert mutual_imports(graph) == [
        ("chatbox.other", "chatbox.sub.leaf"),
        ("chatbox.sub", "chatbox.sub.leaf"),
    ]


def test_no_two_modules_import_each_other() -> None:
    graph = import_graph()
    assert len(graph) > 20 and "chatbox.store.db" in graph  # the scan found the package
    circles = mutual_imports(graph)
    assert not circles, "modules that import each other:\n" + "\n".join(
        f"  {a} <-> {b}" for a, b in circles
    )
