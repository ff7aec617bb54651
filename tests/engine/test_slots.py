"""The slot table's prefix reuse, cell ledger, LRU eviction and parking, against a fake KV."""

from __future__ import annotations

import itertools
import pickle
import random
from pathlib import Path

from chatbox.engine.kv.disk import DiskStore, Erasures
from chatbox.engine.kv.prefixes import common_prefix
from chatbox.engine.kv.slots import MIN_PARK_TOKENS, SlotTable


class FakeKv:
    """A unified KV cache: each sequence is a list of cell ids; cells are shared by seq_cp."""

    def __init__(self) -> None:
        self.seqs: dict[int, list[int]] = {}
        self._ids = itertools.count()

    def decode(self, seq: int, n: int) -> None:
        self.seqs.setdefault(seq, []).extend(next(self._ids) for _ in range(n))

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        assert p1 == -1
        cells = self.seqs.setdefault(seq, [])
        del cells[max(p0, 0) :]
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        assert p0 in (-1, 0) and not self.seqs.get(dst)
        self.seqs[dst] = list(self.seqs.get(src, [])[: p1 if p1 >= 0 else None])

    def seq_save(self, seq: int) -> bytes:
        return pickle.dumps(len(self.seqs.get(seq, [])))

    def seq_restore(self, seq: int, data: bytes) -> bool:
        self.seqs[seq] = []
        self.decode(seq, pickle.loads(data))
        return True

    def used(self) -> int:
        return len({c for cells in self.seqs.values() for c in cells})


def run(
    table: SlotTable,
    kv: FakeKv,
    prompt: list[int],
    key: str | None,
    gen: int = 3,
    scope: str | None = "u",
    public: int = 0,
) -> int:
    """Admit, 'prefill' and 'decode' a request (one user's, by default), release it; return
    reused tokens."""
    adm = table.acquire(prompt, key, scope, public)
    assert adm is not None
    slot = adm.slot
    new = prompt[adm.reused :] + [9000 + i for i in range(gen)]
    kv.decode(slot.seq, len(new))
    table.append(slot, new)
    table.release(slot, keep=True)
    return adm.reused


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0


def test_second_turn_reuses_own_prefix() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 4)
    p1 = list(range(100))
    assert run(t, kv, p1, "a") == 0
    p2 = [*p1, 9000, 9001, 9002, *list(range(500, 520))]
    assert run(t, kv, p2, "a") == 103
    assert kv.used() == t.cells_used()


def test_edited_earlier_message_reuses_what_still_matches() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 4)
    run(t, kv, list(range(100)), "a")
    edited = list(range(40)) + list(range(700, 760))
    assert run(t, kv, edited, "a") == 40
    assert kv.used() == t.cells_used()


def test_shared_system_prompt_is_copied_not_recomputed() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 8)
    system = list(range(200))
    run(t, kv, [*system, 1000, 1001], "a")
    reused = run(t, kv, [*system, 2000, 2001], "b")
    assert reused == 200
    # the 200 system cells are shared, not duplicated
    assert kv.used() == t.cells_used() == (202 + 3) + (2 + 3)


def test_lru_eviction_and_parking_restore() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 2, park_bytes=1 << 20)
    pa = [1, *list(range(1000, 1000 + MIN_PARK_TOKENS * 2))]
    pb = [2, *list(range(3000, 3000 + MIN_PARK_TOKENS * 2))]
    run(t, kv, pa, "a")
    run(t, kv, pb, "b")
    assert t.evict_one()  # evicts "a", the least recently used
    assert "a" in t.parked and t.cached_prefixes == 1
    assert kv.used() == t.cells_used()
    adm = t.acquire([*pa, 5, 6], "a", "u")
    assert adm is not None and adm.source == "parked" and adm.reused == len(pa)
    assert "a" not in t.parked


def test_last_prompt_token_is_never_reused() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 2)
    p = list(range(50))
    run(t, kv, p, "a", gen=0)
    adm = t.acquire(p, "a", "u")
    assert adm is not None and adm.reused == 49


def test_random_ops_keep_ledger_exact() -> None:
    rnd = random.Random(7)
    kv = FakeKv()
    t = SlotTable(kv, 6, park_bytes=1 << 16)
    bases = [[rnd.randrange(50) for _ in range(rnd.randrange(5, 80))] for _ in range(5)]
    for _ in range(400):
        op = rnd.random()
        if op < 0.15:
            t.evict_one()
        else:
            base = rnd.choice(bases)
            prompt = base[: rnd.randrange(1, len(base) + 1)] + [
                rnd.randrange(50) for _ in range(rnd.randrange(1, 20))
            ]
            adm = t.acquire(prompt, rnd.choice(["a", "b", "c", None]), "u")
            if adm is None:
                continue
            assert adm.slot.tokens == prompt[: adm.reused]
            new = [*prompt[adm.reused :], rnd.randrange(50)]
            kv.decode(adm.slot.seq, len(new))
            t.append(adm.slot, new)
            t.release(adm.slot, keep=rnd.random() < 0.8)
        assert kv.used() == t.cells_used()
        for slot in t.slots:
            assert len(kv.seqs.get(slot.seq, [])) == len(slot.tokens)


def test_trim_idle_parks_lru_prefixes_beyond_the_budget() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 6, park_bytes=1 << 20)
    for i in range(4):
        run(t, kv, [100 + i, *range(1000 * i, 1000 * i + 60)], f"c{i}")
    assert t.cells_used() == 4 * 64
    assert t.trim_idle(130) == 2  # c0 and c1 (least recently used) go to RAM
    assert set(t.parked) == {"c0", "c1"} and t.cells_used() == 128
    assert kv.used() == t.cells_used()


def test_another_users_private_prefix_is_never_reused() -> None:
    """The locker-code oracle: what a request reuses must not depend on another user's text."""
    kv = FakeKv()
    t = SlotTable(kv, 4)
    template = list(range(10))  # the chat template's public part
    secret = [*template, 4, 7, 2, 1]
    run(t, kv, secret, "admin-conv", scope="admin", public=len(template))
    reused = {
        g: run(
            t, kv, [*template, 4, g, 99], f"probe-{g}", scope=f"member-{g}", public=len(template)
        )
        for g in range(10)
    }
    assert set(reused.values()) == {len(template)}  # the template only, whatever g is
    assert kv.used() == t.cells_used()


def test_one_user_reuses_their_own_text_across_conversations() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 4)
    run(t, kv, list(range(50)), "c1", scope="alice", public=5)
    assert run(t, kv, [*range(40), 777], "c2", scope="alice", public=5) == 40
    assert run(t, kv, [*range(40), 777], "c3", scope="bob", public=5) == 5


def test_no_scope_shares_only_the_public_prefix() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 4)
    run(t, kv, list(range(50)), None, scope=None, public=8)
    assert run(t, kv, list(range(50)), None, scope=None, public=8) == 8


def test_parked_prefix_is_restored_only_for_its_scope() -> None:
    kv = FakeKv()
    t = SlotTable(kv, 1, park_bytes=1 << 20)
    long = list(range(MIN_PARK_TOKENS + 10))
    run(t, kv, long, "conv", scope="alice")
    run(t, kv, list(range(1000, 1000 + MIN_PARK_TOKENS + 10)), "other", scope="alice")
    assert "conv" in t.parked
    assert run(t, kv, [*long, 5], "conv", scope="mallory") == 0


def test_a_slot_taken_for_its_public_prefix_parks_its_conversation_first() -> None:
    """The only idle slot is also the best match (the template): its conversation is parked
    before the slot is cut to the template, so that conversation's next turn restores it."""
    kv = FakeKv()
    t = SlotTable(kv, 1, park_bytes=1 << 20)
    template = list(range(10))
    a = [*template, *range(100, 100 + MIN_PARK_TOKENS)]
    run(t, kv, a, "a", scope="alice", public=len(template))
    assert run(t, kv, [*template, 5, 6], "b", scope="bob", public=len(template)) == len(template)
    assert "a" in t.parked
    follow_up = [*a, 9000, 9001, 9002, 77]  # run() answered a with 9000..9002
    assert run(t, kv, follow_up, "a", scope="alice", public=len(template)) == len(a) + 3


class StreamKv:
    """A KV cache with a stream per sequence id: each holds the token values it was given;
    a state copy moves them, seq_cp across streams is not allowed (llama.cpp copies only
    whole buffers, at the next decode)."""

    def __init__(self) -> None:
        self.seqs: dict[int, list[int]] = {}
        self.saves = 0

    def put(self, seq: int, tokens: list[int]) -> None:
        self.seqs.setdefault(seq, []).extend(tokens)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        assert p1 == -1
        del self.seqs.setdefault(seq, [])[max(p0, 0) :]
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        raise AssertionError("seq_cp across streams")

    def seq_save(self, seq: int) -> bytes:
        self.saves += 1
        return pickle.dumps(self.seqs.get(seq, []))

    def seq_restore(self, seq: int, data: bytes) -> bool:
        assert not self.seqs.get(seq), "restoring into a stream that is not empty"
        self.seqs[seq] = pickle.loads(data)
        return True


def stream_run(
    t: SlotTable, kv: StreamKv, prompt: list[int], key: str, scope: str = "u", **kw: object
) -> int:
    adm = t.acquire(prompt, key, scope, **kw)  # type: ignore[arg-type]
    assert adm is not None
    new = [*prompt[adm.reused :], 7]
    kv.put(adm.slot.seq, new)
    t.append(adm.slot, new)
    t.release(adm.slot, keep=True)
    return adm.reused


def test_streams_copy_a_shared_prefix_as_state() -> None:
    kv = StreamKv()
    t = SlotTable(kv, 4, shared=False)
    system = list(range(100, 140))
    stream_run(t, kv, [*system, 1, 2, 3], "a")
    assert stream_run(t, kv, [*system, 5, 6], "b") == len(system)
    b = next(s for s in t.slots if s.cache_key == "b")
    assert kv.seqs[b.seq] == b.tokens == [*system, 5, 6, 7]  # a's turn was cut off the copy
    assert t.cells_used() == sum(len(s.tokens) for s in t.slots)  # nothing is shared


def test_arrange_puts_busy_slots_on_consecutive_ids_and_moves_their_kv() -> None:
    kv = StreamKv()
    t = SlotTable(kv, 6, shared=False)
    busy = []
    for i in range(4):
        prompt = [50 * i + k for k in range(20)]
        adm = t.acquire(prompt, f"c{i}", "u")
        assert adm is not None and adm.reused == 0
        kv.put(adm.slot.seq, prompt)
        t.append(adm.slot, prompt)
        busy.append(adm.slot)
    assert sorted(s.seq for s in busy) == [0, 1, 2, 3]
    t.release(busy[0], keep=True)  # c0 ends: busy ids 1, 2, 3 are still one run
    assert t.arrange() == 0
    t.release(busy[2], keep=True)  # c2 ends: 1, 3 leave a hole
    assert t.arrange() == 1
    running = [s for s in t.slots if s.busy]
    ids = sorted(s.seq for s in running)
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    for s in t.slots:  # every slot's KV (busy or cached) moved with it
        assert kv.seqs.get(s.seq, []) == s.tokens
    # the ended conversation is still cached where it now lives: its next turn reuses it
    assert stream_run(t, kv, [*range(100, 120), 7, 8], "c2") == 20


def test_random_ops_with_streams_keep_kv_and_slots_in_step() -> None:
    rnd = random.Random(11)
    kv = StreamKv()
    t = SlotTable(kv, 6, park_bytes=1 << 16, shared=False)
    bases = [[rnd.randrange(50) for _ in range(rnd.randrange(5, 60))] for _ in range(4)]
    running: list[object] = []
    for _ in range(400):
        if running and rnd.random() < 0.45:
            slot = running.pop(rnd.randrange(len(running)))
            t.release(slot, keep=rnd.random() < 0.8)  # type: ignore[arg-type]
        else:
            base = rnd.choice(bases)
            prompt = [*base[: rnd.randrange(1, len(base) + 1)], rnd.randrange(50)]
            adm = t.acquire(prompt, rnd.choice(["a", "b", "c", "d", None]), "u")
            if adm is not None:
                assert kv.seqs.get(adm.slot.seq, []) == prompt[: adm.reused]
                kv.put(adm.slot.seq, prompt[adm.reused :])
                t.append(adm.slot, prompt[adm.reused :])
                running.append(adm.slot)
        t.arrange()
        ids = sorted(s.seq for s in t.slots if s.busy)
        assert not ids or ids == list(range(ids[0], ids[0] + len(ids)))
        assert sorted(s.seq for s in t.slots) == list(range(6))
        for s in t.slots:
            assert kv.seqs.get(s.seq, []) == s.tokens


def test_a_public_head_is_copied_once_then_restored_from_the_heads_cache() -> None:
    """Three users open with the same configured prompt: the second's head is saved out of
    the first's stream, the third's restored from the cache without saving anyone's KV."""
    kv = StreamKv()
    t = SlotTable(kv, 4, shared=False)
    head = list(range(100, 140))
    adm = t.acquire([*head, *range(1, 200)], "a", "user-a", len(head))  # a long first chat
    assert adm is not None
    kv.put(adm.slot.seq, [*head, *range(1, 200)])
    t.append(adm.slot, [*head, *range(1, 200)])
    t.release(adm.slot, keep=True)
    for user in ("user-b", "user-c"):
        saves = kv.saves
        adm = t.acquire([*head, 7, 8], user, user, len(head))
        assert adm is not None and adm.reused == len(head)
        assert kv.seqs[adm.slot.seq] == head  # exactly the head, nobody's text
        copied = kv.saves - saves
        kv.put(adm.slot.seq, [7, 8])
        t.append(adm.slot, [7, 8])
        t.release(adm.slot, keep=True)
        assert copied == (2 if user == "user-b" else 0)  # a's stream and the head; none


def test_a_conversation_parked_ahead_costs_no_save_when_its_slot_is_taken() -> None:
    kv = StreamKv()
    t = SlotTable(kv, 2, park_bytes=1 << 20, shared=False)
    a = list(range(100, 160))
    stream_run(t, kv, a, "a")
    stream_run(t, kv, list(range(200, 260)), "b")
    assert t.park_ahead() and t.park_ahead()  # both idle conversations, one a call
    assert not t.park_ahead()  # nothing is left to park
    saves = kv.saves
    assert "a" in t.parked and any(s.cache_key == "a" for s in t.slots)  # and still live
    stream_run(t, kv, list(range(300, 360)), "c")  # takes a's slot (least recently used)
    assert kv.saves == saves  # a was saved already: its slot only had its KV dropped
    assert stream_run(t, kv, [*a, 7, 1, 2], "a") == len(a) + 1  # a's next turn restores it
    slot = next(s for s in t.slots if s.cache_key == "a")
    assert kv.seqs[slot.seq] == slot.tokens  # the restored KV is what the slot says


def test_a_conversation_that_went_on_after_parking_ahead_is_saved_again() -> None:
    kv = StreamKv()
    t = SlotTable(kv, 1, park_bytes=1 << 20, shared=False)
    a = list(range(100, 160))
    stream_run(t, kv, a, "a")
    assert t.park_ahead() and "a" in t.parked
    longer = [*a, 7, 1, 2, 3]
    assert stream_run(t, kv, longer, "a") == len(a) + 1  # live: its own slot
    assert "a" not in t.parked  # the copy parked ahead is stale now, and gone
    saves = kv.saves
    stream_run(t, kv, list(range(300, 360)), "b")  # a is parked as it is now
    assert kv.saves == saves + 1
    assert stream_run(t, kv, [*longer, 7, 9], "a") == len(longer) + 1


def test_parking_ahead_pushes_no_parked_conversation_out_of_the_budget() -> None:
    kv = StreamKv()
    t = SlotTable(kv, 1, park_bytes=1 << 20, shared=False)
    stream_run(t, kv, list(range(100, 160)), "a")
    stream_run(t, kv, list(range(200, 260)), "b")  # a is parked: a save's size is known
    t.parked.budget = t.park_bytes = t.parked.size + 10  # room for nothing more
    assert not t.park_ahead()
    assert "a" in t.parked and "b" not in t.parked


def test_parking_ahead_reports_no_work_where_nothing_can_be_parked_in_ram() -> None:
    # the idle loop runs park_ahead again at once while it says it did some: with RAM
    # parking off, or a state that does not fit the budget, it must say it did none
    kv = StreamKv()
    off = SlotTable(kv, 1, park_bytes=0, shared=False)
    stream_run(off, kv, list(range(100, 160)), "a")
    assert not off.park_ahead()
    tiny = SlotTable(kv, 1, park_bytes=8, shared=False)  # no state fits in 8 bytes
    stream_run(tiny, kv, list(range(100, 160)), "a")
    saves = kv.saves
    assert not tiny.park_ahead()
    assert kv.saves == saves + 1  # it tried once, and says so


class SavingKv(FakeKv):
    """Counts state saves: every park, to RAM or disk, starts with one."""

    def __init__(self) -> None:
        super().__init__()
        self.saves = 0

    def seq_save(self, seq: int) -> bytes:
        self.saves += 1
        return super().seq_save(seq)


def test_zero_retention_kv_goes_when_its_request_ends_and_no_park_path_saves_it(
    tmp_path: Path,
) -> None:
    kv = SavingKv()
    disk = DiskStore(tmp_path / "kv" / "model", 1 << 20)
    t = SlotTable(kv, 3, park_bytes=1 << 20, disk=disk)
    prompt = list(range(100, 200))
    adm = t.acquire(prompt, "zdr", "u")
    assert adm is not None
    adm.slot.persist = False  # what the scheduler sets for a zero-data-retention request
    kv.decode(adm.slot.seq, len(prompt))
    t.append(adm.slot, prompt)
    fork = t.fork(adm.slot)  # a second answer (n=2) to the same prompt
    assert fork is not None and not fork.persist
    for slot in (adm.slot, fork):
        t.release(slot, keep=True)
    assert all(not s.tokens and s.cache_key is None for s in t.slots)
    assert not any(kv.seqs.values()) and "zdr" not in t.parked
    # every path that parks: ahead of need, trimming, eviction, shutdown
    assert not t.park_ahead()
    t.trim_idle(0)
    t.evict_one()
    assert t.park_all_to_disk() == 0
    disk.close()
    assert kv.saves == 0 and list(disk.root.iterdir()) == []
    assert run(t, kv, [*prompt, 1], "zdr") == 0  # nothing of it is reused either


def test_an_idle_zero_retention_slot_is_never_saved() -> None:
    kv = SavingKv()
    t = SlotTable(kv, 2, park_bytes=1 << 20)
    run(t, kv, list(range(100, 200)), "a")
    slot = next(s for s in t.slots if s.cache_key == "a")
    slot.persist = False  # the park path itself refuses it, wherever it is called from
    assert not t.park_ahead() and t.park_all_to_disk() == 0
    run(t, kv, list(range(300, 400)), "b")
    run(t, kv, list(range(500, 600)), "c")  # a's slot is taken: a is not parked
    assert kv.saves == 0 and "a" not in t.parked


def test_kv_erased_by_another_process_leaves_the_cache_and_ram(tmp_path: Path) -> None:
    kv = SavingKv()
    t = SlotTable(kv, 3, park_bytes=1 << 20, disk=DiskStore(tmp_path / "kv" / "model", 1 << 20))
    run(t, kv, list(range(100, 200)), "a", scope="cara")
    run(t, kv, list(range(300, 400)), "b", scope="finn")
    run(t, kv, list(range(500, 600)), "c", scope="cara")
    assert t.park_ahead() and "a" in t.parked  # in RAM, and live
    assert t.drop_erased() == 0  # nothing was erased
    Erasures(tmp_path / "kv").add(scopes=["cara"])  # `chatbox users delete cara`
    assert t.drop_erased() == 3  # a (live and in RAM) and c
    assert [s.cache_key for s in t.slots if s.tokens] == ["b"] and list(t.parked) == []
    assert t.drop_erased() == 0  # looked at once per erasure
    t.disk.close()  # type: ignore[union-attr]


def test_a_conversation_another_live_slot_holds_nearly_whole_is_not_parked() -> None:
    kv = StreamKv()
    t = SlotTable(kv, 2, park_bytes=1 << 20, shared=False)
    doc = list(range(100, 1200))  # a long message each call sends, then a question of its own
    stream_run(t, kv, [*doc, 1], "a")
    stream_run(t, kv, [*doc, 2], "b")  # copies a's prefix into the other slot
    saves = kv.saves
    assert stream_run(t, kv, [*doc, 3], "c") == len(doc)  # takes a's slot, cut to doc
    assert "a" not in t.parked  # b holds all of a but its last few tokens: nothing saved
    assert kv.saves == saves
    assert stream_run(t, kv, [*doc, 1, 9000, 9001, 9002, 5], "a") == len(doc)  # from b or c
    # a slot of another user does not count: what it holds is no copy this user may use
    kv2 = StreamKv()
    t2 = SlotTable(kv2, 2, park_bytes=1 << 20, shared=False)
    stream_run(t2, kv2, [*doc, 1], "a")
    stream_run(t2, kv2, [*doc, 2], "b", scope="v")
    stream_run(t2, kv2, [*doc, 3], "c", scope="w")  # takes a's slot, the least recently used
    assert "a" in t2.parked
