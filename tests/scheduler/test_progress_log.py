"""The scheduler's periodic progress line: due once per interval, and its
speculation figures are the interval's (and the run's) real acceptance."""
from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from dspark.scheduler.engine import Engine
from dspark.scheduler.progress import ProgressLog
from dspark.shared.config import SchedulerConfig

from sched_helpers import create_prompt, create_scheduler, sampling
from test_spec_scheduling import K, SpecFakeWorker, spec_scheduler


def drive(s, w, steps: int) -> None:
    for _ in range(steps):
        plan = s.schedule()
        s.update_from_output(plan, w.step(plan))


def test_progress_reports_the_intervals_mean_accepted_length():
    s = spec_scheduler()
    # draft slot 4 is always wrong: 3 drafts accepted + the target's token per verify step
    w = SpecFakeWorker(64, 4, wrong=lambda step, slot: slot == 3)
    for i in range(2):
        s.add_request(f"r{i}", create_prompt(6, salt=i), sampling(max_tokens=200))
    p = ProgressLog(every_s=10.0)
    drive(s, w, 1)  # the prefill step
    assert p.fields(s, 1, now=100.0) is None  # the first call starts the interval
    drive(s, w, 5)
    assert p.fields(s, 6, now=105.0) is None  # not due yet
    f = p.fields(s, 6, now=110.0)
    assert f["steps_per_s"] == 0.5 and f["running"] == 2 and f["waiting"] == 0
    assert f["mean_accepted_length"] == 4.0 and f["mean_accepted_length_total"] == 4.0
    assert f["per_position_acceptance"] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert f["fallback_steps"] == 0 and f["unverified_steps"] == 0
    # the next interval: every draft right now, so this interval's length is K + 1
    # while the run's total mixes both
    w.wrong = lambda step, slot: False
    drive(s, w, 2)
    f = p.fields(s, 8, now=120.0)
    assert f["mean_accepted_length"] == K + 1.0
    st = s.spec_totals
    assert st.verify_steps == 14
    assert f["mean_accepted_length_total"] == round((10 * 4 + 4 * (K + 1)) / 14, 3)
    # nothing verified in an interval: no mean for it, the total stays
    f = p.fields(s, 8, now=130.0)
    assert f["mean_accepted_length"] is None and f["steps_per_s"] == 0.0
    assert f["mean_accepted_length_total"] == round(st.mean_accepted_length, 3)


def test_plain_scheduler_has_no_speculation_fields():
    s = create_scheduler()
    s.add_request("a", create_prompt(5), sampling(max_tokens=4))
    p = ProgressLog(every_s=1.0)
    p.fields(s, 0, now=0.0)
    f = p.fields(s, 3, now=2.0)
    assert f == {"steps_per_s": 1.5, "running": 0, "waiting": 1,
                 "free_kv_blocks": s.allocator.num_free}


def test_engine_logs_the_progress_line():
    async def go():
        e = Engine(SchedulerConfig(worker="127.0.0.1:1"))
        e.core, e._progress = spec_scheduler(), ProgressLog(every_s=0.0)
        with capture_logs() as logs:
            e._maybe_log_progress()  # starts the interval
            e.steps = 3
            e._maybe_log_progress()
        await e.channel.close()
        return logs

    logs = asyncio.run(go())
    assert [x["event"] for x in logs] == ["progress"]
    assert logs[0]["mean_accepted_length"] is None and logs[0]["running"] == 0
    assert len(logs[0]["per_position_acceptance"]) == K
