"""Validated configuration, one dataclass per concern.

A bad value raises ``ValueError`` naming the field and the value. Nothing here
reads the environment at import time.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_ROUTER_PORT = 50051
DEFAULT_SCHEDULER_PORT = 50052
DEFAULT_WORKER_PORT = 50053
DEFAULT_HOST = "127.0.0.1"


def cache_dir() -> Path:
    """Where prepared models live: $DSPARK_CACHE or ~/.cache/dspark."""
    return Path(os.environ.get("DSPARK_CACHE", Path.home() / ".cache" / "dspark"))


def default_model_dir() -> Path:
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


MAX_SPECULATIVE_TOKENS = 7
REPO_ROOT = Path(__file__).resolve().parents[1]


def shipped_drafter_dir(model_name: str) -> Path:
    """Where the project's own trained drafter for a model lives (in the repository)."""
    return REPO_ROOT / "drafters" / model_name


# How the scheduler sizes verification (speculative_config "verify"): "fixed" verifies
# every draft; "confidence" gives each step a verify budget from the drafter's
# confidences and the worker's measured forward cost (DSPARK.md section 4).
VERIFY_POLICIES = ("fixed", "confidence")
# The policy of speculative_config "auto" (chosen by measurement, see README).
AUTO_VERIFY_POLICY = "confidence"


def _speculative_dict(text: str) -> dict:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"speculative_config={text!r} is invalid: not JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"speculative_config={text!r} is invalid: must be a JSON object")
    return d


def parse_verify_policy(text: str) -> str:
    """The "verify" key of a speculative config: "fixed" (the default when absent) or
    "confidence"; "auto" -> AUTO_VERIFY_POLICY."""
    if text == "auto":
        return AUTO_VERIFY_POLICY
    v = _speculative_dict(text).get("verify", "fixed")
    if v not in VERIFY_POLICIES:
        raise ValueError(f"speculative_config.verify={v!r} is invalid: must be one of "
                         f"{', '.join(VERIFY_POLICIES)}")
    return v


def parse_sps_profile(text: str):
    """A pinned cost profile, JSON ``{"rows": [1, 8, ...], "forward_ms": [...],
    "draft_fixed_ms": F, "draft_per_request_ms": P, "draft_per_position_ms": Q}``
    (Q optional, 0: every depth costs P) -> SpsProfile (ValueError naming the
    field otherwise)."""
    from dspark.shared.types import SpsProfile

    try:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("must be a JSON object")
        unknown = sorted(set(d) - {"rows", "forward_ms", "draft_fixed_ms",
                                   "draft_per_request_ms", "draft_per_position_ms"})
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        prof = SpsProfile(rows=tuple(int(x) for x in d["rows"]),
                          forward_ms=tuple(float(x) for x in d["forward_ms"]),
                          draft_fixed_ms=float(d.get("draft_fixed_ms", 0.0)),
                          draft_per_request_ms=float(d.get("draft_per_request_ms", 0.0)),
                          draft_per_position_ms=float(d.get("draft_per_position_ms", 0.0)),
                          pinned=True)
        if min(prof.forward_ms) <= 0 or min(prof.draft_fixed_ms, prof.draft_per_request_ms,
                                             prof.draft_per_position_ms) < 0:
            raise ValueError("times must be > 0 (forward) and >= 0 (drafting)")
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"sps_profile={text!r} is invalid: {e}") from None
    return prof


def parse_speculative_config(text: str) -> tuple[int, str]:
    """``{"method": "dspark", "num_speculative_tokens": K[, "model": DIR][, "verify":
    "fixed"|"confidence"]}`` -> (K, drafter dir or ""). K in 0..7; anything else is a
    ValueError naming the field (``parse_verify_policy`` reads "verify")."""
    d = _speculative_dict(text)
    unknown = sorted(set(d) - {"method", "num_speculative_tokens", "model", "verify"})
    if unknown:
        raise ValueError(f"speculative_config has unknown keys {unknown}: allowed are "
                         "method, num_speculative_tokens, model, verify")
    if d.get("method", "dspark") != "dspark":
        raise ValueError(f"speculative_config.method={d.get('method')!r} is invalid: "
                         "must be \"dspark\"")
    k = d.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"speculative_config.num_speculative_tokens={k!r} is invalid: must "
                         f"be an integer in 0..{MAX_SPECULATIVE_TOKENS}")
    model = d.get("model", "")
    if not isinstance(model, str):
        raise ValueError(f"speculative_config.model={model!r} is invalid: must be a path")
    return k, model


def _check(cond: bool, name: str, value, limit: str) -> None:
    if not cond:
        raise ValueError(f"{name}={value!r} is invalid: must be {limit}")


# Fields of the mixins below that each service sets for itself (not passed on by `serve`).
OPS_FIELDS = ("metrics_port", "drain_timeout", "tls_cert", "tls_key", "tls_client_ca",
              "tls_ca", "tls_client_cert", "tls_client_key")


def _check_file(name: str, path: str) -> None:
    _check(not path or Path(path).is_file(), name, path, "a readable file")


@dataclass
class ServerOpsConfig:
    """What every service's server has: metrics, drain, TLS (composed into
    each service's config; fields come first in the flag list)."""

    metrics_port: int = 0  # Prometheus /metrics on host:metrics_port; 0 = off
    drain_timeout: float = 30.0  # seconds in-flight work may take after SIGTERM
    tls_cert: str = ""  # PEM certificate of this service; set = serve TLS only
    tls_key: str = ""  # PEM private key of tls_cert
    tls_client_ca: str = ""  # PEM CA; set = mutual TLS (every port): clients show a cert it signed

    def __post_init__(self) -> None:
        _check(0 <= self.metrics_port < 65536, "metrics_port", self.metrics_port,
               "in 0..65535 (0 = off)")
        _check(self.drain_timeout >= 0, "drain_timeout", self.drain_timeout, ">= 0 seconds")
        _check(bool(self.tls_cert) == bool(self.tls_key), "tls_key", self.tls_key,
               "set together with tls_cert")
        _check(not self.tls_client_ca or bool(self.tls_cert), "tls_client_ca",
               self.tls_client_ca, "used with tls_cert (mutual TLS needs a server certificate)")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            _check_file(name, getattr(self, name))


@dataclass
class UpstreamTLSConfig:
    """How a service reaches its next hop (router -> scheduler -> worker)."""

    tls_ca: str = ""  # PEM CA of the next hop's certificate; set = connect with TLS
    tls_client_cert: str = ""  # our certificate for mutual TLS with the next hop
    tls_client_key: str = ""  # its private key

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(bool(self.tls_client_cert) == bool(self.tls_client_key), "tls_client_key",
               self.tls_client_key, "set together with tls_client_cert")
        _check(not self.tls_client_cert or bool(self.tls_ca), "tls_client_cert",
               self.tls_client_cert, "used with tls_ca")
        for name in ("tls_ca", "tls_client_cert", "tls_client_key"):
            _check_file(name, getattr(self, name))


@dataclass
class PublicAPIConfig:
    """The router's public front doors: OpenAI-compatible HTTP, API keys, limits."""

    http_port: int = 0  # OpenAI-compatible HTTP API on host:http_port; 0 = off
    api_keys_file: str = ""  # one key per line (or NAME KEY); set = keys required
    rate_limit_rps: float = 0.0  # requests/s per API key (no keys: per client IP); 0 = unlimited
    rate_limit_burst: int = 0  # bucket size; 0 = max(1, rate_limit_rps)
    max_request_bytes: int = 4 * 1024 * 1024  # one HTTP body / gRPC message

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(0 <= self.http_port < 65536, "http_port", self.http_port, "in 0..65535 (0 = off)")
        _check(self.rate_limit_rps >= 0, "rate_limit_rps", self.rate_limit_rps, ">= 0")
        _check(self.rate_limit_burst >= 0, "rate_limit_burst", self.rate_limit_burst, ">= 0")
        _check(self.max_request_bytes >= 1024, "max_request_bytes", self.max_request_bytes,
               ">= 1024")
        _check_file("api_keys_file", self.api_keys_file)


@dataclass
class WorkerConfig(ServerOpsConfig):
    """The model runtime of one worker."""

    model: str = ""  # checkpoint directory; "" = the prepared default model
    dtype: str = "auto"  # auto (bf16 where the CPU supports it) | bfloat16 | float32
    device: str = "cpu"  # cpu | cuda | npu
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int = 0  # 0 = size from kv_cache_gib
    kv_cache_gib: float = 1.6  # 32 x 2k tokens of the default model in bf16
    # CPU: write the whole KV pool at start-up so that its memory is resident from
    # the start (a pool too large fails then, not under load); off: pages become
    # resident as the pool fills (a smaller footprint while it is mostly empty)
    kv_prefault: bool = True
    max_model_len: int = 0  # 0 = the model's context length
    tap_layer_ids: tuple[int, ...] = (8, 16, 24)  # hidden states captured as tap rows
    host: str = DEFAULT_HOST
    port: int = DEFAULT_WORKER_PORT
    num_threads: int = 0  # torch intra-op threads; 0 = torch's default
    # attention of decode rows and verify windows: "auto" = the native CPU kernel
    # (built by `make setup`, see worker/model/native_attention.py) when it is
    # available, else PyTorch; "native" = the kernel or a start-up error; "torch"
    attention: str = "auto"
    # linear layers of a model on CPU, fp32 or (AVX512-BF16) bf16: "auto" = the
    # native kernel (built by `make setup`, see worker/model/native_linear.py)
    # when it is available, else oneDNN's packed weights; "native" = the kernel
    # or a start-up error; "torch" = oneDNN (F.linear where oneDNN is missing).
    linear: str = "auto"
    # matrices stored as GGUF blocks (the default model's Q4_1 / Q8_0, kept by its
    # conversion): "auto" = the native fp32 linear computes from the blocks where
    # it runs and the model has them (the same values as the dense fp32 weights,
    # ~1/5 of the bytes a step reads); "on" = that or a start-up error; "off" =
    # the dense weights
    gguf_weights: str = "auto"
    # "auto": K = 7 with the shipped drafter when serving the default model and it
    # is present (verify: AUTO_VERIFY_POLICY), else no speculation; or JSON
    # {"method": "dspark", "num_speculative_tokens": K[, "verify": "fixed" |
    # "confidence"]} with K in 0..7 (0 = the drafter is not loaded; verify
    # defaults to "fixed").
    speculative_config: str = "auto"
    drafter: str = ""  # drafter checkpoint dir ("" = the shipped one for the model)
    num_leases: int = 64  # drafter leases (requests speculating at once)
    # Confidence-scheduled verification: "" = measure the forward and drafting costs
    # after warm-up; or a pinned profile (JSON, see parse_sps_profile) used as given
    sps_profile: str = ""

    def __post_init__(self) -> None:
        if self.speculative_config != "auto":
            parse_speculative_config(self.speculative_config)
            parse_verify_policy(self.speculative_config)
        if self.sps_profile:
            parse_sps_profile(self.sps_profile)
        _check(self.num_leases >= 1, "num_leases", self.num_leases, ">= 1")
        _check(self.dtype in ("auto", "bfloat16", "float32"), "dtype", self.dtype,
               "one of auto, bfloat16, float32")
        _check(self.device in ("cpu", "cuda", "npu"), "device", self.device,
               "one of cpu, cuda, npu")
        _check(self.block_size in (8, 16, 32, 64, 128), "block_size", self.block_size,
               "one of 8, 16, 32, 64, 128")
        _check(self.num_kv_blocks >= 0, "num_kv_blocks", self.num_kv_blocks, ">= 0")
        _check(self.kv_cache_gib > 0, "kv_cache_gib", self.kv_cache_gib, "> 0")
        _check(self.max_model_len >= 0, "max_model_len", self.max_model_len, ">= 0")
        _check(0 < self.port < 65536, "port", self.port, "in 1..65535")
        _check(self.num_threads >= 0, "num_threads", self.num_threads, ">= 0")
        _check(self.attention in ("auto", "native", "torch"), "attention", self.attention,
               "one of auto, native, torch")
        _check(self.linear in ("auto", "native", "torch"), "linear", self.linear,
               "one of auto, native, torch")
        _check(self.gguf_weights in ("auto", "on", "off"), "gguf_weights", self.gguf_weights,
               "one of auto, on, off")
        self.tap_layer_ids = tuple(int(x) for x in self.tap_layer_ids)
        super().__post_init__()  # metrics, drain, TLS

    @property
    def model_dir(self) -> Path:
        return Path(self.model) if self.model else default_model_dir()

    def verify_policy(self) -> str:
        """"fixed" or "confidence" (meaningful when speculation() gives K > 0)."""
        return parse_verify_policy(self.speculative_config)

    def speculation(self) -> tuple[int, Path | None]:
        """(K, drafter dir): K = 0 and None when nothing of the drafter is loaded."""
        if self.speculative_config == "auto":
            d = Path(self.drafter) if self.drafter else shipped_drafter_dir(self.model_dir.name)
            if (d / "drafter_config.json").is_file():
                return MAX_SPECULATIVE_TOKENS, d
            return 0, None
        k, model = parse_speculative_config(self.speculative_config)
        if k == 0:
            return 0, None
        d = model or self.drafter
        d = Path(d) if d else shipped_drafter_dir(self.model_dir.name)
        if not (d / "drafter_config.json").is_file():
            raise ValueError(f"speculative_config asks for K={k} but no drafter checkpoint "
                             f"is at {d} (give --drafter DIR or train one with "
                             "`dspark train-drafter`)")
        return k, d


@dataclass
class SchedulerConfig(UpstreamTLSConfig, ServerOpsConfig):
    """Continuous batching of one model replica."""

    worker: str = f"{DEFAULT_HOST}:{DEFAULT_WORKER_PORT}"
    max_num_batched_tokens: int = 512  # token budget of one step
    max_num_seqs: int = 64  # running requests at most
    max_waiting: int = 1024  # queued requests beyond which Submit is refused
    worker_retry_s: float = 30.0  # how long to wait for a lost worker before failing requests
    step_timeout_s: float = 120.0  # a step slower than this counts as a lost worker
    worker_start_timeout_s: float = 600.0  # wait this long for the worker at start-up
    # Dispatch step N+1 before step N returns: speculating requests take their next
    # anchor from the worker's own acceptance of step N (optimistic 1 + K positions
    # reserved, corrected when N's result arrives). Output is identical to sync.
    async_scheduling: bool = True
    # Confidence-scheduled verification with a measured cost profile: every N-th
    # step with speculating requests sizes its verify budget the other way (no
    # drafts where it chose some; where it chose none, one request drafts, round
    # robin, with a window of 1, 2, 4, ... K drafts in turn),
    # so the refitted profile sees the rows it would otherwise never run and the
    # requests' confidences stay fresh. 0 = never.
    verify_explore_every: int = 32
    # Confidence-scheduled verification: send the step's expected time for 0..V
    # verified rows with the budget, so that the worker verifies fewer rows
    # where the drafts' current confidences do not pay for them (the walk of
    # DSPARK.md 4.3 with its early stop, shared/verify_fill.py). False = the
    # worker fills the whole budget V.
    verify_trim: bool = True
    # Confidence-scheduled verification: a request's last confidences (from its
    # last verify step) estimate its next draft's; with every step it runs without
    # drafting they count this much less, the estimate moving toward the replica's
    # running per-position acceptance. 1 = never (it waits for an exploration step).
    verify_confidence_decay: float = 0.5
    host: str = DEFAULT_HOST
    port: int = DEFAULT_SCHEDULER_PORT

    def __post_init__(self) -> None:
        _check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
               self.max_num_batched_tokens, ">= 1")
        _check(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, ">= 1")
        _check(self.max_waiting >= 1, "max_waiting", self.max_waiting, ">= 1")
        _check(self.worker_retry_s >= 0, "worker_retry_s", self.worker_retry_s, ">= 0")
        _check(self.verify_explore_every >= 0, "verify_explore_every",
               self.verify_explore_every, ">= 0")
        _check(0.0 < self.verify_confidence_decay <= 1.0, "verify_confidence_decay",
               self.verify_confidence_decay, "in (0, 1]")
        _check(0 < self.port < 65536, "port", self.port, "in 1..65535")
        super().__post_init__()  # metrics, drain, TLS


@dataclass
class RouterConfig(PublicAPIConfig, UpstreamTLSConfig, ServerOpsConfig):
    """The public gateway."""

    schedulers: tuple[str, ...] = (f"{DEFAULT_HOST}:{DEFAULT_SCHEDULER_PORT}",)
    model: str = ""  # tokenizer/template directory; "" = the prepared default model
    model_name: str = ""  # name clients use; "" = the worker's model name
    default_max_tokens: int = 256
    max_tokens_limit: int = 4096
    max_message_chars: int = 100_000  # per chat message / prompt
    max_messages: int = 256
    max_stop_strings: int = 16  # SamplingParams.stop entries per request
    max_stop_chars: int = 256  # length of one stop string
    max_stop_token_ids: int = 64  # SamplingParams.stop_token_ids entries per request
    host: str = DEFAULT_HOST
    port: int = DEFAULT_ROUTER_PORT

    def __post_init__(self) -> None:
        self.schedulers = tuple(self.schedulers)
        _check(len(self.schedulers) >= 1, "schedulers", self.schedulers, "at least one address")
        _check(self.default_max_tokens >= 1, "default_max_tokens", self.default_max_tokens, ">= 1")
        _check(self.max_tokens_limit >= self.default_max_tokens, "max_tokens_limit",
               self.max_tokens_limit, ">= default_max_tokens")
        _check(self.max_message_chars >= 1, "max_message_chars", self.max_message_chars, ">= 1")
        _check(self.max_messages >= 1, "max_messages", self.max_messages, ">= 1")
        _check(self.max_stop_strings >= 0, "max_stop_strings", self.max_stop_strings, ">= 0")
        _check(self.max_stop_chars >= 1, "max_stop_chars", self.max_stop_chars, ">= 1")
        _check(self.max_stop_token_ids >= 0, "max_stop_token_ids", self.max_stop_token_ids, ">= 0")
        _check(0 < self.port < 65536, "port", self.port, "in 1..65535")
        super().__post_init__()  # HTTP API, keys, limits, metrics, drain, TLS

    @property
    def model_dir(self) -> Path:
        return Path(self.model) if self.model else default_model_dir()
