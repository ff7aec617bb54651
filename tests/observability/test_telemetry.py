"""Application metrics and traces after real requests through the app (tiny model)."""

from __future__ import annotations

import json
import logging
import re
import secrets
from pathlib import Path

from prometheus_client import generate_latest

from chatbox.observability.logs import JsonFormatter, TraceIdFilter
from chatbox.observability.ring import MetricRing, quantile
from tests.gateway import gateway_box

ROOT = Path(__file__).resolve().parents[2]

TURN_SPANS = {
    "turn",
    "admission",
    "retrieval",
    "store.save_prompt",
    "engine",
    "engine.queue_wait",
    "engine.prefill",
    "engine.decode",
    "store.save_answer",
}


def metrics_text(box: object) -> str:
    client = box.client  # type: ignore[attr-defined]
    return generate_latest(client.app.state.services.metrics).decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, matched on all the given labels."""
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


def take_turn(box: object, user: str = "bob", text: str = "Hello") -> tuple[str, str]:
    """A whole turn over the conversation API; (conversation id, the response's trace id)."""
    conv = box.new_conversation(user)  # type: ignore[attr-defined]
    response = box.client.post(  # type: ignore[attr-defined]
        f"/v1/conversations/{conv}/turns",
        json={"content": text},
        headers=box.h(user),  # type: ignore[attr-defined]
    )
    assert response.status_code in (200, 201), response.text
    return conv, response.headers["x-trace-id"]


def test_http_requests_are_counted_by_route_template_and_status(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        conv, _ = take_turn(box)
        box.client.get(f"/v1/conversations/{conv}", headers=box.h("bob"))
        box.client.get("/v1/conversations/nope-not-there", headers=box.h("bob"))
        text = metrics_text(box)
        route = "/v1/conversations/{conv_id}"
        assert sample(text, "chatbox_http_requests_total", route=route, status="200") == 1
        assert sample(text, "chatbox_http_requests_total", route=route, status="404") == 1
        assert sample(text, "chatbox_http_request_duration_seconds_count", route=route) == 2
        # the raw ids never become label values (unbounded, and they name a user's chat)
        assert conv not in text and "nope-not-there" not in text


def test_requests_no_route_matches_are_counted_under_one_bounded_label(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    junk = secrets.token_hex(8)
    with gateway_box(tmp_path, tiny_gguf) as box:
        for _ in range(2):
            response = box.client.get(f"/no/such/path/{junk}", headers=box.h("bob"))
            assert response.status_code == 404
            assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-trace-id"])
        text = metrics_text(box)
        series = [
            line
            for line in text.splitlines()
            if line.startswith("chatbox_http_requests_total{") and 'status="404"' in line
        ]
        assert series == [
            'chatbox_http_requests_total{method="GET",route="<unmatched>",status="404"} 2.0'
        ]
        assert junk not in text and "/no/such" not in text


def test_admission_and_auth_failures_are_counted(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf, free_rpm=1) as box:
        assert box.complete("ann").status_code == 200
        assert box.complete("ann").status_code == 429  # one request a minute on free
        refused = box.client.get("/v1/conversations", headers={"Authorization": "Bearer x"})
        assert refused.status_code == 401
        text = metrics_text(box)
        assert (
            sample(text, "chatbox_admission_decisions_total", tier="free", decision="admitted") == 1
        )
        assert (
            sample(
                text,
                "chatbox_admission_decisions_total",
                tier="free",
                decision="rate_limited",
                limit="requests",
            )
            == 1
        )
        assert sample(text, "chatbox_auth_failures_total", reason="invalid_key") == 1


def test_shed_is_counted(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        box.saturate(5)
        assert box.complete("ann").status_code == 503
        text = metrics_text(box)
        assert sample(text, "chatbox_admission_decisions_total", tier="free", decision="shed") == 1


def test_store_latency_and_turns_are_measured(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        take_turn(box)
        text = metrics_text(box)
        assert (sample(text, "chatbox_store_operation_seconds_count", op="write") or 0) > 0
        assert (sample(text, "chatbox_store_operation_seconds_count", op="read") or 0) > 0
        assert sample(text, "chatbox_turns_total", model="big", status="complete") == 1
        assert sample(text, "chatbox_knowledge_retrieval_seconds_count") == 1


def test_knowledge_and_moderation_work_is_measured(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf, check_answers=True) as box:
        take_turn(box)
        manual = b"The Zephyr-9 pump must be descaled every 90 days.\n\n" * 20
        r = box.client.post(
            "/v1/documents",
            headers=box.h("bob"),
            files={"file": ("zephyr-manual.txt", manual, "text/plain")},
        )
        assert r.status_code == 201, r.text
        r = box.client.post("/v1/embeddings", json={"input": "hello"}, headers=box.h("bob"))
        assert r.status_code == 200
        text = metrics_text(box)
        assert sample(text, "chatbox_knowledge_ingestions_total", outcome="stored") == 1
        assert sample(text, "chatbox_knowledge_ingestion_seconds_count") == 1
        embedded = [
            dict(re.findall(r'(\w+)="([^"]*)"', line))["purpose"]
            for line in text.splitlines()
            if line.startswith("chatbox_knowledge_embedded_texts_total{")
        ]
        assert embedded and set(embedded) <= {"query", "bulk"}
        # the user's message and the answer were checked once each, the document too (by part)
        for direction, times in (("input", 1), ("output", 1), ("document", None)):
            checks = sample(text, "chatbox_moderation_checks_total", direction=direction)
            assert checks and checks == (times or checks), (direction, checks)
            assert sample(text, "chatbox_moderation_latency_seconds_count", direction=direction)
        # the encoder's CPU by lane: the message in the urgent one; the document, the
        # answer's windows and the embeddings API in the background one
        for lane in ("urgent", "background"):
            assert sample(text, "chatbox_encoder_cpu_seconds_total", lane=lane) > 0, lane
        assert "zephyr" not in text.lower() and "descaled" not in text


def test_the_grafana_dashboard_plots_metrics_the_app_exports(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana" / "chatbox.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Tokens per second by replica", "Failovers and ejections by replica"} <= titles
    names = {n for e in exprs for n in re.findall(r"\bchatbox_\w+", e)}
    with gateway_box(tmp_path, tiny_gguf) as box:
        families = set(re.findall(r"^# TYPE (\w+) ", metrics_text(box), re.M))
    # a family's samples carry these suffixes (families are listed before any sample)
    suffix = re.compile(r"_(total|bucket|count|sum)$")
    missing = {n for n in names if n not in families and suffix.sub("", n) not in families}
    assert not missing, missing
    assert any("replica" in e for e in exprs)


def test_a_turn_is_one_trace_with_the_named_spans_and_the_header(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        _, trace_id = take_turn(box)
        assert re.fullmatch(r"[0-9a-f]{32}", trace_id)
        buffer = box.client.app.state.services.telemetry.tracing.buffer
        spans = buffer.spans(trace_id)
        names = {s.name for s in spans}
        assert names >= TURN_SPANS, names
        by_id = {s.span_id: s for s in spans}
        root = [s for s in spans if s.parent_id is None]
        assert [s.name for s in root] == ["POST /v1/conversations/{conv_id}/turns"]

        def parent(name: str) -> str:
            span = next(s for s in spans if s.name == name)
            return by_id[span.parent_id].name if span.parent_id else ""

        assert parent("turn") == root[0].name
        for child in ("admission", "retrieval", "engine", "store.save_prompt", "store.save_answer"):
            assert parent(child) == "turn", child
        for phase in ("engine.queue_wait", "engine.prefill", "engine.decode"):
            assert parent(phase) == "engine"
        engine = next(s for s in spans if s.name == "engine")
        phases = [s for s in spans if s.name.startswith("engine.")]
        assert abs(sum(p.duration_ms for p in phases) - engine.duration_ms) < 1.0
        turns = buffer.turns()
        assert turns[0]["trace_id"] == trace_id and turns[0]["status"] == "complete"
        # the console's trace page shows the waterfall; its JSON has the same spans
        box.login("admin")
        data = box.client.get(
            f"/console/traces/{trace_id}", headers={"accept": "application/json"}
        ).json()
        assert {s["name"] for s in data["spans"]} == names


def test_an_incoming_traceparent_is_continued(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        parent = "4bf92f3577b34da6a3ce929d0e0e4736"
        response = box.client.get(
            "/v1/conversations",
            headers=box.h("bob", traceparent=f"00-{parent}-00f067aa0ba902b7-01"),
        )
        assert response.headers["x-trace-id"] == parent


def test_json_log_lines_carry_the_trace_id(tmp_path: Path, tiny_gguf: Path) -> None:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep()
    handler.addFilter(TraceIdFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("chatbox")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        with gateway_box(tmp_path, tiny_gguf) as box:
            _, trace_id = take_turn(box)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    records = [json.loads(line) for line in lines]
    mine = [r for r in records if r.get("trace_id") == trace_id]
    assert any(r["logger"] == "chatbox.access" for r in mine), records
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)


def test_the_ring_computes_rates_and_percentiles_from_the_registry() -> None:
    from prometheus_client import CollectorRegistry

    from chatbox.engine.metrics import EngineMetrics

    registry = CollectorRegistry()
    m = EngineMetrics("tiny", registry)
    ring = MetricRing(registry, interval_s=1.0, window_s=10.0)
    ring.sample(now=100.0)
    m.clock.tokens += 50
    for v in (0.02, 0.03, 0.04, 2.0):
        m.ttft.observe(v)
    for v in (0.009, 0.011, 0.012, 0.5):  # the decode thread's own clock (TokenClock)
        m.clock.tpot(v)
    m.queue_depth.set(3)
    row = ring.sample(now=102.0)
    assert row["tokens_per_s|tiny"] == 25.0
    assert 0.01 < row["tpot_p50_s|tiny"] <= 0.02
    assert row["tpot_p99_s|tiny"] > 0.3
    assert row["queue_depth|tiny"] == 3
    assert 0.025 < row["ttft_p50_s|tiny"] <= 0.05
    assert row["ttft_p99_s|tiny"] > 1.0
    cols = ring.series()
    assert cols["t"] == [100.0, 102.0] and cols["series"]["queue_depth|tiny"][1] == 3
    assert quantile(0.5, []) is None
