"""Who may do what with a conversation: the one rule every path asks.

Seeing it (reading its turns, citations and summaries, reattaching to its answer, searching
it, exporting it) and continuing it belong to whoever `visible_to` admits: its starter while
it is in no workspace, every current member of its workspace while it is in one (its
starter too, only while a member). Anyone else gets 404, as if it did not exist.
Configuring it (title, system prompt, model) is its starter's or an owner's of its
workspace; deleting, moving and sharing it are its starter's alone. Those who see it but may
not do that get 403.
"""

from __future__ import annotations

from typing import Literal

from chatbox.chat.errors import Forbidden, NotFound
from chatbox.store import Conversation, Store

# read: see it and its turns; continue: add turns, branch, stop its answer;
# configure: title, system prompt, model; own: delete, move, share.
Act = Literal["read", "continue", "configure", "own"]

_REFUSED: dict[Act, str] = {
    "configure": "only the member who started this conversation or an owner of its workspace"
    " can change its settings",
    "own": "only the member who started this conversation can do that",
}


async def may(store: Store, user_id: str, conv: Conversation, act: Act) -> bool:
    """Whether a user who sees `conv` may also do `act` with it."""
    if act in ("read", "continue") or conv.user_id == user_id:
        return True
    if act == "configure" and conv.workspace_id is not None:
        return await store.workspaces.role(conv.workspace_id, user_id) == "owner"
    return False


async def conversation_for(
    store: Store, user_id: str, conv_id: str, act: Act = "read"
) -> Conversation:
    """The conversation if the user may `act` on it: NotFound unless they see it (the store's
    `visible_to`), Forbidden when they see it but may not do that."""
    conv = await store.conversations.get(user_id, conv_id)
    if conv is None:
        raise NotFound("conversation not found")
    if not await may(store, user_id, conv, act):
        raise Forbidden(_REFUSED.get(act, "not allowed"))
    return conv
