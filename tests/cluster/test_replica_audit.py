"""Every change to the replica table through the admin API is in the audit log, with its actor."""

from __future__ import annotations

import json

from click.testing import CliRunner
from litestar.testing import TestClient

from chatbox.cli import main
from chatbox.settings import Settings
from tests.conftest import store_env

DOWN = "http://127.0.0.1:9"  # the discard port: nothing answers, so the replica stays down


def test_adding_draining_and_removing_a_replica_are_audited(
    client: TestClient, settings: Settings
) -> None:
    added = client.post("/v1/admin/replicas/", json={"url": DOWN})
    assert added.status_code == 201, added.text
    assert client.post("/v1/admin/replicas/drain", json={"url": DOWN}).status_code == 200
    undo = client.post("/v1/admin/replicas/drain", json={"url": DOWN, "undo": True})
    assert undo.status_code == 200
    assert client.delete("/v1/admin/replicas/", params={"url": DOWN}).status_code == 200
    assert client.delete("/v1/admin/replicas/", params={"url": DOWN}).status_code == 404

    env = {
        "CHATBOX_DATA_DIR": str(settings.data_dir),
        "CHATBOX_POLICY_PATH": str(settings.policy_path),
        **store_env(settings.data_dir),
    }
    listed = CliRunner().invoke(main, ["audit", "list", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    entries = [e for e in json.loads(listed.output) if e["action"].startswith("replica.")]
    assert sorted(e["action"] for e in entries) == [
        "replica.add",
        "replica.drain",
        "replica.remove",
        "replica.undrain",
    ]
    assert {e["actor"]["name"] for e in entries} == {"admin"}
