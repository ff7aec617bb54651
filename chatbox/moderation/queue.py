"""The review queue: flagged and filtered items for an admin. Showing an item (the one place
an admin sees a user's content) and resolving it are each recorded in the audit log."""

from __future__ import annotations

from typing import Any, Literal

from chatbox.accounts.audit import Actor, AuditLog
from chatbox.moderation.checker import Verdict
from chatbox.moderation.policy import ModerationPolicy
from chatbox.store import ModerationItem, Store, User

Resolution = Literal["dismiss", "confirm"]


def item_out(item: ModerationItem, with_text: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": item.id,
        "created_at": item.created_at,
        "user": {"id": item.user_id, "name": item.user_name},
        "tier": item.tier,
        "direction": item.direction,
        "action": item.action,
        "category": item.category,
        "scores": item.scores,
        "conversation_id": item.conversation_id,
        "turn_id": item.turn_id,
        "source": item.source,
        "status": item.status,
        "resolved_by": item.resolved_by,
        "resolved_at": item.resolved_at,
        "has_text": item.text is not None,
    }
    if with_text:
        out["text"] = item.text
    return out


class ReviewQueue:
    def __init__(self, store: Store, policy: ModerationPolicy) -> None:
        self.store = store
        self.policy = policy
        self.audit = AuditLog(store)

    async def record(
        self,
        user: User | None,
        direction: str,
        verdict: Verdict,
        text: str | None,
        *,
        conversation_id: str | None = None,
        turn_id: str | None = None,
        source: str | None = None,
    ) -> ModerationItem | None:
        """Queue (flag, block) or note (warn) a verdict; nothing for an allowed text."""
        if verdict.category is None or verdict.action == "allow":
            return None
        tier = user.tier if user else "api"
        keep = self.policy.tier(tier).keep_text
        return await self.store.moderation.add(
            user_id=user.id if user else None,
            tier=tier,
            direction=direction,
            action=verdict.action,
            category=verdict.category,
            scores=verdict.scores,
            text=text if keep else None,
            conversation_id=conversation_id,
            turn_id=turn_id,
            source=source or verdict.rule,
        )

    async def items(self, status: str | None = "open", limit: int = 100) -> list[ModerationItem]:
        """The queue without text (listing shows no content and is not audited)."""
        return await self.store.moderation.list(status, limit)

    async def show(self, actor: Actor | User | str, item_id: str) -> ModerationItem | None:
        """One item with its text; the viewing is recorded in the audit log."""
        item = await self.store.moderation.get(item_id)
        if item is None:
            return None
        owner = await self.store.users.get(item.user_id) if item.user_id else None
        await self.audit.record(
            actor, "moderation.view", owner, item=item.id, category=item.category
        )
        return item

    async def resolve(
        self, actor: Actor | User | str, item_id: str, action: Resolution
    ) -> ModerationItem | None:
        """Dismiss (a false alarm) or confirm an item; recorded in the audit log."""
        if action not in ("dismiss", "confirm"):
            raise ValueError("action must be dismiss or confirm")
        item = await self.store.moderation.get(item_id)
        if item is None:
            return None
        who = Actor.of(actor)
        status = "dismissed" if action == "dismiss" else "confirmed"
        done = await self.store.moderation.resolve(item.id, status, who.name)
        owner = await self.store.users.get(item.user_id) if item.user_id else None
        await self.audit.record(
            who,
            "moderation.resolve",
            owner,
            item=item.id,
            category=item.category,
            resolution=status,
            before=item.status,
        )
        return done
