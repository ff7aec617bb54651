"""How a context is shaped from the settings: threads, and the idle prefix-cache budget."""

from __future__ import annotations

from chatbox.settings import EngineSettings


def decode_threads(configured: int, cores: int) -> tuple[int, int]:
    """llama.cpp threads for one-token steps and for batches of several tokens.

    A configured count is used for both. By default batches use every core, but a lone
    stream's one-token steps leave one core to this process's Python side (the decode
    thread's sampling and the event loop): llama.cpp's worker threads spin between steps,
    so on a small machine a spinning worker and the event loop fight for the same core
    (measured on 2 cores: one stream 136 tokens/s with one thread, 79 with two).
    """
    if configured > 0:
        return configured, configured
    return max(1, cores - 1), cores


def idle_cell_budget(configured: int, n_ctx: int, n_ctx_per_seq: int) -> int:
    """KV cells that idle cached prefixes may keep live (the rest are parked or dropped).

    Live idle cells cost every step a little attention work, so by default they get a
    quarter of the cache, but never less than one whole conversation: a smaller budget
    would evict the conversation that just ended before its next turn (with
    `--n-ctx 4096` every follow-up was a cold start). Running streams still take cells
    from idle prefixes whenever they need them.
    """
    if configured >= 0:
        return configured
    return min(n_ctx, max(n_ctx // 4, n_ctx_per_seq))


def prefix_cache_warning(s: EngineSettings, n_ctx: int, n_ctx_per_seq: int) -> str | None:
    """Why this configuration cannot keep a conversation's prefix between its turns, if so."""
    budget = idle_cell_budget(s.idle_kv_cells, n_ctx, n_ctx_per_seq)
    if budget >= n_ctx_per_seq:
        return None
    where = (
        "are parked in host RAM (park_bytes) and restored, or recomputed once that is full"
        if s.park_bytes > 0 or s.kv_dir is not None
        else "lose their cached prefix and are recomputed on every turn (park_bytes is 0)"
    )
    return (
        f"idle_kv_cells={budget} holds less than one conversation ({n_ctx_per_seq} tokens): "
        f"conversations longer than {budget} tokens {where}; "
        f"set idle_kv_cells to -1 (default) or >= {n_ctx_per_seq} to keep them in the KV cache"
    )
