"""Application metrics (beside the engine's, in the app's CollectorRegistry).

Label values are always from small fixed sets (route templates, status codes, tier names,
decision names); never user content, ids or raw paths.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_WORK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class AppMetrics:
    """The application's metric families in one registry (create once per registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r: dict[str, Any] = {"registry": registry}
        self.http_requests = Counter(
            "chatbox_http_requests",
            "HTTP requests by method, route template and status code",
            labelnames=("method", "route", "status"),
            **r,
        )
        self.http_duration = Histogram(
            "chatbox_http_request_duration_seconds",
            "Time to the response's first byte, by method and route template",
            labelnames=("method", "route"),
            buckets=_HTTP_BUCKETS,
            **r,
        )
        self.admission = Counter(
            "chatbox_admission_decisions",
            "Admission decisions: admitted, queued, degraded, rate_limited (by limit), shed",
            labelnames=("tier", "decision", "limit"),
            **r,
        )
        self.answer_cache = Counter(
            "chatbox_answer_cache_lookups",
            "Exact-match answer cache lookups of deterministic API requests: hit, miss",
            labelnames=("outcome",),
            **r,
        )
        self.answer_cache_entries = Gauge(
            "chatbox_answer_cache_entries", "Answers the exact-match answer cache holds", **r
        )
        self.answer_cache_bytes = Gauge(
            "chatbox_answer_cache_bytes", "RAM the exact-match answer cache's answers take", **r
        )
        self.semantic_cache = Counter(
            "chatbox_semantic_cache_lookups",
            "Semantic answer cache lookups of first questions: hit, miss",
            labelnames=("outcome",),
            **r,
        )
        self.semantic_cache_entries = Gauge(
            "chatbox_semantic_cache_entries", "Answers the semantic answer cache holds", **r
        )
        self.semantic_cache_bytes = Gauge(
            "chatbox_semantic_cache_bytes",
            "RAM the semantic answer cache's questions, answers and vectors take",
            **r,
        )
        self.auth_failures = Counter(
            "chatbox_auth_failures",
            "Refused credentials by reason (invalid_key, csrf, bad_password, throttled, ...)",
            labelnames=("reason",),
            **r,
        )
        self.embeddings = Counter(
            "chatbox_knowledge_embedded_texts", "Texts embedded", labelnames=("purpose",), **r
        )
        self.embedding_duration = Histogram(
            "chatbox_knowledge_embedding_seconds",
            "Time of one embedding call (queue and encode)",
            labelnames=("purpose",),
            buckets=_WORK_BUCKETS,
            **r,
        )
        self.ingestions = Counter(
            "chatbox_knowledge_ingestions",
            "Documents ingested, by outcome (stored, rejected, failed)",
            labelnames=("outcome",),
            **r,
        )
        self.ingestion_duration = Histogram(
            "chatbox_knowledge_ingestion_seconds",
            "Extract, chunk, embed and store one document",
            buckets=_WORK_BUCKETS,
            **r,
        )
        self.retrieval_duration = Histogram(
            "chatbox_knowledge_retrieval_seconds",
            "Memory and document retrieval for one turn",
            buckets=_FAST_BUCKETS,
            **r,
        )
        self.store_duration = Histogram(
            "chatbox_store_operation_seconds",
            "Database work by kind (read, write: a whole transaction; snapshot: a search's read"
            " on the read connection)",
            labelnames=("op",),
            buckets=_FAST_BUCKETS,
            **r,
        )
        self.conversation_reads = Counter(
            "chatbox_store_conversation_reads",
            "Conversation reads (lists, turns, search) where a read replica is configured, by"
            " the database that served them and why: replica; or primary for own_write (the"
            " user's write is not on the replica yet), lagging, down, error, in_write",
            labelnames=("served_by", "reason"),
            **r,
        )
        self.turns = Counter(
            "chatbox_turns",
            "Finished conversation turns by status (complete, stopped, failed, interrupted)",
            labelnames=("model", "status"),
            **r,
        )
        self.feedback = Counter(
            "chatbox_feedback_ratings",
            "Ratings people gave answers (thumbs up or down; a change counts again), by model"
            " and canary arm ('' outside a canary)",
            labelnames=("model", "arm", "rating"),
            **r,
        )
        self.disk_used = Gauge(
            "chatbox_data_disk_used_ratio",
            "Fraction of the data directory's disk in use (as df counts it), read each sample",
            **r,
        )
