"""Token-bucket rate limits of the router's public API.

One bucket per caller: the API key's name when the router has API keys, the
client's address otherwise (see :func:`bucket_of`), so one noisy client
cannot empty the bucket of the others.

The table stays bounded: a bucket left idle until it is full again is the
same as a new one, so such buckets are dropped (a sweep at most every
``sweep_every_s``); beyond ``max_buckets`` callers (many addresses) the least
recently used bucket goes first.
"""
from __future__ import annotations

import ipaddress
import threading
import time
from collections import OrderedDict
from urllib.parse import unquote

from dspark.shared.errors import ResourceExhausted

ANONYMOUS = "anonymous"  # the caller's name when the router has no API keys


class RateLimiter:
    """A token bucket per caller: ``rate`` requests/s, bursts of ``burst``.
    ``rate`` 0 disables it. Thread-safe."""

    MAX_BUCKETS = 65536  # ~10 MB of table at most
    SWEEP_EVERY_S = 10.0

    def __init__(self, rate: float, burst: int = 0, *, max_buckets: int = MAX_BUCKETS,
                 sweep_every_s: float = SWEEP_EVERY_S) -> None:
        if max_buckets < 1:
            raise ValueError(f"max_buckets={max_buckets!r} is invalid: must be >= 1")
        self.rate = float(rate)
        self.burst = float(burst or max(1, int(rate)))
        self.max_buckets = max_buckets
        self.sweep_every_s = sweep_every_s
        # caller -> (tokens, at, full_at), least recently used first
        self._buckets: OrderedDict[str, tuple[float, float, float]] = OrderedDict()
        self._next_sweep = float("-inf")
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether a default rate limit is set (keys may have their own)."""
        return self.rate > 0

    def __len__(self) -> int:
        """Buckets held now (callers seen lately that are not full again)."""
        return len(self._buckets)

    def acquire(self, name: str, now: float | None = None, rate: float | None = None,
                burst: int | None = None) -> float:
        """Take one request from ``name``'s bucket: 0.0 when allowed, else the
        seconds until one would be. ``rate`` / ``burst`` override the
        defaults for this caller (rate 0 = unlimited)."""
        rate = self.rate if rate is None else float(rate)
        if rate <= 0:
            return 0.0
        cap = float(burst) if burst else (self.burst if rate == self.rate else max(1.0, int(rate)))
        now = time.monotonic() if now is None else now
        with self._lock:
            self._sweep(now)
            tokens, at, _ = self._buckets.pop(name, (cap, now, now))
            tokens = min(cap, tokens + max(0.0, now - at) * rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / rate
            self._buckets[name] = (tokens, now, now + (cap - tokens) / rate)  # most recent last
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
            return wait

    def _sweep(self, now: float) -> None:
        """Drop the buckets that are full again (at most every sweep_every_s)."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_every_s
        for name in [n for n, (_, _, full_at) in self._buckets.items() if full_at <= now]:
            del self._buckets[name]


class RateLimited(ResourceExhausted):
    """Too many requests from one caller; ``retry_after`` seconds."""

    def __init__(self, name: str, rate: float, retry_after: float,
                 per: str = "API key") -> None:
        super().__init__(f"rate limit exceeded: at most {rate:g} requests/s per {per} "
                         f"(rate_limit_rps); retry in {retry_after:.2f}s")
        self.retry_after = retry_after


def client_address(host: str | None) -> str:
    """A client's IP in one spelling (IPv4-mapped IPv6 as IPv4, IPv6
    compressed); anything that is not an IP is returned as it is."""
    if not host:
        return ""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def grpc_peer_address(peer: str | None) -> str:
    """The client's IP from a gRPC peer string without the port
    (``ipv4:10.0.0.7:5123``, ``ipv6:[::1]:5123``, ``ipv6:%5B::1%5D:5123``);
    other peers (``unix:...``) are returned whole, "" when unknown."""
    if not peer:
        return ""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return peer
    host = unquote(rest).rsplit(":", 1)[0]
    return client_address(host)


def bucket_of(name: str, keyed: bool, peer: str) -> str:
    """The bucket of a request: its key's name with API keys; otherwise its
    client address (callers whose address is unknown share one bucket)."""
    if keyed:
        return name
    return f"peer:{peer}" if peer else ANONYMOUS
