from __future__ import annotations

import threading

import pytest

from dspark.router.replicas import NoReplicaAvailable, ReplicaSet
from dspark.shared.errors import Unavailable

A, B, C = "a:1", "b:1", "c:1"


def test_least_outstanding_tokens():
    rs = ReplicaSet([A, B, C])
    rs.reserve_on(A, 10, 10)
    rs.reserve_on(B, 5, 0)
    rs.reserve_on(C, 30, 0)
    assert rs.pick().address == B
    assert rs.pick(exclude=[B]).address == A


def test_ties_round_robin():
    rs = ReplicaSet([A, B, C])
    assert [rs.pick().address for _ in range(6)] == [A, B, C, A, B, C]


def test_reserve_accounts_and_spreads():
    rs = ReplicaSet([A, B])
    r1 = rs.reserve(prompt_tokens=10, max_tokens=20)
    r2 = rs.reserve(prompt_tokens=10, max_tokens=20)
    assert {r1.address, r2.address} == {A, B}
    assert rs.get(r1.address).outstanding_tokens == 30
    r1.on_tokens(5)  # prompt computed + 5 tokens
    assert rs.get(r1.address).outstanding_tokens == 15
    r1.on_tokens(100)  # never below what was reserved
    assert rs.get(r1.address).outstanding_tokens == 0
    r2.finish()
    r2.finish()  # idempotent
    assert rs.get(r2.address).outstanding_tokens == 0


def test_unhealthy_and_not_accepting_skipped_until_report():
    rs = ReplicaSet([A, B, C])
    rs.mark_unhealthy(A, "connection refused")
    rs.update_load(B, {"accepting": False, "outstanding_tokens": 0})
    assert {rs.pick().address for _ in range(4)} == {C}
    assert rs.get(A).last_error == "connection refused"
    rs.update_load(A, {"accepting": True, "outstanding_tokens": 3, "num_running": 2,
                       "model_name": "m", "max_model_len": 2048, "unknown_key": 1})
    a = rs.get(A)
    assert a.healthy and a.num_running == 2 and a.max_model_len == 2048
    assert rs.num_available() == 2


def test_reported_load_counts():
    rs = ReplicaSet([A, B])
    rs.update_load(A, {"accepting": True, "outstanding_tokens": 500})
    rs.reserve_on(B, 100, 0)
    assert rs.pick().address == B


def test_none_available():
    rs = ReplicaSet([A, B], assume_healthy=False)
    with pytest.raises(NoReplicaAvailable) as e:
        rs.pick()
    assert isinstance(e.value, Unavailable) and A in str(e.value)
    rs.update_load(A, {"accepting": True})
    with pytest.raises(NoReplicaAvailable, match="excluded"):
        rs.pick(exclude=[A])


def test_unknown_and_empty():
    with pytest.raises(ValueError):
        ReplicaSet([])
    with pytest.raises(KeyError):
        ReplicaSet([A]).mark_unhealthy(B)


def test_thread_safe_accounting():
    rs = ReplicaSet([A, B, C])

    def work():
        for _ in range(300):
            r = rs.reserve(3, 7)
            r.on_tokens(2)
            r.finish()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.outstanding_tokens == 0 for r in rs.snapshot())
