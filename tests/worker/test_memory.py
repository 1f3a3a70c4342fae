"""A CPU worker's KV pool must fit the memory it may take, and is taken at
start-up: a pool too large fails then, with an error naming the setting, not
under load (``worker/memory.py``, ``PagedKVCache(prefault=True)``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark.shared.config import WorkerConfig
from dspark.worker import memory
from dspark.worker.model import hugepages
from dspark.worker.model.kv_cache import PagedKVCache
from dspark.worker.runner import ModelRunner

GIB = 2 ** 30
WHY = hugepages.unavailable_reason()


def _files(tmp_path: Path, meminfo_kb: int | None, v2: tuple[str, str] | None = None,
           v1: tuple[str, str] | None = None):
    tmp_path.mkdir()
    meminfo = tmp_path / "meminfo"
    if meminfo_kb is not None:
        meminfo.write_text(f"MemTotal:       99999999 kB\nMemFree:  1 kB\n"
                           f"MemAvailable:   {meminfo_kb} kB\nBuffers: 5 kB\n")
    paths = []
    for name, vals in (("v2", v2), ("v1", v1)):
        lim, use = tmp_path / f"{name}.limit", tmp_path / f"{name}.usage"
        if vals is not None:
            lim.write_text(vals[0] + "\n")
            use.write_text(vals[1] + "\n")
        paths.append((lim, use))
    return dict(meminfo=meminfo, v2=paths[0], v1=paths[1])


def test_available_is_the_smaller_of_memavailable_and_the_cgroup_headroom(tmp_path):
    # host only: MemAvailable in kB
    a = memory.available(**_files(tmp_path / "a", 3 * 1024 * 1024))
    assert a == memory.Available(3 * GIB, "MemAvailable in /proc/meminfo")
    # a cgroup v2 limit of 2 GiB with 0.5 GiB used is tighter than 3 GiB free
    a = memory.available(**_files(tmp_path / "b", 3 * 1024 * 1024, v2=(str(2 * GIB), str(GIB // 2))))
    assert a.bytes == GIB + GIB // 2 and "cgroup" in a.source
    # a loose cgroup limit does not raise the host's
    a = memory.available(**_files(tmp_path / "c", 1024 * 1024, v2=(str(8 * GIB), "0")))
    assert a == memory.Available(GIB, "MemAvailable in /proc/meminfo")
    # v2 "max" (no limit) falls through to v1; v1's "unlimited" is a huge number
    f = _files(tmp_path / "d", 4 * 1024 * 1024, v2=("max", "123"), v1=(str(GIB), str(GIB // 4)))
    assert memory.available(**f).bytes == GIB - GIB // 4
    f = _files(tmp_path / "e", 4 * 1024 * 1024, v1=(str(2 ** 63 - 4096), "0"))
    assert memory.available(**f).bytes == 4 * GIB
    # usage past the limit: nothing left, not a negative number
    assert memory.available(**_files(tmp_path / "f", None, v2=("100", "200"))).bytes == 0
    # nothing readable (not Linux): unknown, and the check lets it pass
    assert memory.available(**_files(tmp_path / "g", None)) is None
    memory.check_kv_pool(10 ** 15, "kv_cache_gib=1", None)


def test_this_machine_reports_its_memory():
    a = memory.available()
    if a is None:
        pytest.skip("no /proc/meminfo here (not Linux)")
    assert 0 < a.bytes < 1 << 50


def test_the_check_names_the_setting_and_both_sizes():
    avail = memory.Available(GIB, "MemAvailable in /proc/meminfo")
    memory.check_kv_pool(GIB, "kv_cache_gib=1.0", avail)  # exactly fits
    with pytest.raises(ValueError, match=r"kv_cache_gib=1\.5 is invalid: the KV pool needs "
                                         r"1\.50 GiB but only 1\.00 GiB .*MemAvailable"):
        memory.check_kv_pool(GIB + GIB // 2, "kv_cache_gib=1.5", avail)


def test_a_worker_with_a_pool_larger_than_memory_fails_at_start(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(memory, "available", lambda: memory.Available(
        1 << 20, "MemAvailable in /proc/meminfo"))
    # tiny model: 8 KiB a block in fp32 at block size 8 (test_runner.py)
    with pytest.raises(ValueError, match=r"kv_cache_gib=0\.5 is invalid: .* only 0\.00 GiB"):
        ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32", block_size=8,
                                 kv_cache_gib=0.5, tap_layer_ids=(1,)))
    with pytest.raises(ValueError, match=r"num_kv_blocks=1000 is invalid"):
        ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32", block_size=8,
                                 num_kv_blocks=1000, tap_layer_ids=(1,)))
    # 100 blocks = 800 KiB fit in 1 MiB
    r = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32", block_size=8,
                                 num_kv_blocks=100, tap_layer_ids=(1,)))
    assert r.info().num_kv_blocks == 100


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(WHY is not None, reason=f"no huge pages here: {WHY}")
@pytest.mark.parametrize("prefault", [True, False])
def test_a_prefaulted_pool_is_resident_from_the_start(prefault):
    """prefault=True (the worker's default): the whole pool is resident once
    built; False: it becomes resident only as it is written."""
    # 4 layers x 256 blocks x 16 slots x 4 heads x 128 dims x 2 bytes = 16 MiB a tensor
    before = _rss_bytes()
    kv = PagedKVCache(4, 256, 16, 4, 128, torch.bfloat16, torch.device("cpu"), prefault=prefault)
    grown = _rss_bytes() - before
    pool = 2 * kv.k.numel() * kv.k.element_size()
    assert pool == 32 << 20
    if prefault:
        assert grown >= 0.9 * pool
    else:
        assert grown < 0.25 * pool
    assert not kv.k.any() and not kv.v.any()
