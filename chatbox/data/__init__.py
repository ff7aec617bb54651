"""Users' data: erasure of accounts, retention, zero-data-retention, export and import."""

from chatbox.data.chatgpt import ImportRefused
from chatbox.data.retention import RetentionReport, keeps
from chatbox.data.service import (
    RETENTION_HEADER,
    DataService,
    ask_retention,
    export_zip,
    wants_none,
)

__all__ = [
    "RETENTION_HEADER",
    "DataService",
    "ImportRefused",
    "RetentionReport",
    "ask_retention",
    "export_zip",
    "keeps",
    "wants_none",
]
