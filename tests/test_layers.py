"""The layers of docs/architecture.md point one way: no two modules of chatbox import each
other, and every import goes down the layers (web -> services -> domain -> store).

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


# Each layer may import only layers below it (a lower rank), never one above or beside it:
# web -> services -> domain (data -> chat -> moderation, cluster -> knowledge, accounts ->
# catalog -> engine) -> store. The entry points sit on top.
RANKS = {
    "chatbox.__main__": 100,
    "chatbox.cli": 90,
    "chatbox.app": 80,
    "chatbox.web": 70,
    "chatbox.services": 60,
    "chatbox.data": 50,
    "chatbox.chat": 40,
    "chatbox.moderation": 30,
    "chatbox.cluster": 30,
    "chatbox.knowledge": 20,
    "chatbox.accounts": 20,
    "chatbox.catalog": 15,
    "chatbox.engine": 10,
    "chatbox.store": 0,
}
# Imported by any layer; they import none of the layers.
NEUTRAL = {"chatbox", "chatbox.settings", "chatbox.cpu", "chatbox.observability"}
# Callers that reach the store only through services (or the domain above the store).
NO_STORE = {"chatbox.web", "chatbox.cli", "chatbox.app"}
# The engine and the model catalogue know nothing of HTTP or SQL.
NO_HTTP_OR_SQL = {"chatbox.engine", "chatbox.catalog"}
HTTP_OR_SQL = {"litestar", "starlette", "httpx", "aiosqlite", "sqlite3", "sqlean", "sqlite_vec"}

# Imports that break the direction and need more work than a move; each says why it is here.
ALLOWED: dict[tuple[str, str], str] = {}


def layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def wrong_way(graph: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """Imports that point up or sideways, reach the store from web or CLI, or leave NEUTRAL:
    (importer, imported, why)."""
    found = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            la, lb = layer(a), layer(b)
            if la == lb or lb in NEUTRAL:
                continue
            if la in NEUTRAL:
                found.append((a, b, f"{la} imports no layer"))
            elif la in NO_STORE and lb == "chatbox.store":
                found.append((a, b, f"{la} reaches the store only through services"))
            elif RANKS[la] <= RANKS[lb]:
                found.append((a, b, f"{la} is not above {lb}"))
    return found


def test_a_wrong_way_import_is_found() -> None:
    graph = {
        "chatbox.store.users": {"chatbox.accounts.people"},
        "chatbox.accounts.people": {"chatbox.store.users", "chatbox.settings"},
        "chatbox.web.auth": {"chatbox.store.users", "chatbox.accounts.people"},
        "chatbox.engine.pool": {"chatbox.chat.models"},
        "chatbox.cluster.fleet": {"chatbox.moderation.queue"},
        "chatbox.settings": {"chatbox.store.users"},
    }
    assert [(a, b) for a, b, _ in wrong_way(graph)] == [
        ("chatbox.cluster.fleet", "chatbox.moderation.queue"),
        ("chatbox.engine.pool", "chatbox.chat.models"),
        ("chatbox.settings", "chatbox.store.users"),
        ("chatbox.store.users", "chatbox.accounts.people"),
        ("chatbox.web.auth", "chatbox.store.users"),
    ]


def test_imports_point_down_the_layers() -> None:
    graph = import_graph()
    assert {layer(m) for m in graph} <= set(RANKS) | NEUTRAL, "a package without a layer"
    found = wrong_way(graph)
    unexpected = [f"{a} -> {b}: {why}" for a, b, why in found if (a, b) not in ALLOWED]
    assert not unexpected, "imports against the layers:\n" + "\n".join(unexpected)
    stale = set(ALLOWED) - {(a, b) for a, b, _ in found}
    assert not stale, f"allowed imports no longer made (drop them from ALLOWED): {sorted(stale)}"


def test_the_engine_and_catalog_import_no_http_or_sql() -> None:
    found = []
    for name, path in all_modules().items():
        if layer(name) not in NO_HTTP_OR_SQL:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            found += [f"{name} imports {r}" for r in sorted(roots & HTTP_OR_SQL)]
    assert not found, "\n".join(found)


# chat/ in rooms: the turn itself at the top of chat/ (the package, `service.py`, which takes a
# turn, and `conversations.py` under it), the rooms beside it, each one concept. A room may use
# the turn's shared vocabulary (errors, policy, options, admission, ...) but never the turn:
# the turn is built from the rooms, not the other way round.
CHAT_ROOMS = ("caches", "privacy", "rollout", "running", "stateless", "teams", "tools")
THE_TURN = {"chatbox.chat", "chatbox.chat.service", "chatbox.chat.conversations"}


def chat_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["chatbox", "chat"] and len(parts) > 3 else None


def test_chat_is_in_rooms_that_never_import_the_turn() -> None:
    graph = import_graph()
    rooms = {chat_room(m) for m in graph} - {None}
    assert rooms == set(CHAT_ROOMS), "a new room of chat/: name it here and in architecture.md"
    flat = [m for m in graph if layer(m) == "chatbox.chat" and m.count(".") == 2]
    flat = [m for m in flat if m.split(".")[2] not in CHAT_ROOMS]
    assert len(flat) <= 15, f"chat/ has {len(flat)} flat modules: put a concept in a room"
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        if chat_room(a)
        for b in sorted(targets)
        if b in THE_TURN
    ]
    assert not upward, "a room of chat/ imports the turn:\n" + "\n".join(upward)
    web = [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        if chat_room(a) in ("rollout", "caches")
        for b in sorted(targets)
        if layer(b) in ("chatbox.web", "chatbox.services", "chatbox.app")
    ]
    assert not web, "rollout and caches know nothing of the web:\n" + "\n".join(web)


def test_a_room_that_imports_the_turn_is_found() -> None:
    graph = {"chatbox.chat.rollout.canary": {"chatbox.chat.service", "chatbox.chat.policy"}}
    upward = [b for a, ts in graph.items() if chat_room(a) for b in ts if b in THE_TURN]
    assert upward == ["chatbox.chat.service"]
    assert chat_room("chatbox.chat.policy") is None and chat_room("chatbox.chat.tools") is None
