"""`chatbox serve` on PostgreSQL with a streaming read replica (CHATBOX_DATABASE_REPLICA_URL):
conversation reads go to the replica, the author's own reads to the primary until the
replica holds their write, and everything to the primary while the replica is down.

Where each read went is read from /metrics (`chatbox_store_conversation_reads_total`), never
from timing; lag is made by pausing the replica's replay (`pg_wal_replay_pause()`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chatbox.store import ReadReplica, Store
from tests.pg import PgServer, binaries
from tests.pg_replica import PgReplica, basebackup, run_sql
from tests.served import Served
from tests.sse import parse_sse

pytestmark = pytest.mark.skipif(
    binaries() is None or basebackup() is None,
    reason="PostgreSQL's initdb, pg_ctl and pg_basebackup are not installed "
    "(apt-get install postgresql)",
)

Routes = dict[tuple[str, str], float]


class Cluster:
    """A primary, its replica, one database on both, and `chatbox serve` over them."""

    def __init__(self, primary: PgServer, replica: PgReplica, database: str, box: Served) -> None:
        self.primary, self.replica, self.database, self.box = primary, replica, database, box

    def on_replica(self, sql: str) -> object:
        return self.replica.has(self.database, sql)

    def pause(self) -> None:
        run_sql(self.replica.url(self.database), "SELECT pg_wal_replay_pause()")

    def resume(self) -> None:
        run_sql(self.replica.url(self.database), "SELECT pg_wal_replay_resume()")

    def routes(self) -> Routes:
        """Conversation reads so far, by (served_by, reason)."""
        text = httpx.get(self.box.url + "/metrics", headers=self.box.admin, timeout=30).text
        out: Routes = {}
        for family in text_string_to_metric_families(text):
            if family.name == "chatbox_store_conversation_reads":
                for s in family.samples:
                    if s.name.endswith("_total"):
                        out[(s.labels["served_by"], s.labels["reason"])] = s.value
        return out

    def reads_since(self, before: Routes) -> Routes:
        now = self.routes()
        return {k: v - before.get(k, 0.0) for k, v in now.items() if v != before.get(k, 0.0)}


@pytest.fixture(scope="module")
def cluster(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    primary = PgServer().start()
    replica: PgReplica | None = None
    try:
        replica = PgReplica(primary).start()
        url = primary.fresh_database()
        database = url.rsplit("/", 1)[1]
        replica.wait_for(database, "SELECT count(*) = 0 FROM users")
        env = {
            "CHATBOX_DATABASE_URL": url,
            "CHATBOX_DATABASE_REPLICA_URL": replica.url(database),
            # a paused replay must not count as lag past the limit while a test runs
            "CHATBOX_DATABASE_REPLICA_MAX_LAG_S": "600",
        }
        with Served(tmp_path_factory.mktemp("replica"), model=tiny_gguf, env=env) as box:
            yield Cluster(primary, replica, database, box)
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()


def _person(cluster: Cluster, name: str) -> dict[str, str]:
    """A member with an API key, once the replica holds them."""
    headers = cluster.box.auth(cluster.box.user(name))
    cluster.replica.wait_for(
        cluster.database, f"SELECT count(*) = 1 FROM users WHERE name = '{name}'"
    )
    return headers


def _titles(cluster: Cluster, headers: dict[str, str]) -> list[str]:
    resp = httpx.get(cluster.box.url + "/v1/conversations", headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    return [c["title"] for c in resp.json()["data"]]


def _start(cluster: Cluster, headers: dict[str, str], title: str) -> str:
    """A new conversation, through the API; its id."""
    url = cluster.box.url + "/v1/conversations"
    resp = httpx.post(url, headers=headers, json={"title": title}, timeout=30)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _converse(cluster: Cluster, headers: dict[str, str], title: str, text: str) -> str:
    """A conversation with one turn and its answer, through the API; its id."""
    conv_id = _start(cluster, headers, title)
    url = cluster.box.url + "/v1/conversations"
    body = {"content": text, "max_tokens": 4, "temperature": 0}  # the same answer every run
    with httpx.stream(
        "POST", f"{url}/{conv_id}/turns", headers=headers, json=body, timeout=120
    ) as stream:
        assert stream.status_code == 200
        kinds = [e.event for e in parse_sse(stream.iter_lines())]
    assert kinds[-1] == "done", kinds
    return conv_id


def test_the_author_reads_their_new_conversation_at_once_while_the_replica_lags(
    cluster: Cluster,
) -> None:
    ann = _person(cluster, "ann")
    before = cluster.routes()
    _titles(cluster, ann)
    assert cluster.reads_since(before) == {("replica", "replica"): 1.0}  # the replica serves

    cluster.pause()
    try:
        conv_id = _converse(cluster, ann, "while it lags", "hello from ann")
        assert (
            cluster.on_replica(f"SELECT count(*) FROM turns WHERE conversation_id = '{conv_id}'")
            == 0
        )

        before = cluster.routes()
        assert "while it lags" in _titles(cluster, ann)
        view = httpx.get(f"{cluster.box.url}/v1/conversations/{conv_id}", headers=ann, timeout=30)
        assert view.status_code == 200, view.text
        turns = view.json()["turns"]
        assert [t["role"] for t in turns] == ["user", "assistant"]
        assert turns[0]["content"] == "hello from ann"
        went = cluster.reads_since(before)
        assert went.get(("primary", "own_write"), 0) >= 2 and ("replica", "replica") not in went
    finally:
        cluster.resume()

    # once the replica holds ann's write, her reads go back to it
    cluster.replica.wait_for(
        cluster.database, f"SELECT count(*) = 2 FROM turns WHERE conversation_id = '{conv_id}'"
    )
    before = cluster.routes()
    assert "while it lags" in _titles(cluster, ann)
    assert cluster.reads_since(before) == {("replica", "replica"): 1.0}


def test_another_users_reads_are_served_by_the_replica_while_it_lags(cluster: Cluster) -> None:
    cara, dan = _person(cluster, "cara"), _person(cluster, "dan")
    _start(cluster, dan, "dan's own")
    cluster.replica.wait_for(
        cluster.database, "SELECT count(*) = 1 FROM conversations WHERE title = 'dan''s own'"
    )
    cluster.pause()
    try:
        _start(cluster, cara, "cara's new")
        before = cluster.routes()
        assert _titles(cluster, dan) == ["dan's own"]
        search = httpx.get(
            cluster.box.url + "/v1/search",
            params={"q": "hello", "mode": "words"},
            headers=dan,
            timeout=30,
        )
        assert search.status_code == 200, search.text
        went = cluster.reads_since(before)
        assert went.get(("replica", "replica"), 0) >= 2, went
        assert not any(served == "primary" for served, _ in went), went
    finally:
        cluster.resume()


def test_a_removed_member_stops_seeing_the_workspace_at_once_while_the_replica_lags(
    cluster: Cluster,
) -> None:
    box = cluster.box
    fay, gus = _person(cluster, "fay"), _person(cluster, "gus")
    resp = httpx.post(box.url + "/v1/workspaces", headers=box.admin, json={"name": "team"})
    assert resp.status_code == 201, resp.text
    ws_id = resp.json()["id"]
    members = {}
    for name in ("fay", "gus"):
        added = httpx.post(
            f"{box.url}/v1/workspaces/{ws_id}/members", headers=box.admin, json={"name": name}
        )
        assert added.status_code == 201, added.text
        members[name] = added.json()["user_id"]
    conv_id = _start(cluster, fay, "team plan")
    moved = httpx.post(
        f"{box.url}/v1/conversations/{conv_id}/workspace",
        headers=fay,
        json={"workspace_id": ws_id},
    )
    assert moved.status_code == 200, moved.text
    cluster.replica.wait_for(
        cluster.database, f"SELECT count(*) = 1 FROM conversations WHERE workspace_id = '{ws_id}'"
    )
    assert "team plan" in _titles(cluster, gus)

    cluster.pause()
    try:
        gone = httpx.delete(
            f"{box.url}/v1/workspaces/{ws_id}/members/{members['gus']}", headers=box.admin
        )
        assert gone.status_code == 204, gone.text
        before = cluster.routes()
        assert "team plan" not in _titles(cluster, gus)
        assert cluster.reads_since(before) == {("primary", "own_write"): 1.0}
    finally:
        cluster.resume()


def test_reads_go_to_the_primary_while_the_replica_is_down(cluster: Cluster) -> None:
    eve = _person(cluster, "eve")
    _start(cluster, eve, "eve's")
    cluster.replica.wait_for(
        cluster.database, "SELECT count(*) = 1 FROM conversations WHERE title = 'eve''s'"
    )
    cluster.replica.stop()
    try:
        before = cluster.routes()
        assert _titles(cluster, eve) == ["eve's"]
        assert _titles(cluster, eve) == ["eve's"]
        went = cluster.reads_since(before)
        assert set(went) <= {("primary", "error"), ("primary", "down")}, went
        assert sum(went.values()) >= 2, went
        assert "read replica" in cluster.box.log()
    finally:
        cluster.replica.resume_server()


async def _until(store: Store, routes: list[tuple[str, str]], want: tuple[str, str]) -> None:
    """Read until a conversation read goes where `want` says (the check runs each second)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        await store.conversations.list("nobody")
        if routes[-1] == want:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"reads never went {want}: {routes[-5:]}")


async def test_a_replica_lagging_past_the_limit_serves_nothing_until_it_catches_up(
    cluster: Cluster,
) -> None:
    url = cluster.primary.url(cluster.database)
    store = await Store.open(url, ReadReplica(cluster.replica.url(cluster.database), 0.5))
    routes: list[tuple[str, str]] = []
    store.db.on_read_route = lambda served_by, reason: routes.append((served_by, reason))
    try:
        await _until(store, routes, ("replica", "replica"))
        cluster.pause()
        try:
            assert await store.db.writable()  # the primary moves on; the replica stays behind
            await _until(store, routes, ("primary", "lagging"))
        finally:
            cluster.resume()
        await _until(store, routes, ("replica", "replica"))
    finally:
        await store.close()


async def test_a_job_acting_for_no_one_reads_back_what_it_wrote_while_the_replica_lags(
    cluster: Cluster,
) -> None:
    url = cluster.primary.url(cluster.database)
    store = await Store.open(url, ReadReplica(cluster.replica.url(cluster.database), 600))
    routes: list[tuple[str, str]] = []
    store.db.on_read_route = lambda served_by, reason: routes.append((served_by, reason))
    try:
        await _until(store, routes, ("replica", "replica"))
        cluster.pause()
        try:
            owner = await store.users.create("job-owner")
            conv = await store.conversations.create(owner.id, title="made by a job")
            assert conv.title == "made by a job"  # read back through the replica's router
            assert [c.id for c in await store.conversations.list(owner.id)] == [conv.id]
            assert routes[-2:] == [("primary", "own_write")] * 2
        finally:
            cluster.resume()
    finally:
        await store.close()
