"""shared/metrics.py: the speculation counters, the load gauges, the timer."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dspark.shared.metrics import RouterMetrics, SchedulerMetrics, WorkerMetrics


def samples(m) -> dict:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_record_spec_step_counts_like_vllm():
    m = SchedulerMetrics(num_speculative_tokens=4)
    m.record_spec_step(4, 2)  # positions 0, 1 accepted
    m.record_spec_step(4, 4)  # all four
    m.record_spec_step(3, 0)  # window clipped near max_model_len, none accepted
    m.record_spec_step(0, 0, fallback=True)  # one token at a time
    s = samples(m)
    assert s[("dspark_spec_decode_num_drafts_total", ())] == 3
    assert s[("dspark_spec_decode_num_draft_tokens_total", ())] == 11
    assert s[("dspark_spec_decode_num_accepted_tokens_total", ())] == 6
    per_pos = [s[("dspark_spec_decode_num_accepted_tokens_per_pos_total",
                  (("position", str(k)),))] for k in range(4)]
    assert per_pos == [2, 2, 1, 1]
    assert s[("dspark_spec_decode_num_fallback_steps_total", ())] == 1


def test_unverified_steps_are_counted_apart_from_fallback_and_drafts():
    m = SchedulerMetrics(num_speculative_tokens=7)
    m.record_spec_step(0, 0, unverified=True)  # the verify budget gave it no draft row
    m.record_spec_step(0, 0, unverified=True)
    m.record_spec_step(2, 1)  # a budgeted step verifying 2 of its 7 drafts
    s = samples(m)
    assert s[("dspark_spec_decode_num_unverified_steps_total", ())] == 2
    assert s[("dspark_spec_decode_num_fallback_steps_total", ())] == 0
    assert s[("dspark_spec_decode_num_drafts_total", ())] == 1
    assert s[("dspark_spec_decode_num_draft_tokens_total", ())] == 2


def test_per_position_series_exist_before_traffic():
    s = samples(SchedulerMetrics(num_speculative_tokens=7))
    for k in range(7):
        assert s[("dspark_spec_decode_num_accepted_tokens_per_pos_total",
                  (("position", str(k)),))] == 0


def test_record_spec_step_rejects_more_accepted_than_drafted():
    with pytest.raises(ValueError, match="num_accepted=5 is invalid: must be in 0..4"):
        SchedulerMetrics().record_spec_step(4, 5)


def test_observe_load_sets_used_from_free_and_total():
    m = SchedulerMetrics()
    m.observe_load({"num_waiting": 3, "num_running": 2, "free_kv_blocks": 500,
                    "total_kv_blocks": 512, "free_leases": 30, "total_leases": 32,
                    "num_preemptions": 1, "accepting": True})
    s = samples(m)
    assert s[("dspark_scheduler_num_requests_waiting", ())] == 3
    assert s[("dspark_scheduler_num_requests_batched", ())] == 2
    assert s[("dspark_scheduler_kv_blocks_used", ())] == 12
    assert s[("dspark_scheduler_leases_used", ())] == 2
    assert s[("dspark_scheduler_leases_total", ())] == 32
    assert s[("dspark_scheduler_accepting", ())] == 1
    m.observe_load({"accepting": False})  # before the lead's lease fields: zeros
    s = samples(m)
    assert s[("dspark_scheduler_leases_used", ())] == 0
    assert s[("dspark_scheduler_accepting", ())] == 0


def test_request_timer_ttft_itl_e2e(monkeypatch):
    import dspark.shared.metrics as mm

    now = [100.0]
    monkeypatch.setattr(mm.time, "monotonic", lambda: now[0])
    m = RouterMetrics()
    t = m.request_timer()
    now[0] = 100.5
    t.on_tokens(1)  # first token after 0.5 s
    now[0] = 100.6
    t.on_tokens(2)  # two tokens 0.1 s later: 0.05 s each
    now[0] = 101.0
    assert t.finish() == pytest.approx(1.0)
    s = samples(m)
    assert s[("dspark_router_time_to_first_token_seconds_sum", ())] == pytest.approx(0.5)
    assert s[("dspark_router_inter_token_latency_seconds_count", ())] == 2
    assert s[("dspark_router_inter_token_latency_seconds_sum", ())] == pytest.approx(0.1)
    assert s[("dspark_router_e2e_request_latency_seconds_sum", ())] == pytest.approx(1.0)
    assert t.num_tokens == 3


def test_sets_are_independent():
    a, b = WorkerMetrics(), WorkerMetrics()
    a.observe_step(0.02, 4, 40)
    assert samples(a)[("dspark_worker_steps_total", ())] == 1
    assert samples(b)[("dspark_worker_steps_total", ())] == 0
