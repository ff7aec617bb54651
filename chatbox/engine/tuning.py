"""How a context is shaped from the settings: threads, the attention kernel, and the idle
prefix-cache budget."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace

from chatbox.cpu import URGENT
from chatbox.settings import EngineSettings

log = logging.getLogger("chatbox.engine")


def available_cores() -> int:
    """Cores this process may run on (a `taskset` or container limit counts, unlike
    os.cpu_count(): two threads pinned to one core would only fight)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def decode_threads(configured: int, cores: int) -> tuple[int, int]:
    """llama.cpp threads for one-token steps and for batches of several tokens, to start
    with (the ThreadTuner then measures the others).

    A configured count is used for both (and nothing else is tried). By default both start
    on every core, which is the faster start even for a lone stream's one-token steps (on 2
    cores one stream decoded ~30% faster with two threads than with one).
    """
    if configured > 0:
        return configured, configured
    return cores, cores


# Without flash attention a compute pass holds a (cells x tokens x heads) f32 score matrix
# for its deepest stream; where that would pass this, flash attention (which holds none) is
# used instead. Passes of 256 tokens keep those scores in the caches, which makes a long
# plain-attention prefill faster than passes of 512.
SCORES_BYTES = 256 * 1024 * 1024
UBATCH_NO_FLASH = 256


def attention(
    s: EngineSettings, offloaded: bool, n_head: int, n_ctx_per_seq: int
) -> EngineSettings:
    """The settings with flash attention and the compute pass (n_ubatch) decided. Where
    plain attention comes out of this by default (CPU, a stream per slot), the engine times
    both kernels at start and may switch to flash attention (kernels.py), because which is
    faster depends on the processor.

    On CPU llama.cpp's flash kernel walks the cached tokens one at a time, while plain
    attention is two matrix products, which can cost far less per cached token deep in a
    conversation (about half, 1,900 tokens deep on a 2-core Xeon). Plain attention pads
    every stream to 256 cells and attends every stream of a pass as deep as its deepest, so
    flash attention wins for short conversations and for a unified pool, whose masked cells
    of other conversations it skips.
    """
    plain_pass = min(s.n_ubatch or UBATCH_NO_FLASH, s.n_batch)
    fa = s.flash_attn
    if fa is None:
        scores = n_ctx_per_seq * plain_pass * max(1, n_head) * 4
        # a unified pool: flash attention skips other conversations' cells (plain scans them)
        fa = offloaded or s.kv_unified or scores > SCORES_BYTES
    v_type = s.kv_type.partition("/")[2] or s.kv_type  # "K/V" or one type for both
    fa = fa or v_type not in ("f16", "f32")  # llama.cpp needs it for a quantized V cache
    ubatch = min(s.n_ubatch or s.n_batch, s.n_batch) if fa else plain_pass
    return replace(s, flash_attn=fa, n_ubatch=ubatch)


KV_MEMORY_SHARE = 4  # one model's KV cache takes at most 1/4 of the memory available at load
PARK_KV_SHARE = 8  # parked KV in RAM: by default an eighth of the model's KV cache...
PARK_MEMORY_SHARE = 16  # ...and at most 1/16 of the memory available at load
MIN_CELLS = 256  # llama.cpp pads a stream to 256 cells: a conversation gets at least this
UNIFIED_PER_SEQ = 4096  # the most one conversation may hold of a unified pool, by default


def memory_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def kv_shape(
    s: EngineSettings, n_slots: int, n_ctx_train: int, cell_bytes: int, available: int
) -> tuple[int, int]:
    """(KV cells of the context, the most one conversation may hold) for these settings.

    With a stream per slot, n_ctx is shared out among the slots unless n_ctx_per_seq asks
    a size; a unified pool is n_ctx cells. Either way the cache takes at most
    1/KV_MEMORY_SHARE of the memory available (where that is known): past it, a unified
    pool gets fewer cells, and each slot's stream fewer, in steps of MIN_CELLS.
    """
    if s.n_ctx_per_seq > 0:
        per_seq = s.n_ctx_per_seq
    elif s.kv_unified:
        per_seq = min(s.n_ctx, UNIFIED_PER_SEQ)
    else:
        per_seq = max(MIN_CELLS, s.n_ctx // max(1, n_slots))
    if n_ctx_train > 0:
        per_seq = min(per_seq, n_ctx_train)
    cap = available // KV_MEMORY_SHARE // cell_bytes if available > 0 and cell_bytes > 0 else 0
    if s.kv_unified:
        per_seq = min(per_seq, s.n_ctx)
        n_ctx = max(s.n_ctx, per_seq)
        if cap and n_ctx > cap:
            n_ctx = max(MIN_CELLS, cap // MIN_CELLS * MIN_CELLS)
            per_seq = min(per_seq, n_ctx)
        return n_ctx, per_seq
    if cap and n_slots * per_seq > cap:
        per_seq = min(per_seq, max(MIN_CELLS, cap // n_slots // MIN_CELLS * MIN_CELLS))
    return n_slots * per_seq, per_seq


def park_budget(configured: int, kv_bytes: int, available: int, disk: bool = False) -> int:
    """Host RAM for parked KV: as configured, or (-1) none where the disk tier parks (an
    eighth of the KV cache holds about one long conversation, not worth its resident
    memory beside the disk and the page cache), else 1/PARK_KV_SHARE of the KV cache's
    bytes and at most 1/PARK_MEMORY_SHARE of the memory available."""
    if configured >= 0:
        return configured
    if disk:
        return 0
    budget = kv_bytes // PARK_KV_SHARE
    if available > 0:
        budget = min(budget, available // PARK_MEMORY_SHARE)
    return budget


def idle_cell_budget(
    configured: int, n_ctx: int, n_ctx_per_seq: int, parking: bool, unified: bool = True
) -> tuple[int, int]:
    """KV cells that idle cached prefixes may keep live (the rest are parked or dropped):
    (while two or more streams decode, otherwise).

    Live idle cells cost every step attention work: the KV cache is one pool, so each
    decoding token scans every cell up to the highest one in use, idle or not (8,192 idle
    cells cost 8 streams about a third of their speed on 2 cores). That cost is paid by
    every stream of a step, so while several decode and prefixes can be parked (host RAM or
    disk), idle prefixes get a sixteenth of the cache and the rest is parked (a parked
    conversation's next turn restores it instead of recomputing it). Otherwise they get a
    quarter, and never less than one whole conversation: a smaller budget would evict the
    conversation that just ended before its next turn, the turn a lone user waits for.
    Running streams still take cells from idle prefixes whenever they need them.

    With a stream per slot, an idle slot's cells cost other streams nothing: idle prefixes
    keep all of them until their slot is taken.
    """
    if configured >= 0:
        return configured, configured
    if not unified:
        return n_ctx, n_ctx
    quiet = min(n_ctx, max(n_ctx // 4, n_ctx_per_seq))
    return (n_ctx // 16 if parking else quiet), quiet


def parks(s: EngineSettings) -> bool:
    """Whether prefixes that leave the KV cache are kept (host RAM or disk)."""
    return s.park_bytes != 0 or s.kv_dir is not None


def prefix_cache_warning(s: EngineSettings, n_ctx: int, n_ctx_per_seq: int) -> str | None:
    """Why this configuration cannot keep a conversation's prefix between its turns, if so."""
    _, budget = idle_cell_budget(s.idle_kv_cells, n_ctx, n_ctx_per_seq, parks(s), s.kv_unified)
    if budget >= n_ctx_per_seq:
        return None
    where = (
        "are parked in host RAM (park_bytes) and restored, or recomputed once that is full"
        if parks(s)
        else "lose their cached prefix and are recomputed on every turn (park_bytes is 0)"
    )
    return (
        f"idle_kv_cells={budget} holds less than one conversation ({n_ctx_per_seq} tokens): "
        f"conversations longer than {budget} tokens {where}; "
        f"set idle_kv_cells to -1 (default) or >= {n_ctx_per_seq} to keep them in the KV cache"
    )


# Steps are compared with steps of a similar size: a one-token step, a few streams, many
# streams, a prefill chunk. Upper bounds of the batch sizes in each bucket.
BUCKETS = (1, 4, 16, 64)
# ...and of a similar depth (the most KV cells a token of the step attends to): a token's
# attention grows with it (a one-token step 1,900 tokens deep costs about twice a shallow
# one), so in one average a try that landed on a shallow step would look faster by the
# depth alone. Upper bounds; deeper steps form a class of their own.
DEPTHS = (1024, 4096)


def depth_class(depth: int) -> int:
    """0 up to DEPTHS[0] cells, 1 up to DEPTHS[1], ..., len(DEPTHS) deeper."""
    return next((i for i, top in enumerate(DEPTHS) if depth <= top), len(DEPTHS))


EXPLORE_EVERY = 24  # steps of a bucket between two tries of another thread count, at first
# A try that loses doubles the wait before the next, up to this: each try is a slower step
# (a try every 24 steps costs a lone stream a few percent), and a steady machine needs few.
# A try that looks faster, or the count in use getting slower by half (the machine got
# busy), brings the wait back to EXPLORE_EVERY.
MAX_EXPLORE_EVERY = 384
# ...but while fewer threads than cores are in use (all of them were slowed for a while),
# all cores are tried again at least this often: the load that made them lose passes, and
# until a try sees that, every step runs slower than it could.
MAX_EXPLORE_FEWER = 48
SLOWER = 1.5
SWITCH_MARGIN = 0.95  # another count must be at least 5% faster to take over


def thread_choices(cores: int) -> tuple[int, ...]:
    """Thread counts worth trying: all cores, all but one, half of them, one."""
    return tuple(sorted({max(1, n) for n in (cores, cores - 1, cores // 2, 1)}, reverse=True))


class ThreadTuner:
    """Picks llama.cpp's thread count per kind of step by measuring, not assuming.

    llama.cpp's worker threads spin at barriers inside every step, so a thread that loses
    its core (to this process's event loop, to the moderation classifier, to anything else
    on the machine) stalls the whole step, and the best count depends on the step's size
    and on the machine's load at the time. So each bucket of step sizes and depths keeps a moving
    average of the time per step for every count it has tried, uses the fastest, and every
    EXPLORE_EVERY steps tries the next count once, so it follows the machine's load; tries
    that keep losing come less often (MAX_EXPLORE_EVERY).

    A step's time is its llama_decode call's alone, where a thread that lost its core shows:
    the event loops are woken only on some steps (engine/outbox.py), so timing from one
    decode's start to the next would charge a lone try a wake-up or not by chance.
    """

    def __init__(self, cores: int, initial: tuple[int, int], explore: bool = True) -> None:
        self.cores = cores
        # A configured count is kept as it is (explore=False): nothing else is tried.
        self.choices = thread_choices(cores) if explore else (initial[1],)
        self.initial = initial
        self.reset()

    def reset(self) -> None:
        """Forget every measurement and start again from the initial counts (what was
        measured while start-up work held the cores says nothing of serving)."""
        one, batch = self.initial
        # buckets: every size at the shortest depth first, then at the next depth, ...
        sizes = [one if b == 1 else batch for b in BUCKETS] + [batch]
        n = len(sizes) * (len(DEPTHS) + 1)
        self.best = sizes * (len(DEPTHS) + 1)
        self.cost: list[dict[int, float]] = [{} for _ in range(n)]
        self.steps = [0] * n
        self._turn = [0] * n
        self.every = [EXPLORE_EVERY] * n  # steps between tries, per bucket
        self._since = [0] * n  # steps since the last try
        self._settled = [0.0] * n  # the count in use's cost at the last try
        self.threads = 0  # the count set on the context (0: its initial counts)
        self._last: tuple[int, int, int] | None = None  # (tokens, threads, depth) under way

    def idle(self) -> None:
        """The decode thread waited or retried: the step under way is not charged."""
        self._last = None

    def begin(
        self, n_tokens: int, set_threads: Callable[[int, int], None], depth: int = 0
    ) -> float:
        """A step of n_tokens, attending to at most `depth` cells, starts now: set its
        thread count; return the start time."""
        want = self.choose(n_tokens, depth)
        held = URGENT.held  # a person waits on other work in this process: leave it cores
        if held:
            want = min(want, max(1, self.cores - held))
        if want != self.threads:
            set_threads(want, want)
            self.threads = want
        # A step squeezed for someone else's work says nothing about its thread count.
        self._last = None if held else (n_tokens, want, depth)
        return time.perf_counter()

    def end(self, seconds: float) -> None:
        """The step begun last spent `seconds` in llama_decode: charge its thread count."""
        if self._last is not None:
            n, threads, depth = self._last
            self._last = None
            self.observe(n, threads, seconds, depth)

    @staticmethod
    def bucket(n_tokens: int, depth: int = 0) -> int:
        size = next((i for i, top in enumerate(BUCKETS) if n_tokens <= top), len(BUCKETS))
        return size + depth_class(depth) * (len(BUCKETS) + 1)

    def choose(self, n_tokens: int, depth: int = 0) -> int:
        """The thread count for the next step of n_tokens tokens at `depth`."""
        b = self.bucket(n_tokens, depth)
        self.steps[b] += 1
        self._since[b] += 1
        if len(self.choices) > 1 and self._since[b] >= self.every[b]:
            self._since[b] = 0
            others = [c for c in self.choices if c != self.best[b]]
            self._turn[b] = (self._turn[b] + 1) % len(others)
            return others[self._turn[b]]
        return self.best[b]

    def observe(self, n_tokens: int, threads: int, seconds: float, depth: int = 0) -> None:
        """A step of n_tokens tokens at `depth` run with `threads` took `seconds`."""
        b = self.bucket(n_tokens, depth)
        per_token = seconds / max(1, n_tokens)
        costs = self.cost[b]
        old = costs.get(threads)
        # The count in use sees many steps (smooth slowly); a tried one few (trust it more).
        alpha = 0.1 if threads == self.best[b] else 0.5
        costs[threads] = per_token if old is None else old + alpha * (per_token - old)
        best = costs.get(self.best[b])
        if threads == self.best[b]:
            if self._settled[b] and costs[threads] > self._settled[b] * SLOWER:
                self.every[b] = EXPLORE_EVERY  # the load changed: look around again soon
                self._settled[b] = costs[threads]
            return
        if best is None:
            return
        self._settled[b] = best
        if per_token < best * SWITCH_MARGIN:  # promising (or a switch): keep trying often
            self.every[b] = EXPLORE_EVERY
        else:
            most = MAX_EXPLORE_EVERY if self.best[b] == self.choices[0] else MAX_EXPLORE_FEWER
            self.every[b] = min(2 * self.every[b], most)
        if costs[threads] < best * SWITCH_MARGIN:
            log.debug(
                "steps of %s tokens now use %d threads instead of %d (%.2f against %.2f ms"
                " a token)",
                self.summary_names()[b],
                threads,
                self.best[b],
                1000 * costs[threads],
                1000 * best,
            )
            self.best[b] = threads
            self._settled[b] = costs[threads]

    @staticmethod
    def summary_names() -> list[str]:
        sizes = [f"<={top}" for top in BUCKETS] + [f">{BUCKETS[-1]}"]
        return sizes + [f"{s} past {d}" for d in DEPTHS for s in sizes]

    def summary(self) -> dict[str, int]:
        """The count in use per bucket, for logs and stats."""
        return dict(zip(self.summary_names(), self.best, strict=True))
