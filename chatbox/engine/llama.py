"""A thin ctypes layer over llama-cpp-python's low-level API: model, context, batch.

Only this module (and sampling.py) touch `llama_cpp`. A `Model` is safe to use from any
thread for tokenizing and detokenizing; a `Context` belongs to exactly one thread.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from chatbox.engine.kv.state import State, StatePool, pointer

log = logging.getLogger("chatbox.engine.llama_cpp")
# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation. llama.cpp's
# info is model-loading chatter (hundreds of lines per load): debug here, not the server log.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
# messages about situations the engine handles itself
_EXPECTED = (b"failed to find a memory slot", b"n_ctx_seq", b"full-size SWA cache")


def _log_to_python(level: int, text: bytes | None, _user: object) -> None:
    if not text or level == 5:  # 5: continuation of the previous line
        return
    lvl = logging.DEBUG if any(e in text for e in _EXPECTED) else _LEVELS.get(level, 10)
    if log.isEnabledFor(lvl):
        log.log(lvl, "%s", text.decode("utf-8", errors="replace").rstrip())


_on_log = llama_cpp.llama_log_callback(_log_to_python)  # module-level: llama.cpp keeps calling it
llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))  # llama.cpp logs go to Python logging

KV_TYPES = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}


def split_kv_type(kv_type: str) -> tuple[str, str]:
    """The K and V cache types of a kv_type: "q8_0" (both) or "q8_0/f16" (keys/values)."""
    k_name, _, v_name = kv_type.partition("/")
    v_name = v_name or k_name
    for name in (k_name, v_name):
        if name not in KV_TYPES:
            raise LlamaError(f"unknown kv_type {kv_type!r}; use one of {sorted(KV_TYPES)}")
    return k_name, v_name


DECODE_OK = 0
DECODE_NO_KV_SPACE = 1

# llama_get_logits_ith returning the row's address as an int: llama_cpp's binding returns a
# ctypes pointer, and viewing that with np.ctypeslib.as_array right after a decode costs
# more than the argmax over the row.
_row_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    ctypes.cast(llama_cpp.llama_get_logits_ith, ctypes.c_void_p).value or 0
)

_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


def supports_gpu_offload() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def quantize(src: Path, dst: Path, ftype: str, threads: int = 0) -> None:
    """Write src re-quantized to `ftype` (e.g. "Q8_0") at dst; llama.cpp's own quantizer."""
    _init_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True  # the source is already quantized
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise LlamaError(f"quantizing {src.name} to {ftype} failed ({rc})")


class LlamaError(RuntimeError):
    """llama.cpp refused to load or decode."""


# bytes per cached value: q8_0 and q4_0 store blocks of 32 with a 2-byte scale
KV_VALUE_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


class Model:
    """A loaded GGUF: weights plus vocabulary. Tokenizing is thread-safe."""

    def __init__(self, path: Path, n_gpu_layers: int = -1, vocab_only: bool = False) -> None:
        _init_backend()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers if supports_gpu_offload() else 0
        self.offloaded = params.n_gpu_layers != 0  # some layers run on a GPU
        params.vocab_only = vocab_only
        self.path = Path(path)
        ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not ptr:
            raise LlamaError(f"llama.cpp could not load {path}")
        self.ptr = ptr
        self.vocab = llama_cpp.llama_model_get_vocab(ptr)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(ptr))
        # attention heads (llama.cpp aborts asking a vocabulary-only model)
        self.n_head = 0 if vocab_only else int(llama_cpp.llama_model_n_head(ptr))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.add_eos = bool(llama_cpp.llama_vocab_get_add_eos(self.vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self.eog_ids = frozenset(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)
        )

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or None."""
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n + 1

    def kv_bytes(self, n_cells: int, kv_type: str) -> int:
        """Bytes of a KV cache of `n_cells` cells of `kv_type` (keys and values, all layers)."""
        arch = self.architecture
        n_layer = int(llama_cpp.llama_model_n_layer(self.ptr))
        n_head = max(1, self.n_head)
        n_head_kv = int(llama_cpp.llama_model_n_head_kv(self.ptr))
        head = int(llama_cpp.llama_model_n_embd(self.ptr)) // n_head
        k_dim = int(self.meta(f"{arch}.attention.key_length") or head)
        v_dim = int(self.meta(f"{arch}.attention.value_length") or head)
        k_name, v_name = split_kv_type(kv_type)
        per_cell = k_dim * KV_VALUE_BYTES[k_name] + v_dim * KV_VALUE_BYTES[v_name]
        return int(n_layer * n_cells * n_head_kv * per_cell)

    def fitting_kv_type(self, kv_type: str) -> str:
        """`kv_type` where this model's heads can hold it: a quantized type stores blocks of
        32 values, so a head of another width keeps that half of its cache in f16."""
        arch = self.architecture
        head = int(llama_cpp.llama_model_n_embd(self.ptr)) // max(1, self.n_head)
        k_dim = int(self.meta(f"{arch}.attention.key_length") or head)
        v_dim = int(self.meta(f"{arch}.attention.value_length") or head)
        k_name, v_name = split_kv_type(kv_type)
        k_name = k_name if k_name in ("f16", "f32") or k_dim % 32 == 0 else "f16"
        v_name = v_name if v_name in ("f16", "f32") or v_dim % 32 == 0 else "f16"
        return k_name if k_name == v_name else f"{k_name}/{v_name}"

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "unknown"

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buf, cap, add_special, parse_special
        )
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buf, cap, add_special, parse_special
            )
        if n < 0:
            raise LlamaError("tokenization failed")
        return list(buf[:n])

    def pieces_split_first(self) -> bool:
        """Whether tokenize() tokenizes the text between special tokens piece by piece
        with nothing carried across (BPE and SentencePiece vocabularies), and adds nothing
        at the end (retokenize.py builds on both)."""
        kind = int(llama_cpp.llama_vocab_type(self.vocab))
        spm_bpe = (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE)
        return kind in spm_bpe and not self.add_eos

    def special_texts(self) -> dict[int, str]:
        """Control and user-defined tokens (the ones a text's literal markup becomes) and
        their texts."""
        wanted = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        get_attr = llama_cpp.llama_vocab_get_attr
        return {
            t: self.piece(t, special=True).decode("utf-8", "replace")
            for t in range(self.n_vocab)
            if get_attr(self.vocab, t) & wanted
        }

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for (control tokens render empty unless special)."""
        if not special and token in self._pieces:
            return self._pieces[token]
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        out = buf.raw[:n]
        if not special:
            self._pieces[token] = out
        return out

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None


@dataclass(frozen=True)
class ContextParams:
    n_ctx: int
    n_seq_max: int
    n_batch: int
    n_threads: int  # for one-token steps (a single stream decoding)
    flash_attn: bool = False
    kv_type: str = "f16"
    n_threads_batch: int = 0  # for steps of several tokens; 0: n_threads
    n_ubatch: int = 0  # tokens per compute pass (a step is split into these); 0: n_batch
    # One pool of cells shared by all sequences (seq_cp shares cells), or one stream of
    # n_ctx / n_seq_max cells per sequence (attention scans only the sequence's own stream).
    kv_unified: bool = True


class Batch:
    """A reusable llama_batch: add (token, pos, seq, wants_logits) rows, then decode."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, 1)
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append one row; return its index (the logits index when logits=True)."""
        i = self.n
        if i >= self.capacity:
            raise LlamaError("batch overflow")
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq
        raw.logits[i] = 1 if logits else 0
        self.n = i + 1
        raw.n_tokens = self.n
        return i

    def free(self) -> None:
        if self.raw is not None:
            llama_cpp.llama_batch_free(self.raw)
            self.raw = None


class Context:
    """A llama_context for up to n_seq_max sequences, with one KV pool or a stream each."""

    def __init__(self, model: Model, p: ContextParams) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = p.n_ctx
        params.n_batch = p.n_batch
        params.n_ubatch = min(p.n_ubatch, p.n_batch) if p.n_ubatch > 0 else p.n_batch
        params.n_seq_max = p.n_seq_max
        params.n_threads = p.n_threads
        params.n_threads_batch = p.n_threads_batch or p.n_threads
        params.kv_unified = p.kv_unified
        params.swa_full = True  # sliding-window layers keep everything: prefixes stay reusable
        params.no_perf = True
        k_name, v_name = split_kv_type(model.fitting_kv_type(p.kv_type))
        # llama.cpp needs flash attention for a quantized V cache (its plain layout is f16/f32)
        quantized_v = v_name not in ("f16", "f32")
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if p.flash_attn or quantized_v
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.type_k = KV_TYPES[k_name]
        params.type_v = KV_TYPES[v_name]
        ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise LlamaError("llama.cpp could not create a context (see its log for why)")
        self.ptr = ptr
        self.model = model
        self.mem = llama_cpp.llama_get_memory(ptr)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ptr))
        self.n_batch = int(llama_cpp.llama_n_batch(ptr))
        self.n_seq_max = int(llama_cpp.llama_n_seq_max(ptr))
        self.kv_unified = p.kv_unified
        self.states = StatePool()  # memory that saved sequence state goes into (kv/state.py)
        self.n_threads, self.n_threads_batch = p.n_threads, p.n_threads_batch or p.n_threads
        self._rows: dict[int, np.ndarray] = {}  # logits row address -> a view of it

    def warm_up(self) -> None:
        """Run one tiny decode so the first real request doesn't pay for buffer setup.

        It runs on one thread: this is not the decode thread, and libgomp gives every
        thread that starts a parallel region its own team of workers for good. Workers
        beyond the machine's cores make libgomp stop spinning at barriers, and every step
        pays for waking them (on 2 cores a lone stream decodes about a third slower after a
        2-thread warm-up here).
        """
        batch = Batch(1)
        try:
            token = self.model.bos if self.model.bos >= 0 else 0
            batch.add(token, 0, 0, True)
            self.set_threads(1, 1)
            self.decode(batch)
        finally:
            self.set_threads(self.n_threads, self.n_threads_batch)
            batch.free()
            self.clear()

    def decode(self, batch: Batch) -> int:
        return int(llama_cpp.llama_decode(self.ptr, batch.raw))

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """Threads for the next steps (one-token steps, larger batches); cheap to call."""
        llama_cpp.llama_set_n_threads(self.ptr, n_threads, n_threads_batch)

    def logits(self, index: int) -> np.ndarray:
        """A copy of the logits row for batch row `index` (after a decode)."""
        return self.row(index).copy()

    def row(self, index: int) -> np.ndarray:
        """The logits row for batch row `index` as a view, valid until the next decode.

        llama.cpp keeps its output buffer from step to step, so the views of its rows are
        kept by address and made once: the decode thread reads a row every step, with
        everything of its own cold in the cache after the weights streamed through.
        """
        addr = _row_address(self.ptr, index)
        if not addr:
            raise LlamaError(f"no logits for batch row {index}")
        view = self._rows.get(addr)
        if view is None:
            if len(self._rows) >= 1024:  # the buffer moved (grown): forget the old rows
                self._rows.clear()
            data = (ctypes.c_float * self.model.n_vocab).from_address(addr)
            view = self._rows[addr] = np.frombuffer(memoryview(data), dtype=np.float32)
        return view

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    def seq_save(self, seq: int) -> State:
        """The sequence's KV as state (for parking in host RAM; see kv/state.py)."""
        size = int(llama_cpp.llama_state_seq_get_size(self.ptr, seq))
        if size <= 0:
            return b""
        buf = self.states.take(size)
        n = int(llama_cpp.llama_state_seq_get_data(self.ptr, pointer(buf), size, seq))
        return buf if n == size else bytes(buf[:n])

    def seq_restore(self, seq: int, data: State) -> bool:
        n = len(data)
        ok = n > 0 and llama_cpp.llama_state_seq_set_data(self.ptr, pointer(data), n, seq)
        return int(ok) > 0

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
