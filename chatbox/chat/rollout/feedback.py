"""Feedback on answers: a person who sees a conversation rates its answers (up or down) and
may say why. Each change is a new row; the newest of a (turn, person) counts.

Seeing the conversation (`chatbox.chat.teams.access`) is the one rule for rating an answer and
for reading one's rating back; anyone else gets 404. The comment is content: refused under
zero-data-retention (`keeps_nothing`), erased with the conversation and the account.
"""

from __future__ import annotations

from chatbox.chat.errors import InvalidInput, NotFound
from chatbox.chat.policy import Policy
from chatbox.chat.privacy.temporary import is_temporary, keeps_nothing
from chatbox.chat.teams.access import conversation_for
from chatbox.store import Feedback, Store, Turn, User
from chatbox.store.feedback import RATINGS, Rating

MAX_COMMENT_CHARS = 2000  # a few paragraphs: why an answer was good or bad


def check_rating(rating: str, comment: str | None) -> tuple[Rating, str | None]:
    """The rating and its comment (blank: none) as stored, or a 422 naming the field."""
    if rating not in RATINGS:
        raise InvalidInput("rating must be 'up' or 'down'", "rating")
    text = (comment or "").strip() or None
    if text is not None and len(text) > MAX_COMMENT_CHARS:
        raise InvalidInput(
            f"comment is {len(text):,} characters; the limit is {MAX_COMMENT_CHARS:,}", "comment"
        )
    return ("up" if rating == "up" else "down"), text


async def rated_answer(store: Store, user: User, conv_id: str, turn_id: str) -> Turn:
    """The answer the user may rate: 404 unless they see its conversation and it is there,
    422 for a message (only answers are rated) or a temporary chat (nothing is stored)."""
    if is_temporary(conv_id):
        raise InvalidInput("a temporary chat stores nothing, feedback included", "conv_id")
    conv = await conversation_for(store, user.id, conv_id, "read")
    turn = await store.turns.get(conv.id, turn_id)
    if turn is None:
        raise NotFound("turn not found")
    if turn.role != "assistant":
        raise InvalidInput("only an answer can be rated; that turn is a message", "turn_id")
    return turn


async def rate(
    store: Store,
    policy: Policy,
    user: User,
    conv_id: str,
    turn_id: str,
    rating: str,
    comment: str | None = None,
) -> Feedback:
    """Record the user's rating of an answer, with the answer's model and arm and the
    user's tier; refused where this request stores nothing."""
    checked, text = check_rating(rating, comment)
    turn = await rated_answer(store, user, conv_id, turn_id)
    if await keeps_nothing(store, policy, user):
        raise InvalidInput(
            "feedback refused: your account stores no content (zero-data-retention)", "rating"
        )
    return await store.feedback.add(
        turn.id, turn.conversation_id, user.id, checked, text, turn.model, turn.arm, user.tier
    )


async def my_rating(store: Store, user: User, conv_id: str, turn_id: str) -> Feedback | None:
    """The user's rating of an answer that counts now (None when not rated)."""
    turn = await rated_answer(store, user, conv_id, turn_id)
    return (await store.feedback.latest(user.id, [turn.id])).get(turn.id)
