"""Every erasure overwrites what it erased before it answers: after deleting a document, a
memory fact or a share link, a crash (kill -9) right after leaves none of its words in any
file of the data directory, and neither does the restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatbox.store import content
from tests.served import Served

DOCUMENT = "pangolinquartz4107"
MEMORY = "tamarindvortex2286"
SHARED = "okapilantern6653"
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    served = Served(tmp_path_factory.mktemp("served"), model=tiny_gguf)
    with served:
        yield served


def _anywhere(box: Served, secret: str) -> list[str]:
    """Files holding the word or a part of it (FTS keeps terms prefix-compressed), and on
    PostgreSQL the tables with a live row holding it."""
    parts = (secret, secret[:9], secret[-9:])
    return sorted({f for part in parts for f in box.holding(part)})


def test_deleted_document_memory_and_share_leave_no_word_after_a_crash(box: Served) -> None:
    ann = box.auth(box.user("ann"))
    http = httpx.Client(base_url=box.url, headers=ann, timeout=TIMEOUT)

    doc = http.post(
        "/v1/documents",
        files={"file": ("notes.txt", f"The vault word is {DOCUMENT}. " * 40, "text/plain")},
    )
    assert doc.status_code == 201, doc.text
    fact = http.patch("/v1/users/me/memory", json={"add": [f"Ann's code word is {MEMORY}"]})
    assert fact.status_code == 200, fact.text
    fact_id = next(f["id"] for f in fact.json()["data"] if MEMORY in f["text"])
    conv = http.post("/v1/conversations", json={"title": "a chat"}).json()["id"]
    said = http.post(f"/v1/conversations/{conv}/turns", json={"content": f"say {SHARED}"})
    assert said.status_code == 200, said.text
    share = http.post(f"/v1/conversations/{conv}/shares", json={})
    assert share.status_code == 201, share.text
    # The conversation goes first (its erasure is checked elsewhere): the word is then only
    # in the share's snapshot, which outlives it until revoked.
    assert http.delete(f"/v1/conversations/{conv}").status_code == 204
    for secret in (DOCUMENT, MEMORY, SHARED):
        assert _anywhere(box, secret), f"the test needs {secret} on disk first"

    assert http.delete(f"/v1/documents/{doc.json()['id']}").status_code == 204
    assert http.delete(f"/v1/users/me/memory/{fact_id}").status_code == 204
    assert http.delete(f"/v1/shares/{share.json()['id']}").status_code == 204
    box.kill()
    for secret in (DOCUMENT, MEMORY, SHARED):
        assert _anywhere(box, secret) == [], f"{secret} after kill -9"
    box.start()
    for secret in (DOCUMENT, MEMORY, SHARED):
        assert _anywhere(box, secret) == [], f"{secret} after the restart"
    http.close()


def test_every_file_in_the_data_directory_is_a_declared_artifact(box: Served) -> None:
    ann = httpx.Client(base_url=box.url, headers=box.auth(box.user("cy")), timeout=TIMEOUT)
    conv = ann.post("/v1/conversations", json={}).json()["id"]
    assert ann.post(f"/v1/conversations/{conv}/turns", json={"content": "hi"}).status_code == 200
    ann.close()
    box.stop()  # parks idle conversations' KV on disk
    box.start()
    files = [str(p.relative_to(box.data_dir)) for p in box.files()]
    assert any(f.startswith("kv/") for f in files), files  # the test needs a parked KV file
    assert [f for f in files if content.artifact_of(f) is None] == []
