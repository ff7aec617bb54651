"""Who may see a conversation, written once in SQL: every store query that reads a user's
conversations, their turns or their documents composes `visible_to`.

The rule: a conversation (or document) in no workspace is its own user's; one in a workspace
is every current member's, and no one else's, its starter included once they leave. A
removed member matches no row from the next query on. Share links are snapshots, read by
token and outside this rule (chatbox/store/shares.py).
"""

from __future__ import annotations


def visible_to(user_id: str, table: str = "conversations") -> tuple[str, tuple[str, str]]:
    """The SQL predicate (and its parameters) for "user_id may see this row" of `table`
    (conversations, or documents: both carry user_id and workspace_id)."""
    return (
        f"(({table}.workspace_id IS NULL AND {table}.user_id = ?) OR {table}.workspace_id IN"
        " (SELECT workspace_id FROM workspace_members WHERE user_id = ?))",
        (user_id, user_id),
    )
