"""One visibility rule: who may see a conversation is written once, and every path asks it.

The store writes it once in SQL (`chatbox.store.visibility.visible_to`): every store function
that reads conversations or their turns and narrows them to a user must compose it, so a new
query that filters by `conversations.user_id` alone fails here. Above the store, one function
(`chatbox.chat.teams.access.conversation_for`) turns it into 404s and 403s: no other module looks a
user's conversation up by id itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "chatbox" / "store"

# SQL that reads conversations or what hangs off one (turns, their search rows, drafts,
# summaries), and SQL that narrows rows to one user.
READS_CONVERSATIONS = re.compile(
    r"\b(FROM|JOIN)\s+(conversations|turns|turn_fts|turn_vec|drafts|summaries)\b", re.I
)
BY_USER = re.compile(r"\buser_id\s*=\s*\?")

# Functions that select a user's conversations by who started them, on purpose, each with why.
# They decide nothing about what a user sees: they write, index or erase.
STARTER_SIDE = {
    "search.py:unindexed": "the indexer fills the starter's vector partition; reads filter",
    "search.py:add_vectors": "the indexer writes the starter's partition, live conversations only",
    "transfer.py:conversations": "erasing an account takes every conversation it started",
}


def _strings(node: ast.AST) -> str:
    """Every string constant under node (f-strings' literal parts too), joined by spaces."""
    return " ".join(
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


def _calls(node: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            names.add(
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
    return names


def user_narrowed_reads(source: str, module: str) -> list[str]:
    """`module:function` of each function that reads conversations or turns narrowed to a
    user without composing the visibility predicate (directly or through a helper of the
    module that does)."""
    tree = ast.parse(source)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    carriers = {"visible_to"}
    carriers |= {f.name for f in functions if "visible_to" in _calls(f)}
    # Module-level SQL constants a function may use by name.
    constants = {
        t.id: _strings(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    out = []
    for f in functions:
        sql = _strings(f) + " ".join(
            constants[n.id] for n in ast.walk(f) if isinstance(n, ast.Name) and n.id in constants
        )
        if READS_CONVERSATIONS.search(sql) and BY_USER.search(sql) and not _calls(f) & carriers:
            out.append(f"{module}:{f.name}")
    return out


def test_the_check_catches_a_query_by_starter_alone() -> None:
    bad = (
        "async def mine(db, user_id):\n"
        "    return await db.fetchall(\n"
        "        'SELECT turns.* FROM turns JOIN conversations ON conversations.id ='\n"
        "        ' turns.conversation_id WHERE conversations.user_id = ?', (user_id,))\n"
    )
    good = (
        "async def mine(db, user_id):\n"
        "    seen, params = visible_to(user_id)\n"
        "    return await db.fetchall(f'SELECT * FROM conversations WHERE {seen}', params)\n"
    )
    assert user_narrowed_reads(bad, "x.py") == ["x.py:mine"]
    assert user_narrowed_reads(good, "x.py") == []


def test_store_reads_of_a_users_conversations_go_through_visible_to() -> None:
    found = []
    for path in sorted(STORE.glob("*.py")):
        found += user_narrowed_reads(path.read_text(encoding="utf-8"), path.name)
    assert found, "the scan found no query by user at all: it no longer reads the store"
    unexplained = sorted(set(found) - set(STARTER_SIDE))
    assert not unexplained, (
        "store functions narrow conversations or turns to a user without visible_to "
        "(chatbox/store/visibility.py); compose it, or say in STARTER_SIDE why the starter "
        "alone is meant:\n  " + "\n  ".join(unexplained)
    )
    stale = sorted(set(STARTER_SIDE) - set(found))
    assert not stale, f"STARTER_SIDE names functions that no longer need it: {stale}"


# Above the store, a user's conversation is looked up by id only in chatbox.chat.teams.access; the
# knowledge package sits below chat (it cannot import it) and asks the store's lookup, which
# composes the same predicate (a conversation one may not see is None there: a 404).
LOOKS_UP = {
    "chatbox/chat/teams/access.py": "the rule itself",
    "chatbox/knowledge/documents.py": "below chat: the store's visible lookup (404 only)",
    "chatbox/knowledge/extraction.py": "below chat: the store's visible lookup (404 only)",
}


def conversation_lookups(source: str) -> int:
    """How many `<...>.conversations.get(...)` calls the source makes."""
    return sum(
        1
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "get"
        and isinstance(n.func.value, ast.Attribute)
        and n.func.value.attr == "conversations"
    )


def test_only_the_access_rule_looks_a_users_conversation_up() -> None:
    assert conversation_lookups("async def f(s):\n    await s.store.conversations.get(1, 2)\n")
    found = {
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "chatbox").rglob("*.py"))
        if STORE not in path.parents and conversation_lookups(path.read_text(encoding="utf-8"))
    }
    assert "chatbox/chat/teams/access.py" in found
    unexplained = sorted(found - set(LOOKS_UP))
    assert not unexplained, (
        "modules look a conversation up themselves instead of asking chatbox.chat.teams."
        "access.conversation_for (which answers 404 and 403 by the one rule):\n  "
        + "\n  ".join(unexplained)
    )
