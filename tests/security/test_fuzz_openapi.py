"""Property-based fuzzing of every operation in the OpenAPI schema, as a free member.

schemathesis generates valid and invalid requests from /schema/openapi.json; each goes to
the app in-process with mallory's API key. Half the cases aim at her real conversation,
turn, document, passage and fact, so the bodies reach the handlers rather than a 404. Every
response must be below 500 (a 503 that sheds load with Retry-After is an answer, not a
crash), and a response whose status the schema documents must match the schema's body;
statuses the schema leaves out (404, 413, 422, …) are not a failure here. Event streams are
not body-checked. Bounded for CI: a few cases per operation.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from chatbox.app import create_app
from chatbox.engine.registry import ModelRegistry
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user
from tests.security.conftest import roomy

pytestmark = pytest.mark.timeout(240)

EXAMPLES = 15
BUDGET_S = 150


def _own_ids(call: Any, headers: dict[str, str]) -> dict[str, Any]:
    """Mallory's real ids, made through the app before fuzzing."""
    conv = call("POST", "/v1/conversations", json={"title": "fuzz"}).json()["id"]
    doc = call(
        "POST",
        f"/v1/conversations/{conv}/documents",
        files={"file": ("notes.txt", b"The pump needs citric acid. " * 40, "text/plain")},
    ).json()["id"]
    text = call(
        "POST",
        f"/v1/conversations/{conv}/turns",
        json={"content": "What does the pump need?", "max_tokens": 2},
    ).text
    view = call("GET", f"/v1/conversations/{conv}").json()
    turn = view["turns"][-1]["id"] if view["turns"] else "t_none"
    fact = call("PATCH", "/v1/users/me/memory", json={"add": ["Likes pumps"]}).json()
    chunk = None
    if '"chunk_id"' in text:
        import json as _json
        import re

        found = re.search(r'"chunk_id":\s*(\d+)', text)
        chunk = int(found.group(1)) if found else None
        _ = _json
    return {
        "conv_id": conv,
        "turn_id": turn,
        "doc_id": doc,
        "chunk_id": chunk or 1,
        "fact_id": fact["added"][0]["id"],
        "user_id": "me",
    }


def test_every_operation_survives_fuzzing(
    settings: Settings, registry: ModelRegistry, embedder: Any
) -> None:
    from schemathesis.python import asgi

    settings = roomy(settings)
    seed_user(settings)  # the admin
    headers = bearer(seed_user(settings, "mallory", role="member", tier="free"))
    app = create_app(settings, registry)
    schema = schemathesis.openapi.from_asgi("/schema/openapi.json", app)
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    # Destructive operations last, so the real ids stay alive for the others.
    operations.sort(key=lambda op: op.method.upper() == "DELETE")

    def call(method: str, path: str, **kw: Any) -> Any:
        with asgi.get_client(app) as client:
            return client.request(method, f"http://{asgi.HOST}{path}", headers=headers, **kw)

    failures: list[str] = []
    started = time.monotonic()
    try:
        ids = _own_ids(call, headers)
        for op in operations:
            if time.monotonic() - started > BUDGET_S:
                failures.append(f"out of time before {op.label}")
                break
            streaming = op.path.endswith(("/turns", "/events", "/regenerate", "/edit")) or (
                op.path == "/v1/chat/completions"
            )

            run = _fuzzer(op, streaming, ids, headers, failures)
            run()
    finally:
        asgi.shutdown_lifespans()
    # One entry per distinct (operation, status, reason), with one reproducer each.
    distinct: dict[str, str] = {}
    for f in failures:
        head, _, rest = f.partition("\n")
        reason = next(
            (
                ln.strip()
                for ln in rest.splitlines()
                if ln.strip().startswith(("- ", '"')) or "violates" in ln
            ),
            "",
        )
        key = f"{head.split(':', 2)[0]} {head.split('->')[-1].split(':')[0].strip()} {reason}"
        distinct.setdefault(key, f"{head[:300]}\n    {rest.strip().splitlines()[-1][:400]}")
    assert not distinct, (
        f"{len(distinct)} distinct failures fuzzing {len(operations)} "
        "operations:\n" + "\n".join(f"- {k}\n  {v}" for k, v in distinct.items())
    )


def _fuzzer(
    op: Any, streaming: bool, ids: dict[str, Any], headers: dict[str, str], failures: list[str]
) -> Any:
    @hsettings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=op.as_strategy(), aim=st.booleans())
    def run(case: Any, aim: bool) -> None:
        if aim and case.path_parameters:
            for name in list(case.path_parameters):
                if name in ids:
                    case.path_parameters[name] = ids[name]
        response = case.call(headers=headers)
        where = f"{case.method} {case.formatted_path} -> {response.status_code}"
        shed = response.status_code == 503 and "retry-after" in {
            k.lower() for k in response.headers
        }
        if response.status_code >= 500 and not shed:
            failures.append(
                f"{op.label}: {where}: {response.text[:300]}\n"
                f"    reproduce: {case.as_curl_command()}"
            )
            return
        if streaming and "event-stream" in response.headers.get("content-type", ""):
            return
        try:
            case.validate_response(
                response, checks=[not_a_server_error, response_schema_conformance]
            )
        except (AssertionError, Exception, BaseExceptionGroup) as exc:
            failures.append(
                f"{op.label}: {where}: {str(exc)[:400]}\n    reproduce: {case.as_curl_command()}"
            )

    return run
