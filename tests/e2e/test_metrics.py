"""Every service's Prometheus endpoint, scraped before and after real traffic:
the counters and histograms moved by what was sent, the gauges show a
request while it runs."""
from __future__ import annotations

import threading
import time

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dspark.shared import errors

from .conftest import wait_idle

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def scrape(address: str, path: str = "/metrics") -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one endpoint."""
    text = httpx.get(f"http://{address}{path}", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def v(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape_all(cluster) -> dict[str, dict]:
    return {name: scrape(addr) for name, addr in cluster.metrics.items()}


def test_each_service_serves_metrics(cluster):
    assert set(cluster.metrics) == {"router", "scheduler-0", "worker-0", "scheduler-1",
                                    "worker-1"}
    m = scrape_all(cluster)
    for name, samples in m.items():
        service = name.split("-")[0]
        assert v(samples, f"dspark_{service}_ready") == 1.0, name
        assert v(samples, f"dspark_{service}_draining") == 0.0, name
    for i in (0, 1):
        assert v(m[f"worker-{i}"], "dspark_worker_kv_blocks_total") == 512
        assert v(m[f"scheduler-{i}"], "dspark_scheduler_kv_blocks_total") == 512
        assert v(m[f"scheduler-{i}"], "dspark_scheduler_accepting") == 1
    assert v(m["router"], "dspark_router_replicas_available") == 2
    # The router's HTTP API serves the same registry at /metrics.
    assert ("dspark_router_ready", ()) in scrape(cluster.http)


def test_counters_move_with_traffic(cluster, client):
    wait_idle(cluster)
    before = scrape_all(cluster)
    n_tokens = 20
    for p in ("The capital of France is", "def fibonacci(n):", "Water boils at"):
        out = client.generate(prompt=p, max_tokens=n_tokens, temperature=0, ignore_eos=True)
        assert out.usage.completion_tokens == n_tokens
    with pytest.raises(errors.InvalidArgument):
        client.generate(prompt="Hi", top_p=2.0)
    after = scrape_all(cluster)

    def delta(proc, name, **labels):
        return v(after[proc], name, **labels) - v(before[proc], name, **labels)

    r = "router"
    assert delta(r, "dspark_router_requests_total", outcome="length") == 3
    assert delta(r, "dspark_router_requests_total", outcome="invalid_argument") == 1
    assert delta(r, "dspark_router_generation_tokens_total") == 3 * n_tokens
    assert delta(r, "dspark_router_prompt_tokens_total") >= 3
    assert delta(r, "dspark_router_time_to_first_token_seconds_count") == 3
    assert delta(r, "dspark_router_time_to_first_token_seconds_sum") > 0
    assert delta(r, "dspark_router_inter_token_latency_seconds_count") == 3 * (n_tokens - 1)
    assert delta(r, "dspark_router_e2e_request_latency_seconds_count") == 4
    # e2e >= ttft + the decode steps: real time was measured
    assert (delta(r, "dspark_router_e2e_request_latency_seconds_sum")
            > delta(r, "dspark_router_time_to_first_token_seconds_sum"))
    assert delta(r, "dspark_router_grpc_requests_total", method="Generate", code="OK") == 3
    assert delta(r, "dspark_router_grpc_requests_total", method="Generate",
                 code="INVALID_ARGUMENT") == 1

    s_done = sum(delta(f"scheduler-{i}", "dspark_scheduler_requests_total", outcome="length")
                 for i in (0, 1))
    assert s_done == 3
    steps = sum(delta(f"scheduler-{i}", "dspark_scheduler_steps_total") for i in (0, 1))
    assert steps >= 2  # a prefill and decode steps (fewer than tokens when speculating)
    assert sum(delta(f"scheduler-{i}", "dspark_scheduler_step_duration_seconds_count")
               for i in (0, 1)) == steps
    assert sum(delta(f"scheduler-{i}", "dspark_scheduler_generation_tokens_total")
               for i in (0, 1)) == 3 * n_tokens
    assert sum(delta(f"scheduler-{i}", "dspark_scheduler_inter_token_latency_seconds_count")
               for i in (0, 1)) == 3 * (n_tokens - 1)
    w_steps = sum(delta(f"worker-{i}", "dspark_worker_steps_total") for i in (0, 1))
    assert w_steps == steps  # every scheduler step is one worker step
    assert sum(delta(f"worker-{i}", "dspark_worker_step_duration_seconds_sum")
               for i in (0, 1)) > 0
    assert sum(delta(f"worker-{i}", "dspark_worker_grpc_requests_total", method="Step",
                     code="OK") for i in (0, 1)) == w_steps
    # Speculation counters are exported, and consistent when they move
    # (they stay at 0 while a replica runs without speculation).
    for i in (0, 1):
        sch = f"scheduler-{i}"
        assert ("dspark_spec_decode_num_drafts_total", ()) in after[sch]
        assert ("dspark_spec_decode_num_fallback_steps_total", ()) in after[sch]
        assert ("dspark_spec_decode_num_unverified_steps_total", ()) in after[sch]
        drafted = delta(sch, "dspark_spec_decode_num_draft_tokens_total")
        accepted = delta(sch, "dspark_spec_decode_num_accepted_tokens_total")
        assert 0 <= accepted <= drafted
        per_pos = sum(val - v(before[sch], name, **dict(labels))
                      for (name, labels), val in after[sch].items()
                      if name == "dspark_spec_decode_num_accepted_tokens_per_pos_total")
        assert per_pos == accepted


def test_gauges_show_a_running_request(cluster, client):
    """While one long request runs: one scheduler has it running, holds KV
    blocks, the router counts it in flight; afterwards all back to 0."""
    wait_idle(cluster)
    done = threading.Event()

    def run():
        try:
            client.generate(prompt="Tell me a story.", max_tokens=150, temperature=0,
                            ignore_eos=True)
        finally:
            done.set()

    t = threading.Thread(target=run)
    t.start()
    seen = None
    deadline = time.monotonic() + 60
    while not done.is_set() and time.monotonic() < deadline:
        m = scrape_all(cluster)
        scheds = [m[f"scheduler-{i}"] for i in (0, 1)]
        # one scrape where all of them agree: the batched gauge is sampled every
        # 0.25 s, so a scrape just after the request ends can still show it batched
        busy = [s for s in scheds if v(s, "dspark_scheduler_num_requests_batched") == 1
                and v(s, "dspark_scheduler_num_requests_running") == 1]
        if busy and v(m["router"], "dspark_router_num_requests_running") == 1:
            seen = busy[0]
            break
        time.sleep(0.1)
    t.join()
    assert seen is not None, "never saw the request running in the metrics"
    assert v(seen, "dspark_scheduler_kv_blocks_used") >= 1
    assert v(seen, "dspark_scheduler_num_requests_running") == 1
    assert v(seen, "dspark_scheduler_num_requests_waiting") == 0
    wait_idle(cluster)
    time.sleep(0.6)  # the gauges are sampled every 0.25 s
    m = scrape_all(cluster)
    assert v(m["router"], "dspark_router_num_requests_running") == 0
    for i in (0, 1):
        assert v(m[f"scheduler-{i}"], "dspark_scheduler_kv_blocks_used") == 0
        assert v(m[f"scheduler-{i}"], "dspark_scheduler_num_requests_batched") == 0
