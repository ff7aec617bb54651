"""What can go wrong in the knowledge layer; the web layer maps each kind to a status code."""

from __future__ import annotations


class KnowledgeError(Exception):
    """Base of the knowledge layer's errors; the message is safe to show a user."""


class NotFoundError(KnowledgeError):
    """No such conversation, document, passage or fact for this user (404)."""


class RejectedFile(KnowledgeError):
    """An upload that cannot be stored; `reason` names the problem."""

    reason = "invalid_file"


class FileTooLarge(RejectedFile):
    reason = "file_too_large"  # 413


class EmptyFile(RejectedFile):
    reason = "empty_file"  # 422


class EncryptedFile(RejectedFile):
    reason = "encrypted_file"  # 422


class ContentRefused(RejectedFile):
    """Moderation refused a document or a fact to remember (422); the message says why."""

    reason = "content_filter"


class NotKept(RejectedFile):
    """The user's account stores no content (zero-data-retention): a document or a fact to
    remember is refused, not stored (422); the message says why."""

    reason = "zero_retention"


class UnsupportedFile(RejectedFile):
    reason = "unsupported_file"  # 415
