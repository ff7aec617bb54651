"""Storage: SQLite (WAL) through aiosqlite, with sqlite-vec; SQL lives only here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chatbox.store.conversations import ConversationRepo
from chatbox.store.db import Database
from chatbox.store.records import Conversation, Turn, TurnStatus, TurnUsage, User
from chatbox.store.turns import TurnRepo
from chatbox.store.users import UserRepo

__all__ = ["Conversation", "Database", "Store", "Turn", "TurnStatus", "TurnUsage", "User"]


@dataclass
class Store:
    """The database and one repository per aggregate."""

    db: Database
    users: UserRepo
    conversations: ConversationRepo
    turns: TurnRepo

    @classmethod
    async def open(cls, path: Path) -> Store:
        db = await Database.open(path)
        return cls(db, UserRepo(db), ConversationRepo(db), TurnRepo(db))

    async def close(self) -> None:
        await self.db.close()
