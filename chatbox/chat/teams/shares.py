"""Share links: a read-only snapshot of a conversation up to a chosen turn, at a secret URL.

The snapshot holds copies of the shared turns and of the passages their answers cite
(nothing else of the owner's: no memory, no other documents), so editing or deleting the
conversation later does not change it; revoking a link deletes its snapshot at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatbox.chat.errors import Forbidden, InvalidInput, NotFound
from chatbox.chat.policy import Policy
from chatbox.chat.privacy.temporary import keeps_nothing, refuse_storing
from chatbox.chat.teams.access import conversation_for
from chatbox.store import Conversation, Store, User
from chatbox.store.shares import Share, SharedPassage, SharedTurn, Snapshot

__all__ = ["Share", "Sharing"]


@dataclass
class Sharing:
    store: Store
    policy: Policy

    def allowed(self, user: User) -> bool:
        """Whether the user's tier may share (the policy's `sharing`, on by default)."""
        return self.policy.tier(user.tier).sharing

    async def share(
        self, user: User, conv_id: str, upto_turn_id: str | None = None
    ) -> tuple[Share, str]:
        """Snapshot the active branch down to upto_turn_id (default: its last turn)."""
        if not self.allowed(user):
            raise Forbidden("sharing is turned off for your account's tier")
        conv = await self._own(user, conv_id)
        leaf = upto_turn_id or conv.active_leaf_id
        if leaf is None:
            raise InvalidInput("the conversation has no turns to share")
        if await self.store.turns.get(conv.id, leaf) is None:
            raise NotFound("turn not found")
        path = [t for t in await self.store.turns.path(conv.id, leaf) if t.content]
        cited = await self.store.documents.citations(
            conv.user_id, [t.id for t in path if t.role == "assistant"]
        )
        turns = [
            SharedTurn(
                t.role,
                t.content,
                t.model,
                tuple(SharedPassage(c.document_name, c.page, c.text) for c in cited.get(t.id, [])),
            )
            for t in path
        ]
        return await self.store.shares.create(user.id, conv.id, conv.title, turns, leaf)

    async def links(self, user: User, conv_id: str | None = None) -> list[Share]:
        """The user's links, of one conversation of theirs when given."""
        if conv_id is not None:
            await self._own(user, conv_id)
        return await self.store.shares.list(user.id, conv_id)

    async def revoke(self, user: User, share_id: str) -> None:
        if not await self.store.shares.revoke(user.id, [share_id]):
            raise NotFound("share link not found")

    async def revoke_conversation(self, user: User, conv_id: str) -> int:
        """Revoke every link of one of the user's conversations (also once it is deleted)."""
        return await self.store.shares.revoke_conversation(user.id, conv_id)

    async def snapshot(self, token: str) -> Snapshot:
        """What a link shows; 404 when the token is unknown or revoked."""
        found = await self.store.shares.snapshot(token) if 0 < len(token) <= 128 else None
        if found is None:
            raise NotFound("this link does not exist or was revoked")
        return found

    async def continue_copy(self, user: User, token: str) -> Conversation:
        """Copy a snapshot into the reader's own account as a new conversation."""
        snap = await self.snapshot(token)
        if await keeps_nothing(self.store, self.policy, user):
            raise refuse_storing()
        title = f"{snap.share.title or 'Shared conversation'} (copy)"[:80]
        conv = await self.store.conversations.create(user.id, title)
        parent: str | None = None
        for turn in snap.turns:
            parent = await self.store.turns.copy_turn(
                conv.id, parent, turn.role, turn.content, turn.model, user.id
            )
        return await conversation_for(self.store, user.id, conv.id)

    async def _own(self, user: User, conv_id: str) -> Conversation:
        """A conversation the user started (and still sees): only its starter shares it."""
        return await conversation_for(self.store, user.id, conv_id, "own")
