"""Moderation in and out: the admin's rules, a profanity model and a category classifier on
MiniLM embeddings, under a per-tier policy; the stream watch; the review queue."""

from chatbox.moderation.checker import ALLOW, SUPPORT, Moderator, Verdict
from chatbox.moderation.policy import CATEGORIES, PROFANITY, ModerationPolicy
from chatbox.moderation.queue import ReviewQueue, item_out
from chatbox.moderation.service import ModerationService
from chatbox.moderation.stream import OutputWatch

__all__ = [
    "ALLOW",
    "CATEGORIES",
    "PROFANITY",
    "SUPPORT",
    "ModerationPolicy",
    "ModerationService",
    "Moderator",
    "OutputWatch",
    "ReviewQueue",
    "Verdict",
    "item_out",
]
