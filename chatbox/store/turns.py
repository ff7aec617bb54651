"""Turns: append-only rows linked to their parent; a streaming answer lives in `drafts`
until it is written, exactly once, as a turn with its final status."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from chatbox.store.db import Database
from chatbox.store.records import Routing, Turn, TurnStatus, TurnUsage, new_id
from chatbox.store.usage import count_usage

TITLE_CHARS = 60
INTERRUPTED = "the server stopped while this answer was being written"


@dataclass(frozen=True)
class Draft:
    """An answer being written: where it hangs and which front writes it."""

    id: str
    conversation_id: str
    parent_id: str
    model: str | None
    front: str | None
    content: str


_PATH_SQL = """
WITH RECURSIVE path(id, parent_id, depth) AS (
    SELECT id, parent_id, 0 FROM turns WHERE id = ? AND conversation_id = ?
    UNION ALL
    SELECT t.id, t.parent_id, path.depth + 1 FROM turns t JOIN path ON t.id = path.parent_id
)
SELECT turns.* FROM turns JOIN path ON turns.id = path.id ORDER BY path.depth DESC
"""


def make_title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class TurnRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, conv_id: str, turn_id: str) -> Turn | None:
        row = await self.db.conversation_reads.fetchone(
            "SELECT * FROM turns WHERE id = ? AND conversation_id = ?", (turn_id, conv_id)
        )
        return Turn.from_row(row) if row else None

    async def written(self, conv_id: str, turn_id: str) -> Turn | None:
        """`get` from the database itself, never a read replica: a turn another front has
        just written, read back at once."""
        row = await self.db.fetchone(
            "SELECT * FROM turns WHERE id = ? AND conversation_id = ?", (turn_id, conv_id)
        )
        return Turn.from_row(row) if row else None

    async def path(self, conv_id: str, leaf_id: str | None) -> list[Turn]:
        """Turns from the root down to leaf_id (inclusive)."""
        if leaf_id is None:
            return []
        rows = await self.db.conversation_reads.fetchall(_PATH_SQL, (leaf_id, conv_id))
        return [Turn.from_row(r) for r in rows]

    async def children(self, conv_id: str, parent_id: str | None) -> list[Turn]:
        rows = await self.db.conversation_reads.fetchall(
            "SELECT * FROM turns WHERE conversation_id = ? AND parent_id"
            + (" IS ?" if self.db.dialect == "sqlite" else " IS NOT DISTINCT FROM ?")
            + " ORDER BY seq",
            (conv_id, parent_id),
        )
        return [Turn.from_row(r) for r in rows]

    async def sibling_ids(
        self, conv_id: str, parent_ids: set[str | None]
    ) -> dict[str | None, list[str]]:
        """For each parent, its children's ids in order (the branches at that point)."""
        out: dict[str | None, list[str]] = {}
        for parent in parent_ids:
            out[parent] = [t.id for t in await self.children(conv_id, parent)]
        return out

    async def deepest_leaf(self, conv_id: str, turn_id: str) -> str:
        """Follow the newest child down from turn_id: where a branch switch lands."""
        current = turn_id
        while True:
            row = await self.db.conversation_reads.fetchone(
                "SELECT id FROM turns WHERE conversation_id = ? AND parent_id = ?"
                " ORDER BY seq DESC LIMIT 1",
                (conv_id, current),
            )
            if row is None:
                return current
            current = row["id"]

    async def set_active_leaf(self, conv_id: str, turn_id: str | None) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (turn_id, conv_id)
            )

    async def append_user(
        self, conv_id: str, parent_id: str | None, content: str, author_id: str | None = None
    ) -> Turn:
        """Add a user turn under parent_id and make it the active leaf; titles a new chat."""
        turn_id = new_id("t")
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO turns (id, conversation_id, parent_id, role, content, status,"
                " created_at, author_id) VALUES (?, ?, ?, 'user', ?, 'complete', ?, ?)",
                (turn_id, conv_id, parent_id, content, now, author_id),
            )
            await tx.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ?,"
                " title = COALESCE(title, ?) WHERE id = ?",
                (turn_id, now, make_title(content), conv_id),
            )
        turn = await self.get(conv_id, turn_id)
        assert turn is not None
        return turn

    async def copy_turn(
        self,
        conv_id: str,
        parent_id: str | None,
        role: str,
        content: str,
        model: str | None,
        author_id: str | None,
    ) -> str:
        """Append a finished turn as given (a copied conversation); it becomes the leaf."""
        turn_id = new_id("t")
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO turns (id, conversation_id, parent_id, role, content, status, model,"
                " created_at, author_id) VALUES (?, ?, ?, ?, ?, 'complete', ?, ?, ?)",
                (turn_id, conv_id, parent_id, role, content, model, now, author_id),
            )
            await tx.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
                (turn_id, now, conv_id),
            )
        return turn_id

    async def start_draft(
        self,
        conv_id: str,
        parent_id: str,
        model: str | None,
        route: Routing | None = None,
        user_id: str | None = None,
    ) -> str:
        """The answer being written, by this front, for `user_id` (who is charged for it)."""
        draft_id = new_id("t")
        now = time.time()
        route = route or Routing()
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO drafts (id, conversation_id, parent_id, model, started_at, updated_at,"
                " route, arm, degraded_from, front, user_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    draft_id,
                    conv_id,
                    parent_id,
                    model,
                    now,
                    now,
                    route.route,
                    route.arm,
                    route.degraded_from,
                    self.db.runs.front if self.db.runs is not None else None,
                    user_id,
                ),
            )
        return draft_id

    async def append_tool(
        self, draft_id: str, role: Literal["tool_call", "tool_result"], content: str
    ) -> Turn:
        """A tool call or result of the answer being written: a turn under the draft's
        parent, which the draft then hangs under (the answer follows its tools)."""
        turn_id = new_id("t")
        now = time.time()
        async with self.db.transaction() as tx:
            async with tx.execute(
                "SELECT conversation_id, parent_id FROM drafts WHERE id = ?", (draft_id,)
            ) as cur:
                draft = await cur.fetchone()
            if draft is None:
                raise KeyError(draft_id)
            conv_id = draft["conversation_id"]
            await tx.execute(
                "INSERT INTO turns (id, conversation_id, parent_id, role, content, status,"
                " created_at) VALUES (?, ?, ?, ?, ?, 'complete', ?)",
                (turn_id, conv_id, draft["parent_id"], role, content, now),
            )
            await tx.execute("UPDATE drafts SET parent_id = ? WHERE id = ?", (turn_id, draft_id))
            await tx.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
                (turn_id, now, conv_id),
            )
        turn = await self.get(conv_id, turn_id)
        assert turn is not None
        return turn

    async def update_draft(
        self, draft_id: str, content: str, usage: TurnUsage | None = None
    ) -> None:
        """The text so far, and the tokens so far where known (a recovery charges them)."""
        usage = usage or TurnUsage()
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE drafts SET content = ?, updated_at = ?, prompt_tokens = ?,"
                " completion_tokens = ? WHERE id = ?",
                (content, time.time(), usage.prompt_tokens, usage.completion_tokens, draft_id),
            )

    async def finish_draft(
        self,
        draft_id: str,
        status: TurnStatus,
        content: str,
        usage: TurnUsage,
        error: str | None = None,
    ) -> Turn:
        """Write the assistant turn once, drop its draft, and make it the active leaf."""
        now = time.time()
        async with self.db.transaction() as tx:
            async with tx.execute("SELECT * FROM drafts WHERE id = ?", (draft_id,)) as cur:
                draft = await cur.fetchone()
            if draft is None:
                raise KeyError(draft_id)
            await self._insert_from_draft(tx, draft, status, content, usage, error, now)
        turn = await self.get(draft["conversation_id"], draft_id)
        assert turn is not None
        return turn

    @staticmethod
    async def _insert_from_draft(tx, draft, status, content, usage, error, now) -> None:  # type: ignore[no-untyped-def]
        await tx.execute(
            "INSERT INTO turns (id, conversation_id, parent_id, role, content, status, model,"
            " route, arm, degraded_from,"
            " prompt_tokens, completion_tokens, cached_tokens, error, created_at)"
            " VALUES (?, ?, ?, 'assistant', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                draft["id"],
                draft["conversation_id"],
                draft["parent_id"],
                content,
                status,
                draft["model"],
                draft["route"],
                draft["arm"],
                draft["degraded_from"],
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.cached_tokens,
                error,
                now,
            ),
        )
        await tx.execute("DELETE FROM drafts WHERE id = ?", (draft["id"],))
        await tx.execute(
            "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
            (draft["id"], now, draft["conversation_id"]),
        )

    async def draft_for(self, conv_id: str) -> tuple[str, str, str] | None:
        """(draft id, parent id, text so far) of the answer being written, if any."""
        row = await self.db.fetchone(
            "SELECT id, parent_id, content FROM drafts WHERE conversation_id = ?", (conv_id,)
        )
        return (row["id"], row["parent_id"], row["content"]) if row else None

    async def draft(self, draft_id: str) -> Draft | None:
        """The answer being written with this id, if it is still being written."""
        row = await self.db.fetchone(
            "SELECT id, conversation_id, parent_id, model, front, content FROM drafts WHERE id = ?",
            (draft_id,),
        )
        return Draft(**dict(row)) if row else None

    async def draft_fronts(self) -> dict[str, str | None]:
        """Every answer being written: its draft id and the front writing it."""
        rows = await self.db.fetchall("SELECT id, front FROM drafts")
        return {r["id"]: r["front"] for r in rows}

    async def recover_drafts(
        self, alive: set[str] | None = None, gone: set[str] | None = None
    ) -> int:
        """After a crash: every unfinished answer becomes a turn marked interrupted; with
        `alive`, only those of fronts not in it, with `gone` only those of fronts in it
        (fronts sharing a database)."""
        now = time.time()
        async with self.db.transaction() as tx:
            # A deleted conversation's draft is left to the erasure sweep, not turned into a turn.
            async with tx.execute(
                "SELECT * FROM drafts WHERE conversation_id NOT IN"
                " (SELECT id FROM conversations WHERE deleted_at IS NOT NULL) ORDER BY started_at"
            ) as cur:
                drafts = list(await cur.fetchall())
            if alive is not None:
                drafts = [d for d in drafts if d["front"] not in alive]
            if gone is not None:
                drafts = [d for d in drafts if d["front"] in gone]
            for draft in drafts:
                used = TurnUsage(draft["prompt_tokens"], draft["completion_tokens"])
                await self._insert_from_draft(
                    tx, draft, "interrupted", draft["content"], used, INTERRUPTED, now
                )
                if draft["user_id"] is not None and draft["model"] is not None:
                    # Its front died before charging it: the tokens its last save counted.
                    await count_usage(
                        tx,
                        draft["user_id"],
                        draft["model"],
                        prompt=used.prompt_tokens,
                        completion=used.completion_tokens,
                        arm=draft["arm"] or "",
                        ts=now,
                    )
        return len(drafts)
