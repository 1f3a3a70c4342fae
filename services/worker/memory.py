"""How much host memory a CPU worker may still take, for sizing checks at start-up.

A worker's KV pool is its one large allocation, and its size is the user's
choice (``--kv-cache-gib`` or ``--num-kv-blocks``). A pool that does not fit
must fail at start-up with an error that names the setting, not when the pool
fills under load (the kernel's OOM killer) or halfway through zeroing it.

The limit is the smaller of the kernel's MemAvailable and, in a container, the
cgroup's headroom (its memory limit less what the cgroup already uses):
Kubernetes and docker-compose limits are cgroup limits, which MemAvailable
does not see.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC_MEMINFO = Path("/proc/meminfo")
# cgroup v2 (unified) files, then v1's memory controller
CGROUP_V2 = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current"))
CGROUP_V1 = (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
             Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"))
# v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages)
_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class Available:
    bytes: int
    source: str  # what bounds it, for the error message


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def mem_available(meminfo: Path = PROC_MEMINFO) -> int | None:
    """The kernel's MemAvailable in bytes (None where there is no /proc/meminfo)."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else None
    return None


def cgroup_headroom(v2: tuple[Path, Path] = CGROUP_V2,
                    v1: tuple[Path, Path] = CGROUP_V1) -> int | None:
    """The cgroup's memory limit less its usage, in bytes (None: no limit found)."""
    for limit_path, usage_path in (v2, v1):
        limit = _read_int(limit_path)
        if limit is None or limit >= _V1_UNLIMITED:
            continue
        usage = _read_int(usage_path) or 0
        return max(0, limit - usage)
    return None


def available(meminfo: Path = PROC_MEMINFO, v2: tuple[Path, Path] = CGROUP_V2,
              v1: tuple[Path, Path] = CGROUP_V1) -> Available | None:
    """What this process may still allocate, and what bounds it (None: unknown,
    not Linux)."""
    cands = []
    host = mem_available(meminfo)
    if host is not None:
        cands.append(Available(host, "MemAvailable in /proc/meminfo"))
    cg = cgroup_headroom(v2, v1)
    if cg is not None:
        cands.append(Available(cg, "the container's cgroup memory limit less its usage"))
    return min(cands, key=lambda a: a.bytes) if cands else None


def check_kv_pool(pool_bytes: int, setting: str, avail: Available | None) -> None:
    """Raise ValueError naming ``setting`` (e.g. "kv_cache_gib=1.6") when a KV pool
    of ``pool_bytes`` does not fit in the memory ``avail`` reports."""
    if avail is None or pool_bytes <= avail.bytes:
        return
    gib = 2 ** 30
    raise ValueError(f"{setting} is invalid: the KV pool needs {pool_bytes / gib:.2f} GiB "
                     f"but only {avail.bytes / gib:.2f} GiB of memory is available "
                     f"({avail.source}); lower --kv-cache-gib or --num-kv-blocks")
