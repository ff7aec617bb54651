"""Users' data: erasure of accounts, retention, zero-data-retention, export and import."""

from chatbox.data.chatgpt import ImportRefused
from chatbox.data.retention import RetentionReport, keeps
from chatbox.data.service import RETENTION_HEADER, DataService, export_zip, wants_none

__all__ = [
    "RETENTION_HEADER",
    "DataService",
    "ImportRefused",
    "RetentionReport",
    "export_zip",
    "keeps",
    "wants_none",
]
