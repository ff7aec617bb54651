"""Schema fuzzing of `chatbox serve` as a user starts it, as a member with an API key.

schemathesis (its command line, as an operator would run it) reads /schema/openapi.json from
the served process and runs every phase it offers: the schema's examples, the coverage
phase (boundary and wrong-type values for every parameter and body field), random fuzzing,
and stateful sequences that feed one response's ids into the next request. Most path ids
are the member's real ones (a conversation, a turn, a document, a fact, a workspace she
belongs to, a share), so requests reach the handlers rather than a 404.

Every check must pass: no 5xx, every status, content type and body as the schema documents,
schema-invalid requests refused, schema-valid ones not refused for their shape (400, 413,
415 and 422 stay allowed there: the semantic refusals a JSON schema cannot express, such as
a message list with no user message). Response times are not checked (shared CI cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served

pytestmark = pytest.mark.timeout(400)

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
PHASES = "examples,coverage,fuzzing,stateful"
MAX_EXAMPLES = 8  # per operation in the fuzzing phase; the coverage phase sets its own
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_headers_conformance,response_schema_conformance,negative_data_rejection,"
    "positive_data_acceptance,missing_required_header,unsupported_method,"
    "allow_header_conformance,use_after_free,ensure_resource_availability"
)
SEMANTIC_REFUSALS = ["2xx", "400", "401", "403", "404", "409", "413", "415", "422", "429"]


def _real_ids(box: Served, key: str) -> dict[str, Any]:
    """Ids the member owns, made through the API before fuzzing."""
    h, url = box.auth(key), box.url
    with httpx.Client(base_url=url, headers=h, timeout=120) as c:
        conv = c.post("/v1/conversations", json={"title": "fuzz"}).json()["id"]
        doc = c.post(
            f"/v1/conversations/{conv}/documents",
            files={"file": ("notes.txt", b"The pump needs citric acid. " * 40, "text/plain")},
        ).json()["id"]
        c.post(f"/v1/conversations/{conv}/turns", json={"content": "Pump?", "max_tokens": 2})
        turn = c.get(f"/v1/conversations/{conv}").json()["turns"][-1]["id"]
        fact = c.patch("/v1/users/me/memory", json={"add": ["Likes pumps"]}).json()
        share = c.post(f"/v1/conversations/{conv}/shares", json={}).json()["id"]
    with httpx.Client(base_url=url, headers=box.admin, timeout=60) as admin:
        ws = admin.post("/v1/workspaces", json={"name": "fuzz team"}).json()["id"]
        admin.post(f"/v1/workspaces/{ws}/members", json={"name": "mallory"})
    return {
        "conv_id": conv,
        "turn_id": turn,
        "doc_id": doc,
        "fact_id": fact["added"][0]["id"],
        "user_id": "me",
        "share_id": share,
        "ws_id": ws,
    }


def _config(ids: dict[str, Any]) -> str:
    """schemathesis.toml: each real id used for most requests to its path parameter."""
    lines = []
    for name, value in ids.items():
        lines += [f"[dictionaries.{name}]", f"values = [{json.dumps(value)}]", ""]
    lines.append("[parameters]")
    lines += [f'"path.{n}" = {{ dictionary = "{n}", probability = 0.8 }}' for n in ids]
    lines += [
        "",
        "[checks.positive_data_acceptance]",
        f"expected-statuses = {json.dumps(SEMANTIC_REFUSALS)}",
    ]
    return "\n".join(lines) + "\n"


def test_served_schema_holds_under_every_phase(tmp_path: Path, tiny_gguf: Path) -> None:
    with Served(tmp_path, model=tiny_gguf) as box:
        key = box.user("mallory", tier="paid")
        config = tmp_path / "schemathesis.toml"
        config.write_text(_config(_real_ids(box, key)))
        run = subprocess.run(
            [
                SCHEMATHESIS,
                "--config-file",
                str(config),
                "--no-color",
                "run",
                f"{box.url}/schema/openapi.json",
                "--header",
                f"Authorization: Bearer {key}",
                "--phases",
                PHASES,
                "--checks",
                CHECKS,
                "--max-examples",
                str(MAX_EXAMPLES),
                "--generation-deterministic",
                "--workers",
                "1",
                "--request-timeout",
                "120",
                "--no-shrink",
            ],
            capture_output=True,
            text=True,
            timeout=330,
            cwd=tmp_path,  # its cache (.schemathesis/) goes there, not into the checkout
        )
        report = run.stdout + run.stderr
        assert run.returncode == 0, report[-12000:] + "\n--- server log ---\n" + box.log()[-3000:]
        assert "Traceback" not in box.log(), box.log()[-6000:]
