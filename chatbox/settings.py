"""One settings object for the whole appliance; the only module that reads env vars."""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

ENV_PREFIX = "CHATBOX_"
PRIVATE_DIR_MODE = 0o700  # the data directory and what holds users' data


def _default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "chatbox"


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "chatbox"


EMBEDDING_RUNTIMES = ("onnx", "torch")  # see Settings.embedding_runtime


@dataclass(frozen=True)
class EngineSettings:
    """How each loaded model's llama.cpp context is shaped."""

    n_parallel: int = 8  # sequence slots decoded together
    # KV cells of each model's cache: the unified pool, or shared out among the slots' own
    # streams (as llama-server's -c and -np); capped by the machine's memory (engine/tuning.py)
    n_ctx: int = 16384
    # the most one conversation may hold; 0: n_ctx shared out among the slots (2,048 each by
    # default); a set value gives every slot a stream of that many cells, whatever n_ctx says
    n_ctx_per_seq: int = 0
    # False: each slot has its own KV stream of n_ctx_per_seq cells, as llama-server keeps
    # them, so a token's attention scans only its own conversation. True: one pool of n_ctx
    # cells that sequences share through seq_cp, and idle prefixes may outnumber the slots.
    kv_unified: bool = False
    n_batch: int = 512  # tokens per llama_decode step (decode + prefill chunks)
    n_ubatch: int = 0  # tokens per compute pass; 0: n_batch, at most 256 without flash attention
    n_threads: int = 0  # 0: all cores
    n_gpu_layers: int = -1  # -1: all layers, where llama.cpp was built with GPU support
    # None: chosen for the hardware (engine/tuning.py `attention`): on with GPU offload, a
    # unified pool or a quantized KV cache; on CPU with a stream per slot, whichever kernel
    # is faster on this processor, timed at the first start and remembered in kernel_cache
    # (engine/kernels.py; the app: <cache_dir>/kernels.json; None: plain attention).
    flash_attn: bool | None = None
    kernel_cache: Path | None = None
    # f16, q8_0, q4_0, or keys and values apart ("q8_0/f16"). q8_0 holds about half of f16's
    # bytes, which a small box needs; a quantized V cache is read by flash attention, which
    # our llama.cpp build tiles over it (scripts/patches/; benchmarks/followup.py)
    kv_type: str = "q8_0"
    # host RAM for parked prefixes; -1: an eighth of the model's KV cache, at most a sixteenth
    # of the memory available at load (the disk tier, kv_dir, keeps what does not fit)
    park_bytes: int = -1
    # extra sequence ids that only hold cached prefixes; -1: n_parallel in a unified pool,
    # none with a stream per slot (each would cost a whole stream of cells)
    n_cached_seqs: int = -1
    max_queue: int = 256  # waiting requests before submit() raises EngineBusyError
    prefill_stall_ratio: float = 1.6  # running streams' time per token may grow this much; 0: off
    prefill_chunk: int = 64  # prompt tokens per chunk while other streams are decoding
    idle_kv_cells: int = -1  # idle prefixes live in KV (rest parked); -1: see engine/tuning.py
    cpu_requant: bool = True  # on CPU, serve Q4_1/Q5_1 weights as a cached Q8_0 copy
    kv_dir: Path | None = None  # parked KV on disk (the app: <data_dir>/kv); None: RAM only
    park_disk_bytes: int = 4 * 1024**3  # disk for parked conversations, per model; 0: off
    # prompt-lookup decoding: most tokens guessed per step; 0: off. Answers that copy their
    # context decode faster; guesses are made only where they pay (docs/benchmarks.md).
    lookup_draft: int = 8
    # An answer's tokens reach the event loop at most this often (its first token and its
    # end at once; what came between arrives together); 0: every step (see engine/outbox.py)
    stream_interval_s: float = 0.04


@dataclass(frozen=True)
class Settings:
    """Everything configurable; built once (from env and flags) and passed explicitly."""

    data_dir: Path = field(default_factory=_default_data_dir)
    models_dir: Path | None = None  # default: <data_dir>/models
    cache_dir: Path = field(default_factory=_default_cache_dir)  # derived files, safe to delete
    manifest_path: Path | None = None  # built-in models; default: the repo's models/manifest.toml
    model: str | None = None  # default model name; None: the registry's default
    # The store: None keeps it in SQLite at <data_dir>/chatbox.db; "postgresql://user@host/db"
    # puts it in PostgreSQL, which several fronts can share (docs/scaling.md).
    database_url: str | None = field(default=None, repr=False)
    # A streaming replica of that database: conversation reads (lists, turns, search) go to it,
    # a user's own reads only once it holds their writes; one further behind than
    # database_replica_max_lag_s, or down, serves nothing (reads go to the primary).
    database_replica_url: str | None = field(default=None, repr=False)
    database_replica_max_lag_s: float = 10.0
    host: str = "127.0.0.1"
    port: int = 8000
    max_tokens: int = 512  # default completion budget of a turn
    heartbeat_s: float = 10.0
    disconnect_grace_s: float = 3.0  # a disconnected stream may be resumed this long
    draft_flush_s: float = 0.5  # how often a streaming answer is saved for crash recovery
    # How long a finished answer waits for an unreachable database to store it (it keeps
    # streaming through the outage meanwhile); past it the answer ends "could not be stored".
    answer_store_wait_s: float = 300.0
    max_message_chars: int = 200_000
    # A conversation whose prompt passes this share of the model's per-sequence context (at
    # most 80% of the room left beside an answer) has its oldest part summarised in the
    # background; 0: never (the oldest turns are then dropped, and the UI says which).
    summary_at: float = 0.6
    summary_tokens: int = 256  # the longest summary (and at most an eighth of the context)
    # -- caps on the work one request can ask for (a clear 4xx names the limit) --------------
    max_title_chars: int = 500  # a conversation's title
    max_system_prompt_chars: int = 20_000  # a conversation's system prompt
    max_stop_strings: int = 4  # stop sequences per request (as OpenAI's API)
    max_stop_chars: int = 64  # characters in each stop sequence
    # -- accounts, quotas, routing, overload (admission) ------------------------------------
    admin_password: str | None = field(default=None, repr=False)  # seeds the first admin
    admin_name: str = "admin"
    session_ttl_s: float = 14 * 24 * 3600.0
    cookie_secure: bool = False  # always mark cookies Secure (they are anyway behind TLS)
    policy_path: Path | None = None  # tiers, limits, routing; default: models/policy.toml
    high_water: int = 0  # engine queue depth at which free requests are shed; 0: slots
    login_max_failures: int = 5  # failed logins per account per window before a lockout
    login_max_failures_per_address: int = 20
    login_window_s: float = 900.0
    login_slowdown_s: float = 1.0  # delay of each login to an account past its failure limit
    # On PostgreSQL: how long a front's open answers count against their users' stream limits
    # after the front stops renewing them (it died).
    stream_lease_s: float = 30.0
    # On PostgreSQL: how long a front may be without its liveness lock (a dropped connection
    # it is taking again) before other fronts store its running answers as interrupted.
    front_grace_s: float = 10.0
    # The reverse proxies (CIDRs) whose X-Forwarded-For / X-Forwarded-Proto are believed;
    # env: CHATBOX_TRUSTED_PROXIES="127.0.0.1/32,10.0.0.0/8". Empty: the peer is the client.
    trusted_proxies: tuple[str, ...] = ()
    metrics_token: str | None = field(default=None, repr=False)  # Bearer for GET /metrics
    # -- signing in through the team's identity provider or auth proxy (docs/admin.md) ----------
    # OpenID Connect: the issuer's URL (discovery at <issuer>/.well-known/openid-configuration)
    # and this app's client there; the redirect URI to register is <public_url>/auth/callback.
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: str | None = field(default=None, repr=False)
    oidc_provider_name: str | None = None  # "Sign in with <this>"; default: the issuer's host
    oidc_scopes: tuple[str, ...] = ("openid", "email", "profile")
    oidc_groups_claim: str = "groups"  # the ID token claim the policy's [sign_in] rules read
    oidc_clock_skew_s: float = 60.0  # tolerated difference from the provider's clock
    oidc_timeout_s: float = 10.0  # each request to the provider
    # The URL people reach chatbox at ("https://chat.example.com"); redirect URIs are built
    # from it. None: from each request's own base URL (right without a rewriting proxy).
    public_url: str | None = None
    # False: only the break-glass admin (admin_name) logs in with a password; everyone else
    # signs in through the provider or the proxy.
    password_login: bool = True
    # An auth proxy in front (oauth2-proxy, Authelia, Cloudflare Access): the headers naming
    # the person, their groups (comma-separated) and email, believed only from trusted_proxies.
    trusted_header_user: str | None = None
    trusted_header_groups: str | None = None
    trusted_header_email: str | None = None
    # -- router mode: remote engine replicas (chatbox/cluster) -------------------------------
    # "[openai+]http://host:port[#slots=N&models=a,b]", comma-separated in CHATBOX_REPLICAS
    replicas: tuple[str, ...] = ()
    replica_token: str | None = field(default=None, repr=False)  # the replicas' shared secret
    local_engine: bool = True  # also serve models from this process (the one-box default)
    replica_timeout_s: float = 15.0  # a replica silent this long mid-answer is failed over
    replica_health_s: float = 2.0  # seconds between active health checks
    replica_queue_limit: int = 4  # queued answers past its slots before a replica spills
    admin_key: str | None = field(default=None, repr=False)  # the CLI's key for a front's API
    # -- tools the assistant calls (chatbox/chat/tools) ----------------------------------------
    # More toolboxes beside the built-in ones: "package.module:factory", comma-separated in
    # CHATBOX_TOOLBOXES; each factory is called with no arguments and returns a Toolbox.
    toolboxes: tuple[str, ...] = ()
    front_url: str | None = None  # the front `chatbox replicas` talks to; default host:port
    # -- observability: app metrics, traces, the console's metric history --------------------
    telemetry: bool = True  # app metrics and traces (engine metrics are always kept)
    otlp_endpoint: str | None = None  # env: OTEL_EXPORTER_OTLP_ENDPOINT (the standard name)
    keep_traces: int = 200  # recent traces kept in memory for the console
    console_sample_s: float = 5.0  # how often the console's live plots take a sample
    # Where alerts' changes are posted, as Alertmanager posts to its webhook receivers.
    alert_webhook_url: str | None = None
    # glibc malloc arenas of a serving process (mallopt M_ARENA_MAX): each thread that
    # allocates may otherwise get its own (8 a core), each keeping fragments resident;
    # 0: glibc's default (or MALLOC_ARENA_MAX as set in the environment)
    malloc_arenas: int = 2
    # Pre-warming: load a model ahead of its usual busy hours, unload it idle past them.
    prewarm: bool = True
    prewarm_idle_s: float = 1800.0  # unused this long outside its busy hours: unloaded
    prewarm_step_s: float = 60.0  # how often the pre-warmer looks (and reads the pins)
    # A replay's clock (benchmarks): the hourly usage counts and pre-warming read a time that
    # starts at `replay_start` (seconds since 1970; 0: the real time) and runs `replay_speed`
    # times as fast as the real one.
    replay_start: float = 0.0
    replay_speed: float = 1.0
    # -- knowledge: embeddings, memory, documents, search ------------------------------------
    embedding_model: Path | None = None  # a sentence-transformers dir; default: the packaged one
    embedding_device: str = "cpu"
    # threads per encode (ONNX Runtime's intra-op threads; torch's, process-wide, on the torch
    # path; 0: the library's default, every core). One keeps a message's moderation check
    # fast while answers decode (see knowledge/embedder.py).
    embedding_threads: int = 1
    # "onnx": on CPU, the model runs in ONNX Runtime (exported once into cache_dir and checked
    # against torch; faster for a short message); "torch": sentence-transformers as shipped.
    embedding_runtime: str = "onnx"
    knowledge_tokens: int = 768  # prompt budget for memory facts plus document passages
    memory_top_k: int = 6
    chunk_top_k: int = 4
    memory_idle_s: float = 120.0  # a conversation quiet this long has its facts extracted
    max_upload_bytes: int = 20 * 1024 * 1024
    max_document_chars: int = 2_000_000
    max_pdf_pages: int = 2_000  # pages of one PDF
    max_documents_per_user: int = 1_000  # documents one user keeps (library + attachments)
    max_document_bytes_per_user: int = 1024 * 1024 * 1024  # uploaded bytes one user keeps
    max_embedding_input_chars: int = 20_000  # each /v1/embeddings input
    max_embedding_total_chars: int = 1_000_000  # all of one /v1/embeddings request's inputs
    max_memory_add: int = 50  # facts one memory PATCH may add
    max_fact_chars: int = 500  # characters in one fact added by hand
    knowledge_index_bytes: int = 512 * 1024 * 1024  # in-RAM vectors (exact search); 0: off
    # -- data handling: retention, temporary chats, import ------------------------------------
    retention_sweep_s: float = 3600.0  # how often idle conversations past retention are erased
    temporary_chat_idle_s: float = 3600.0  # a temporary chat held in RAM is dropped when idle
    max_import_bytes: int = 64 * 1024 * 1024  # an imported conversations.json (or its zip)
    engine: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self) -> None:
        if self.database_url and not self.database_url.startswith(("postgresql://", "postgres://")):
            raise ValueError("database_url must be a postgresql:// URL")
        if self.database_replica_url and not self.database_url:
            raise ValueError("database_replica_url needs database_url (the primary) set too")
        if self.database_replica_url and not self.database_replica_url.startswith(
            ("postgresql://", "postgres://")
        ):
            raise ValueError("database_replica_url must be a postgresql:// URL")
        for cidr in self.trusted_proxies:  # fail at start, not on the first request
            ipaddress.ip_network(cidr, strict=False)
        # scopes are space-separated in OAuth: "openid email" and "openid,email" both work
        object.__setattr__(
            self, "oidc_scopes", tuple(w for s in self.oidc_scopes for w in s.split())
        )
        _check_sign_in(self)
        if self.embedding_runtime not in EMBEDDING_RUNTIMES:
            raise ValueError(
                f"embedding_runtime must be one of {', '.join(EMBEDDING_RUNTIMES)}, "
                f"not {self.embedding_runtime!r}"
            )

    @property
    def oidc_display_name(self) -> str | None:
        """The name on "Sign in with ...": the configured one, or the issuer's host; None: no
        provider is configured."""
        if not self.oidc_issuer:
            return None
        from urllib.parse import urlsplit

        return self.oidc_provider_name or urlsplit(self.oidc_issuer).hostname or self.oidc_issuer

    @property
    def db_path(self) -> Path:
        return self.data_dir / "chatbox.db"

    @property
    def store_marker_path(self) -> Path:
        """Where `serve` notes that this data directory's store is in PostgreSQL."""
        return self.data_dir / "store-in-postgresql.txt"

    @property
    def database(self) -> Path | str:
        """Where the store lives: the PostgreSQL URL when one is set, else the SQLite file."""
        return self.database_url or self.db_path

    @property
    def models_path(self) -> Path:
        return self.models_dir if self.models_dir is not None else self.data_dir / "models"

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    def ensure_dirs(self) -> None:
        """Create the data directory tree on first run, for this user's eyes only (0700).

        Directories in the data directory are tightened to 0700 even if they existed before;
        a models directory given elsewhere (models_dir) is only made 0700 if created here.
        """
        for path in (self.data_dir, self.models_path, self.files_dir):
            path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        inside = [
            self.data_dir,
            self.files_dir,
            *([self.models_path] if self.models_dir is None else []),
        ]
        for path in inside:
            if path.stat().st_mode & 0o777 != PRIVATE_DIR_MODE:
                try:
                    path.chmod(PRIVATE_DIR_MODE)
                except PermissionError:  # owned by another user (a mounted volume): say so
                    logging.getLogger(__name__).warning(
                        "%s is not ours to make private (0700); other users may read it", path
                    )

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
        for key in ("trusted_proxies", "replicas", "oidc_scopes"):
            if isinstance(top.get(key), str):
                top[key] = _coerce(top[key], "tuple")
            elif key in top:
                top[key] = tuple(top[key])
        return replace(self, engine=replace(self.engine, **eng), **top)


def _check_sign_in(s: Settings) -> None:
    """Sign-in settings that cannot work together fail at start, saying which."""
    if s.oidc_issuer:
        if not s.oidc_client_id:
            raise ValueError("oidc_issuer needs oidc_client_id (the client registered there)")
        if not _https_or_loopback(s.oidc_issuer):
            raise ValueError("oidc_issuer must be an https:// URL (http only on a loopback host)")
        if "openid" not in s.oidc_scopes:
            raise ValueError("oidc_scopes must include openid")
    if s.public_url and not s.public_url.startswith(("https://", "http://")):
        raise ValueError("public_url must be an http(s):// URL")
    if s.trusted_header_user and not s.trusted_proxies:
        raise ValueError(
            "trusted_header_user needs trusted_proxies: the proxy addresses its header is"
            " believed from"
        )


def _https_or_loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "https":
        return bool(parts.hostname)
    return parts.scheme == "http" and parts.hostname in ("localhost", "127.0.0.1", "::1")


def _coerce(raw: str, kind: Any) -> Any:
    text = str(kind)
    if "None" in text and raw.strip().lower() in {"auto", "none"}:
        return None  # an optional setting left to the default
    if text.startswith("tuple"):  # comma-separated
        return tuple(part.strip() for part in raw.split(",") if part.strip())
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
    otlp = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")  # OpenTelemetry's own variable
    if otlp and "otlp_endpoint" not in values:
        values["otlp_endpoint"] = otlp
    return Settings().with_overrides(**values)
