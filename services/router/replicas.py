"""Scheduler replicas and least-outstanding-tokens selection.

The router keeps its own account of the tokens it has sent to each replica
and not yet seen finish: ``prompt_tokens + max_tokens`` at dispatch, released
as the prompt is computed (first token), as output tokens stream back, and
the rest at finish. A poller (run by the servicer) feeds each replica's
``GetLoad`` answer through :meth:`ReplicaSet.update_load` and reports failures
with :meth:`ReplicaSet.mark_unhealthy`.

A replica's load is ``max(router-side outstanding, outstanding reported by the
scheduler)``: the report also covers other routers' requests, the local count
is fresher for this router's own. ``pick`` takes the least loaded healthy,
accepting replica; ties rotate round robin.

Thread-safe (one lock); no I/O.

Example::

    replicas = ReplicaSet(["127.0.0.1:50052", "127.0.0.1:50062"])
    res = replicas.reserve(prompt_tokens=12, max_tokens=64)  # pick + account
    ...  # Submit to res.address
    res.on_tokens(3)  # tokens streamed back
    res.finish()
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from dspark.shared.errors import NoReplicaAvailable

__all__ = ["NoReplicaAvailable", "Replica", "ReplicaSet", "Reservation"]


@dataclass
class Replica:
    """One scheduler replica (a snapshot when returned by ReplicaSet)."""

    address: str
    healthy: bool = True
    accepting: bool = True
    outstanding_tokens: int = 0  # router-side accounting
    reported_outstanding_tokens: int = 0  # from the scheduler's GetLoad
    num_waiting: int = 0
    num_running: int = 0
    free_kv_blocks: int = 0
    total_kv_blocks: int = 0
    model_name: str = ""
    max_model_len: int = 0
    last_update: float = 0.0  # time.monotonic() of the last load report; 0 = never
    consecutive_failures: int = 0
    last_error: str = ""

    @property
    def available(self) -> bool:
        return self.healthy and self.accepting

    @property
    def load(self) -> int:
        """Tokens the replica is believed to still owe (the picking key)."""
        return max(self.outstanding_tokens, self.reported_outstanding_tokens)


_LOAD_FIELDS = {
    "num_waiting": int, "num_running": int, "free_kv_blocks": int, "total_kv_blocks": int,
    "model_name": str, "max_model_len": int,
}


class ReplicaSet:
    """The scheduler replicas of one model, configured by address.

    Args:
      addresses: scheduler addresses (host:port), in round-robin order.
      assume_healthy: whether replicas count as healthy before their first
        load report (True lets requests flow before the poller's first round;
        a failed dispatch should then ``mark_unhealthy``).
    """

    def __init__(self, addresses: Iterable[str], assume_healthy: bool = True) -> None:
        addrs = list(dict.fromkeys(addresses))
        if not addrs:
            raise ValueError("addresses is empty: need at least one scheduler address")
        self._lock = threading.Lock()
        self._replicas = {a: Replica(a, healthy=assume_healthy, accepting=assume_healthy)
                          for a in addrs}
        self._order = addrs
        self._next = 0  # round-robin cursor into _order

    # -- inspection ---------------------------------------------------------

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(self._order)

    def get(self, address: str) -> Replica:
        """A snapshot of one replica; KeyError for an unknown address."""
        with self._lock:
            return replace(self._get(address))

    def snapshot(self) -> list[Replica]:
        """Snapshots of all replicas, in configured order."""
        with self._lock:
            return [replace(self._replicas[a]) for a in self._order]

    def num_available(self) -> int:
        """Replicas that are healthy and accepting."""
        with self._lock:
            return sum(r.available for r in self._replicas.values())

    # -- health / load --------------------------------------------------------

    def update_load(self, address: str, load: Mapping[str, object]) -> None:
        """Record a GetLoad answer (keys as in GetLoadResponse); marks the replica healthy.

        Recognized keys: outstanding_tokens, accepting, num_waiting,
        num_running, free_kv_blocks, total_kv_blocks, model_name,
        max_model_len; others are ignored.
        """
        with self._lock:
            r = self._get(address)
            r.healthy = True
            r.consecutive_failures = 0
            r.last_error = ""
            r.last_update = time.monotonic()
            if "accepting" in load:
                r.accepting = bool(load["accepting"])
            if "outstanding_tokens" in load:
                r.reported_outstanding_tokens = max(0, int(load["outstanding_tokens"]))
            for key, conv in _LOAD_FIELDS.items():
                if key in load:
                    setattr(r, key, conv(load[key]))

    def mark_unhealthy(self, address: str, reason: str = "") -> None:
        """Take a replica out of picking until its next successful load report."""
        with self._lock:
            r = self._get(address)
            r.healthy = False
            r.consecutive_failures += 1
            r.last_error = reason

    # -- picking and accounting -----------------------------------------------

    def pick(self, exclude: Iterable[str] = ()) -> Replica:
        """The least loaded healthy, accepting replica not in ``exclude`` (a snapshot).

        Ties go round robin. Raises NoReplicaAvailable when none qualifies.
        """
        with self._lock:
            return replace(self._pick(set(exclude)))

    def reserve(self, prompt_tokens: int, max_tokens: int,
                exclude: Iterable[str] = ()) -> "Reservation":
        """Pick a replica and account ``prompt_tokens + max_tokens`` to it, atomically."""
        with self._lock:
            r = self._pick(set(exclude))
            return self._reserve(r, prompt_tokens, max_tokens)

    def reserve_on(self, address: str, prompt_tokens: int, max_tokens: int) -> "Reservation":
        """Account a request to a given replica (e.g. one chosen by prefix affinity)."""
        with self._lock:
            return self._reserve(self._get(address), prompt_tokens, max_tokens)

    def add_outstanding(self, address: str, tokens: int) -> None:
        """Adjust a replica's router-side outstanding tokens by ``tokens`` (may be < 0)."""
        with self._lock:
            r = self._get(address)
            r.outstanding_tokens = max(0, r.outstanding_tokens + int(tokens))

    # -- internals (lock held) ----------------------------------------------------

    def _get(self, address: str) -> Replica:
        try:
            return self._replicas[address]
        except KeyError:
            raise KeyError(f"unknown scheduler replica {address!r}") from None

    def _pick(self, exclude: set[str]) -> Replica:
        n = len(self._order)
        # Candidates in round-robin order starting at the cursor; min() keeps
        # the first of equals, so ties rotate.
        rotated = [self._replicas[self._order[(self._next + i) % n]] for i in range(n)]
        candidates = [r for r in rotated if r.available and r.address not in exclude]
        if not candidates:
            states = ", ".join(
                f"{r.address} ({'excluded' if r.address in exclude else 'unhealthy' if not r.healthy else 'not accepting' if not r.accepting else 'ok'})"
                for r in self._replicas.values())
            raise NoReplicaAvailable(f"no scheduler replica available: {states}")
        best = min(candidates, key=lambda r: r.load)
        self._next = (self._order.index(best.address) + 1) % n
        return best

    def _reserve(self, r: Replica, prompt_tokens: int, max_tokens: int) -> "Reservation":
        prompt_tokens, max_tokens = max(0, int(prompt_tokens)), max(0, int(max_tokens))
        r.outstanding_tokens += prompt_tokens + max_tokens
        return Reservation(self, r.address, prompt_tokens, max_tokens)


class Reservation:
    """One request's share of a replica's outstanding tokens.

    ``on_tokens(n)`` releases the prompt (at the first call: the prompt has
    been computed) and ``n`` output tokens; ``finish()`` releases what is left.
    Both are safe to call more than once; nothing is released twice. One
    Reservation belongs to one request (its own counters are not locked).
    """

    def __init__(self, replicas: ReplicaSet, address: str, prompt_tokens: int,
                 max_tokens: int) -> None:
        self._set = replicas
        self.address = address
        self._prompt_left = prompt_tokens
        self._output_left = max_tokens

    @property
    def remaining(self) -> int:
        """Tokens still accounted to the replica for this request."""
        return self._prompt_left + self._output_left

    def on_tokens(self, n: int) -> None:
        """``n`` output tokens streamed back."""
        release = self._prompt_left + min(max(0, int(n)), self._output_left)
        self._output_left -= release - self._prompt_left
        self._prompt_left = 0
        if release:
            self._set.add_outstanding(self.address, -release)

    def finish(self) -> None:
        """The request ended (any reason): release everything left."""
        release = self.remaining
        self._prompt_left = self._output_left = 0
        if release:
            self._set.add_outstanding(self.address, -release)

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
