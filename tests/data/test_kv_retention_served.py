"""Parked KV under zero-data-retention and account erasure, against `chatbox serve`: the
token ids in a parked file are the prompt's text (the model's tokenizer turns them straight
back), so each check decodes every file under `kv/` and looks for the test's own words."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.chat.policy import default_policy_path
from chatbox.engine.kv.disk import SUFFIX, parked_tokens
from tests.served import Served, files_holding

NONE = {"X-Chatbox-Retention": "none"}
PADDING = "The harbour log lists every ship that came in and every storm that passed. " * 4
PRIVATE_TIER = """
[tiers.private]
rpm = 120
tpm = 200000
max_streams = 4
priority = 2
zero_retention = true
"""
NO_MODERATION = """
[moderation]
enabled = false
"""
# Output moderation flags every answer (a rule matching any character): a queue item each.
MODERATION = """
[moderation]
window_tokens = 8
stride_tokens = 4
[[moderation.rules]]
name = "everything"
patterns = ["[\\\\s\\\\S]"]
category = "audit"
action = "flag"
directions = ["output"]
"""


CHATGPT_CONV = {
    "id": "c1",
    "title": "zedimport",
    "create_time": 1700000000.0,
    "update_time": 1700000000.0,
    "current_node": "n2",
    "mapping": {
        "n1": {"id": "n1", "message": None, "parent": None, "children": ["n2"]},
        "n2": {
            "id": "n2",
            "message": {
                "id": "n2",
                "author": {"role": "user"},
                "content": {"content_type": "text", "parts": ["zedimport says hello"]},
                "create_time": 1700000000.0,
            },
            "parent": "n1",
            "children": [],
        },
    },
}


class Decoder:
    """The tiny model's tokenizer, turning parked files' token ids back into text."""

    def __init__(self, gguf: Path) -> None:
        from chatbox.engine.llama import Model

        self.model = Model(gguf, n_gpu_layers=0, vocab_only=True)

    def texts(self, data_dir: Path) -> dict[str, str]:
        """Every parked KV file under the data directory and the text its tokens say."""
        out = {}
        for path in (data_dir / "kv").rglob("*" + SUFFIX):
            tokens = parked_tokens(path)
            if tokens is not None:
                raw = b"".join(self.model.piece(t, special=True) for t in tokens)
                out[str(path)] = raw.decode("utf-8", "replace")
        return out

    def holding(self, data_dir: Path, *words: str) -> list[str]:
        """The words some parked file under data_dir decodes to."""
        texts = self.texts(data_dir).values()
        return [w for w in words if any(w in t for t in texts)]

    def wait_for(self, data_dir: Path, word: str, timeout_s: float = 60.0) -> None:
        """Until a parked file decodes to word (the engine parks idle conversations ahead)."""
        deadline = time.monotonic() + timeout_s
        while not self.holding(data_dir, word):
            assert time.monotonic() < deadline, f"{word} was never parked"
            time.sleep(0.25)


@pytest.fixture(scope="module")
def decoder(tiny_gguf: Path) -> Decoder:
    return Decoder(tiny_gguf)


def policy_file(where: Path, moderation: bool = False) -> Path:
    """The shipped policy plus a zero-retention tier, with moderation off (these tests are
    about KV: no classifier to train, no answer cut) or flagging every answer."""
    head = default_policy_path().read_text().split("[moderation]", 1)[0]
    path = where / "policy.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + PRIVATE_TIER + (MODERATION if moderation else NO_MODERATION))
    return path


def complete(box: Served, key: str, word: str, headers: dict[str, str] | None = None) -> None:
    body = {
        "model": "tiny",
        "max_tokens": 12,
        "messages": [
            {"role": "system", "content": f"You keep the harbour log. {PADDING}"},
            {"role": "user", "content": f"Note the ship {word}. {PADDING}"},
        ],
    }
    r = httpx.post(
        box.url + "/v1/chat/completions",
        json=body,
        headers={**box.auth(key), **(headers or {})},
        timeout=120,
    )
    assert r.status_code == 200, r.text


def converse(box: Served, key: str, word: str, headers: dict[str, str] | None = None) -> str:
    """One turn in a new conversation (a temporary one under zero retention); its id."""
    h = {**box.auth(key), **(headers or {})}
    made = httpx.post(box.url + "/v1/conversations", json={"model": "tiny"}, headers=h, timeout=30)
    conv = made.json()["id"]
    r = httpx.post(
        f"{box.url}/v1/conversations/{conv}/turns",
        json={"content": f"Note the ship {word}. {PADDING}"},
        headers=h,
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert "event: done" in r.text, r.text[-500:]
    return str(conv)


def key_id(box: Served, name: str, secret: str) -> str:
    """The id of the user's key that starts as `secret` does (`keys list`)."""
    rows = [r.split() for r in box.cli("keys", "list", "--user", name).splitlines()[1:]]
    return next(r[0] for r in rows if secret.startswith(r[1].rstrip("…")))


@pytest.fixture
def box(tmp_path: Path, tiny_gguf: Path) -> Iterator[Served]:
    # RAM enough to park ahead every conversation here (the default is sized from the KV cache).
    env = {"CHATBOX_PARK_BYTES": str(64 << 20)}
    served = Served(tmp_path, model=tiny_gguf, policy=policy_file(tmp_path), env=env)
    try:
        yield served
    finally:
        served.kill()


def zdr_words(box: Served, keys: dict[str, str], round_: int) -> list[str]:
    """A completion or chat under every kind of zero-data-retention; each one's word."""
    kinds = ("header", "key", "user", "tier", "temporary")
    words = [f"zdr{kind}{round_}x" for kind in kinds]
    complete(box, keys["ann"], words[0], NONE)
    complete(box, keys["ann-zdr"], words[1])
    complete(box, keys["bob"], words[2])
    complete(box, keys["tia"], words[3])
    converse(box, keys["ann"], words[4], NONE)
    return words


def test_zero_retention_keeps_no_kv_through_a_stop_a_kill_and_a_restart(
    box: Served, decoder: Decoder
) -> None:
    ann = box.user("ann")
    keys = {"ann": ann, "bob": box.user("bob"), "tia": box.user("tia", tier="private")}
    keys["ann-zdr"] = box.cli("keys", "create", "--user", "ann").strip().splitlines()[-1]
    box.cli("keys", "set-retention", key_id(box, "ann", keys["ann-zdr"]), "none")
    box.cli("users", "set-retention", "bob", "none")
    data = box.data_dir
    box.start()
    words = zdr_words(box, keys, 1)
    complete(box, ann, "keptship1x")  # an ordinary completion: it is parked (the control)
    decoder.wait_for(data, "keptship1x")
    assert decoder.holding(data, *words) == []
    box.kill()  # kill -9, with the ZDR requests' KV as they were
    assert decoder.holding(data, *words) == []
    box.start()
    assert decoder.holding(data, *words) == []
    again = zdr_words(box, keys, 2)
    box.stop()  # a clean stop parks every idle conversation it still holds
    assert decoder.holding(data, "keptship1x")
    assert decoder.holding(data, *words, *again) == []
    for word in [*words, *again]:
        assert files_holding(data, word) == [], word


def test_the_cli_erases_a_users_kv_while_the_server_runs_and_it_never_comes_back(
    box: Served, decoder: Decoder
) -> None:
    keys = {n: box.user(n) for n in ("finn", "dan", "eve", "cara")}
    data = box.data_dir
    box.start()
    for name, key in keys.items():  # cara's last: live in the server's KV cache, as she is
        converse(box, key, f"{name}convship")  # erased, and parked again at a stop unless
        complete(box, key, f"{name}apiship")  # the erasure stops it
    decoder.wait_for(data, "caraapiship")
    cara = ["caraconvship", "caraapiship"]
    assert decoder.holding(data, *cara) == cara  # parked ahead, as any idle conversation
    box.cli("users", "delete", "cara", "--yes")  # while the server runs
    assert decoder.holding(data, *cara) == []
    r = httpx.delete(box.url + "/v1/admin/users/dan", headers=box.admin, timeout=60)
    assert r.status_code == 204, r.text
    r = httpx.post(
        box.url + "/v1/users/me/delete",
        json={"confirm": "eve"},
        headers=box.auth(keys["eve"]),
        timeout=60,
    )
    assert r.status_code == 204, r.text
    erased = [*cara, "danconvship", "danapiship", "eveconvship", "eveapiship"]
    assert decoder.holding(data, *erased) == []
    box.stop()  # the server still held cara's conversations live: none is parked again
    assert decoder.holding(data, *erased) == []
    assert decoder.holding(data, "finnconvship", "finnapiship")  # the rest stays warm


def test_a_zero_retention_answers_review_item_keeps_no_text(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    box = Served(tmp_path, model=tiny_gguf, policy=policy_file(tmp_path, moderation=True))
    key = box.user("ann")
    with box:
        complete(box, key, "reviewship", NONE)
    items: list[dict[str, Any]] = json.loads(
        box.cli("moderation", "list", "--json", "--status", "open")
    )
    mine = [i for i in items if i["user"]["name"] == "ann" and i["direction"] == "output"]
    assert mine, items
    assert [i["has_text"] for i in mine] == [False] * len(mine)


def test_per_user_and_tier_zero_retention_refuse_what_would_be_stored(box: Served) -> None:
    key = box.user("zed")
    box.cli("users", "set-retention", "zed", "none")
    tier_key = box.user("tom", tier="private")
    with box:
        doc = ("t.txt", "The vault word is tomvault. " * 30, "text/plain")
        h = box.auth(tier_key)
        r = httpx.post(box.url + "/v1/documents", files={"file": doc}, headers=h, timeout=60)
        assert r.status_code == 422 and "zero-data-retention" in r.text, r.text
        h = box.auth(key)
        got = httpx.get(box.url + "/v1/users/me/retention", headers=h, timeout=30).json()
        assert got["zero_retention"] is True
        assert not re.search(r"kept until", got["keeps"]) and got["keeps"].startswith("Nothing")
        doc = ("s.txt", "The vault word is zedvault. " * 30, "text/plain")
        r = httpx.post(box.url + "/v1/documents", files={"file": doc}, headers=h, timeout=60)
        assert r.status_code == 422 and "zero-data-retention" in r.text, r.text
        r = httpx.patch(
            box.url + "/v1/users/me/memory", json={"add": ["zed likes zedfact"]}, headers=h
        )
        assert r.status_code == 422 and "zero-data-retention" in r.text, r.text
        convs = json.dumps([CHATGPT_CONV]).encode()
        r = httpx.post(
            box.url + "/v1/users/me/import",
            files={"file": ("conversations.json", convs, "application/json")},
            headers=h,
            timeout=60,
        )
        assert r.status_code == 422 and "zero-data-retention" in r.text, r.text
    for word in ("zedvault", "zedfact", "zedimport", "tomvault"):
        assert files_holding(box.data_dir, word) == [], word
