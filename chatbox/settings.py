"""One settings object for the whole appliance; the only module that reads env vars."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

ENV_PREFIX = "CHATBOX_"


def _default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "chatbox"


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "chatbox"


@dataclass(frozen=True)
class EngineSettings:
    """How each loaded model's llama.cpp context is shaped."""

    n_parallel: int = 8  # sequence slots decoded together
    n_ctx: int = 16384  # total KV cells shared by all slots
    n_ctx_per_seq: int = 4096  # the most one conversation may hold
    n_batch: int = 512  # tokens per llama_decode step (decode + prefill chunks)
    n_threads: int = 0  # 0: all cores
    n_gpu_layers: int = -1  # -1: all layers, where llama.cpp was built with GPU support
    flash_attn: bool = True  # on CPU too: masked cells of other sequences are skipped
    kv_type: str = "f16"  # f16, q8_0, q4_0
    park_bytes: int = 256 * 1024 * 1024  # host RAM for parked prefixes
    n_cached_seqs: int = -1  # extra sequence ids that only hold cached prefixes; -1: n_parallel
    max_queue: int = 256  # waiting requests before submit() raises EngineBusyError
    prefill_stall_ratio: float = 1.6  # running streams' time per token may grow this much; 0: off
    prefill_chunk: int = 64  # prompt tokens per chunk while other streams are decoding
    idle_kv_cells: int = -1  # idle cached prefixes kept live in KV (rest parked); -1: n_ctx/4
    cpu_requant: bool = True  # on CPU, serve Q4_1/Q5_1 weights as a cached Q8_0 copy


@dataclass(frozen=True)
class Settings:
    """Everything configurable; built once (from env and flags) and passed explicitly."""

    data_dir: Path = field(default_factory=_default_data_dir)
    models_dir: Path | None = None  # default: <data_dir>/models
    cache_dir: Path = field(default_factory=_default_cache_dir)  # derived files, safe to delete
    manifest_path: Path | None = None  # built-in models; default: the repo's models/manifest.toml
    model: str | None = None  # default model name; None: the registry's default
    host: str = "127.0.0.1"
    port: int = 8000
    max_tokens: int = 512  # default completion budget of a turn
    heartbeat_s: float = 10.0
    disconnect_grace_s: float = 3.0  # a disconnected stream may be resumed this long
    draft_flush_s: float = 0.5  # how often a streaming answer is saved for crash recovery
    max_message_chars: int = 200_000
    # -- accounts, quotas, routing, overload (the gateway) ----------------------------------
    admin_password: str | None = field(default=None, repr=False)  # seeds the first admin
    admin_name: str = "admin"
    session_ttl_s: float = 14 * 24 * 3600.0
    cookie_secure: bool = False  # always mark cookies Secure (they are anyway behind TLS)
    policy_path: Path | None = None  # tiers, limits, routing; default: models/policy.toml
    high_water: int = 0  # engine queue depth at which free requests are shed; 0: slots
    login_max_failures: int = 5  # failed logins per account per window before a lockout
    login_max_failures_per_address: int = 20
    login_window_s: float = 900.0
    # -- knowledge: embeddings, memory, documents, search ------------------------------------
    embedding_model: Path | None = None  # a sentence-transformers dir; default: the packaged one
    embedding_device: str = "cpu"
    knowledge_tokens: int = 768  # prompt budget for memory facts plus document passages
    memory_top_k: int = 6
    chunk_top_k: int = 4
    memory_idle_s: float = 120.0  # a conversation quiet this long has its facts extracted
    max_upload_bytes: int = 20 * 1024 * 1024
    max_document_chars: int = 2_000_000
    knowledge_index_bytes: int = 512 * 1024 * 1024  # in-RAM vectors (exact search); 0: off
    engine: EngineSettings = field(default_factory=EngineSettings)

    @property
    def db_path(self) -> Path:
        return self.data_dir / "chatbox.db"

    @property
    def models_path(self) -> Path:
        return self.models_dir if self.models_dir is not None else self.data_dir / "models"

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    def ensure_dirs(self) -> None:
        """Create the data directory tree on first run."""
        for path in (self.data_dir, self.models_path, self.files_dir):
            path.mkdir(parents=True, exist_ok=True)

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with non-None overrides; engine fields may be given by name too."""
        engine_names = {f.name for f in fields(EngineSettings)}
        top = {k: v for k, v in overrides.items() if v is not None and k not in engine_names}
        eng = {k: v for k, v in overrides.items() if v is not None and k in engine_names}
        if "data_dir" in top:
            top["data_dir"] = Path(top["data_dir"]).expanduser()
        for key in ("models_dir", "policy_path", "manifest_path", "cache_dir"):
            if key in top:
                top[key] = Path(top[key]).expanduser()
        return replace(self, engine=replace(self.engine, **eng), **top)


def _coerce(raw: str, kind: Any) -> Any:
    text = str(kind)
    if "bool" in text:
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if "int" in text:
        return int(raw)
    if "float" in text:
        return float(raw)
    if "Path" in text:
        return Path(raw).expanduser()
    return raw


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Read CHATBOX_* variables (e.g. CHATBOX_DATA_DIR, CHATBOX_N_PARALLEL)."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for group in (Settings, EngineSettings):
        for f in fields(group):
            if f.name == "engine":
                continue
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _coerce(raw, f.type)
    return Settings().with_overrides(**values)
