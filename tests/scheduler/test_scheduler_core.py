"""Scheduler core: batching, chunked prefill, stops, aborts, preemption."""
import ast
from pathlib import Path

import pytest

from dspark.scheduler.core import AdmissionError, RequestStatus, RequestValidationError
from dspark.shared.types import FinishReason, SeqOutput, StepOutput
from sched_helpers import (EOS, FakeWorker, create_prompt, create_scheduler,
                           drive, next_token, reference, sampling)


def _outputs_for(plan, tokens: dict[str, int]) -> StepOutput:
    return StepOutput(plan.step_id, [SeqOutput(s.request_id, tokens.get(s.request_id, -1)
                                               if s.sample else -1) for s in plan.seqs])


def _step(sched, worker):
    plan = sched.schedule()
    return plan, sched.update_from_output(plan, worker.step(plan))


# ---------------------------------------------------------------- batching

def test_budget_and_max_num_seqs():
    sched = create_scheduler(budget=10, max_num_seqs=3)
    for i in range(5):
        sched.add_request(f"r{i}", create_prompt(4, i), sampling())
    plan = sched.schedule()
    # r0, r1 whole (8 tokens), r2 gets a 2-token chunk; r3, r4 wait
    assert [(s.request_id, len(s.token_ids), s.sample) for s in plan.seqs] == [
        ("r0", 4, True), ("r1", 4, True), ("r2", 2, False)]
    assert sched.waiting_ids() == ["r3", "r4"]
    sched.update_from_output(plan, FakeWorker(64, 4).step(plan))
    plan = sched.schedule()  # 2 decodes + r2's tail; seq slots still full
    assert [(s.request_id, len(s.token_ids)) for s in plan.seqs] == [
        ("r0", 1), ("r1", 1), ("r2", 2)]
    assert sched.load()["num_running"] == 3 and sched.load()["num_waiting"] == 2


def test_nothing_to_run_returns_none():
    sched = create_scheduler()
    sched.config.async_scheduling = False
    assert sched.schedule() is None and not sched.has_unfinished()
    sched.add_request("a", [5, 6], sampling())
    plan = sched.schedule()
    assert sched.schedule() is None  # its sample is in flight
    sched.update_from_output(plan, _outputs_for(plan, {"a": 9}))
    assert sched.schedule() is not None


def test_async_defers_a_plain_request_once_while_its_sample_is_in_flight():
    """Async scheduling, no drafter: the next step of a request whose sample is in
    flight is planned at once with its anchor left to the worker (one position
    further, a block reserved for it); a third plan waits for the first result."""
    sched = create_scheduler(block_size=4)
    assert sched.config.async_scheduling
    sched.add_request("a", [5, 6, 7, 8], sampling(max_tokens=5))
    first = sched.schedule()
    nxt = sched.schedule()
    (seq,) = nxt.seqs
    assert seq.deferred_anchor and seq.token_ids == [] and seq.start_position == 3
    assert seq.num_speculative_tokens == 0 and seq.lease_id < 0
    assert len(seq.block_ids) == 2  # position 4 (the next anchor) is in the second block
    assert sched.schedule() is None  # both in flight: nothing more to plan
    sched.update_from_output(first, _outputs_for(first, {"a": 9}))
    assert sched.get_request("a").output_token_ids == [9]


def test_chunked_prefill_positions_block_tables_and_terminal_sample():
    sched = create_scheduler(block_size=4, budget=6)
    prompt = create_prompt(14)
    sched.add_request("a", prompt, sampling(max_tokens=3))
    worker = FakeWorker(64, 4)
    seen, outs = [], []
    for _ in range(3):
        plan, outs = _step(sched, worker)
        (seq,) = plan.seqs
        seen.append((seq.start_position, seq.token_ids, len(seq.block_ids), seq.sample))
    assert seen == [(0, prompt[0:6], 2, False), (6, prompt[6:12], 3, False),
                    (12, prompt[12:14], 4, True)]
    assert outs[0].new_token_ids == [next_token(prompt)]  # only the terminal chunk samples
    req = sched.get_request("a")
    assert req.num_computed_tokens == 14 and req.output_token_ids == outs[0].new_token_ids


def test_terminal_chunk_samples_and_block_table_grows_stably():
    sched = create_scheduler(block_size=4, budget=5)
    prompt = create_prompt(10)
    sched.add_request("a", prompt, sampling(max_tokens=4))
    worker = FakeWorker(64, 4)
    tables = []
    plan, _ = _step(sched, worker)
    assert not plan.seqs[0].sample
    tables.append(plan.seqs[0].block_ids)
    plan, outs = _step(sched, worker)
    assert plan.seqs[0].sample and plan.seqs[0].start_position == 5
    tables.append(plan.seqs[0].block_ids)
    assert tables[1][:len(tables[0])] == tables[0]  # table only grows
    assert outs[0].new_token_ids == [next_token(prompt)]


def test_decode_feeds_last_output_and_appends():
    sched = create_scheduler(block_size=4)
    prompt = create_prompt(3)
    sched.add_request("a", prompt, sampling(max_tokens=5))
    plan = sched.schedule()
    sched.update_from_output(plan, _outputs_for(plan, {"a": 42}))
    plan = sched.schedule()
    (seq,) = plan.seqs
    assert seq.token_ids == [42] and seq.start_position == 3 and seq.sample
    assert len(seq.block_ids) == 1
    outs = sched.update_from_output(plan, _outputs_for(plan, {"a": 43}))
    assert outs[0].new_token_ids == [43] and not outs[0].finished
    plan = sched.schedule()  # position 4 opens block 1
    assert plan.seqs[0].token_ids == [43] and len(plan.seqs[0].block_ids) == 2
    assert sched.tokens_for("a") == prompt + [42, 43]


def test_sampling_params_forwarded():
    sched = create_scheduler()
    sched.add_request("a", [5, 6], sampling(temperature=0.7, top_p=0.9, top_k=5, seed=1234))
    (seq,) = sched.schedule().seqs
    assert (seq.temperature, seq.top_p, seq.top_k, seq.seed) == (0.7, 0.9, 5, 1234)


# ---------------------------------------------------------------- stop conditions

def _run_one(sched, prompt, sp, tokens):
    sched.add_request("a", prompt, sp)
    outs = []
    for tok in tokens:
        plan = sched.schedule()
        outs += sched.update_from_output(plan, _outputs_for(plan, {"a": tok}))
        if outs[-1].finished:
            break
    return outs


def test_eos_finishes_and_frees_blocks():
    sched = create_scheduler()
    outs = _run_one(sched, create_prompt(9), sampling(), [50, EOS, 51])
    assert [o.new_token_ids for o in outs] == [[50], [EOS]]
    assert outs[-1].finish_reason == FinishReason.STOP
    assert not sched.has_unfinished() and sched.load()["free_kv_blocks"] == 64
    assert sched.get_request("a") is None


def test_ignore_eos_continues_to_max_tokens():
    sched = create_scheduler()
    outs = _run_one(sched, [5], sampling(ignore_eos=True, max_tokens=3), [EOS, EOS, EOS, EOS])
    assert [o.finish_reason for o in outs] == [FinishReason.NONE] * 2 + [FinishReason.LENGTH]


def test_stop_token_is_kept_in_output():
    sched = create_scheduler()
    outs = _run_one(sched, [5], sampling(stop_token_ids=(77,)), [60, 77, 61])
    assert [t for o in outs for t in o.new_token_ids] == [60, 77]
    assert outs[-1].finish_reason == FinishReason.STOP


def test_max_tokens_gives_length():
    sched = create_scheduler()
    outs = _run_one(sched, [5, 6], sampling(max_tokens=2), [60, 61, 62])
    assert len(outs) == 2 and outs[-1].finish_reason == FinishReason.LENGTH
    assert sched.load()["free_kv_blocks"] == 64


def test_max_model_len_gives_length():
    sched = create_scheduler(max_model_len=6)
    outs = _run_one(sched, create_prompt(4), sampling(max_tokens=100), [60, 61, 62])
    assert [t for o in outs for t in o.new_token_ids] == [60, 61]  # 4 + 2 = 6 tokens
    assert outs[-1].finish_reason == FinishReason.LENGTH


def test_stop_beats_length_on_the_last_token():
    sched = create_scheduler()
    outs = _run_one(sched, [5], sampling(max_tokens=1), [EOS])
    assert outs[-1].finish_reason == FinishReason.STOP


def test_sole_request_larger_than_kv_pool_ends_with_length():
    # max_model_len allows 256 tokens but the pool holds 3 * 4 = 12 positions
    sched = create_scheduler(num_blocks=3, block_size=4)
    sched.add_request("a", create_prompt(5), sampling(max_tokens=100))
    res = drive(sched, FakeWorker(3, 4))
    toks, reason = res["a"]
    assert reason == FinishReason.LENGTH and 5 + len(toks) == 13
    assert sched.num_preemptions == 0


# ---------------------------------------------------------------- abort

def test_abort_waiting_running_unknown_idempotent():
    sched = create_scheduler(max_num_seqs=1)
    sched.add_request("a", [5, 6], sampling())
    sched.add_request("b", [7, 8], sampling())
    plan = sched.schedule()
    sched.update_from_output(plan, _outputs_for(plan, {"a": 9}))
    assert sched.abort("b").finish_reason == FinishReason.ABORT
    assert sched.get_request("b") is None and sched.waiting_ids() == []
    out = sched.abort("a")
    assert out.finish_reason == FinishReason.ABORT and out.new_token_ids == []
    assert sched.abort("a") is None and sched.abort("nope") is None
    assert not sched.has_unfinished() and sched.load()["free_kv_blocks"] == 64
    sched.add_request("a", [1], sampling())  # the id is free again


def test_abort_returns_output_once():
    sched = create_scheduler()
    sched.add_request("b", [7, 8], sampling())
    first, second = sched.abort("b"), sched.abort("b")
    assert first.finish_reason == FinishReason.ABORT and second is None


def test_abort_with_step_in_flight_ignores_result_and_frees_blocks():
    sched = create_scheduler(num_blocks=4, block_size=4)
    worker = FakeWorker(4, 4)
    sched.add_request("a", create_prompt(8), sampling())
    sched.add_request("b", create_prompt(4, 1), sampling(max_tokens=3))
    plan = sched.schedule()
    result = worker.step(plan)  # "in flight"
    assert sched.abort("a").finish_reason == FinishReason.ABORT
    assert sched.load()["free_kv_blocks"] == 3  # a's 2 blocks back at once; b holds 1
    outs = sched.update_from_output(plan, result)
    assert [o.request_id for o in outs] == ["b"]
    # a's blocks are reused by a later step; b still completes correctly
    sched.add_request("c", create_prompt(8, 2), sampling(max_tokens=2))
    res = drive(sched, worker)
    assert (outs[0].new_token_ids + res["b"][0], res["b"][1]) == reference(
        create_prompt(4, 1), sampling(max_tokens=3))
    assert res["c"] == reference(create_prompt(8, 2), sampling(max_tokens=2))
    assert sched.load()["free_kv_blocks"] == 4


def test_readded_id_ignores_stale_result():
    sched = create_scheduler()
    sched.add_request("a", [5, 6], sampling())
    plan = sched.schedule()
    sched.abort("a")
    sched.add_request("a", [7, 8, 9], sampling())
    assert sched.update_from_output(plan, _outputs_for(plan, {"a": 40})) == []
    assert sched.tokens_for("a") == [7, 8, 9]


# ---------------------------------------------------------------- preemption

def test_preemption_by_recompute_reproduces_unpreempted_tokens():
    # 6 blocks of 4 = 24 positions for three requests that want ~17 each
    sched = create_scheduler(num_blocks=6, block_size=4, budget=16)
    prompts = {f"r{i}": create_prompt(6, i) for i in range(3)}
    sp = sampling(max_tokens=10, seed=3)
    for rid, p in prompts.items():
        sched.add_request(rid, p, sp)
    res = drive(sched, FakeWorker(6, 4))
    assert sched.num_preemptions > 0
    for rid, p in prompts.items():
        assert res[rid] == reference(p, sp), rid
    assert sched.load()["free_kv_blocks"] == 6


def test_preempts_youngest_and_requeues_at_front():
    sched = create_scheduler(num_blocks=3, block_size=4, budget=32)
    sched.add_request("old", create_prompt(4), sampling(max_tokens=20))
    sched.add_request("young", create_prompt(8, 1), sampling(max_tokens=20))
    sched.add_request("late", [5], sampling())
    worker = FakeWorker(3, 4)
    plan, outs = _step(sched, worker)  # old: 1 block, young: 2 blocks; late waits
    assert sched.waiting_ids() == ["late"]
    plan, outs = _step(sched, worker)  # old needs block 2 at position 4 -> young preempted
    young = sched.get_request("young")
    assert young.status == RequestStatus.PREEMPTED and young.num_preemptions == 1
    assert young.output_token_ids and young.block_ids == []
    assert sched.waiting_ids() == ["young", "late"]
    assert [s.request_id for s in plan.seqs] == ["old"]


def test_preempted_request_reprefills_prompt_and_outputs_then_samples():
    sched = create_scheduler(num_blocks=3, block_size=4, budget=32)
    sched.add_request("old", create_prompt(4), sampling(max_tokens=2))
    sched.add_request("young", create_prompt(8, 1), sampling(max_tokens=3))
    worker = FakeWorker(3, 4)
    _step(sched, worker)
    _step(sched, worker)  # young preempted, old finishes (max_tokens=2)
    young_tokens = sched.tokens_for("young")
    plan, _ = _step(sched, worker)
    (seq,) = plan.seqs
    assert seq.request_id == "young" and seq.start_position == 0
    assert seq.token_ids == young_tokens and seq.sample


def test_mixed_run_frees_all_blocks():
    sched = create_scheduler(num_blocks=10, block_size=4, budget=12, max_num_seqs=4)
    worker = FakeWorker(10, 4)
    sps = {}
    for i in range(10):
        sp = sampling(max_tokens=4 + i, seed=i, stop_token_ids=(50,) if i % 3 == 0 else ())
        sps[f"r{i}"] = sp
        sched.add_request(f"r{i}", create_prompt(3 + 2 * i, i), sp)
    aborted = set()

    def abort_some(plan):
        if len(aborted) < 3 and plan.step_id % 4 == 3 and plan.seqs:
            rid = plan.seqs[-1].request_id
            assert sched.abort(rid).finish_reason == FinishReason.ABORT
            aborted.add(rid)

    res = drive(sched, worker, on_step=abort_some)
    assert sched.num_preemptions > 0 and len(aborted) == 3
    assert sched.load() == {"num_waiting": 0, "num_running": 0, "free_kv_blocks": 10,
                            "total_kv_blocks": 10, "outstanding_tokens": 0,
                            "free_leases": 0, "total_leases": 0}
    for i in range(10):
        rid = f"r{i}"
        if rid not in aborted:
            assert res[rid] == reference(create_prompt(3 + 2 * i, i), sps[rid]), rid


def test_watermark_holds_back_admission_but_not_an_idle_scheduler():
    sched = create_scheduler(num_blocks=4, block_size=4, watermark_blocks=2)
    sched.add_request("a", create_prompt(8), sampling())
    sched.add_request("b", create_prompt(4, 1), sampling())
    plan = sched.schedule()  # a alone may use the watermark; b would leave 1 < 2 free
    assert [s.request_id for s in plan.seqs] == ["a"]


# ---------------------------------------------------------------- admission, validation

def test_admission_error_when_waiting_queue_full():
    sched = create_scheduler(max_waiting=2)
    sched.add_request("a", [5], sampling())
    sched.add_request("b", [5], sampling())
    with pytest.raises(AdmissionError, match="max_waiting=2"):
        sched.add_request("c", [5], sampling())
    sched.schedule()  # a and b run; the queue has room again
    sched.add_request("c", [5], sampling())


@pytest.mark.parametrize("rid,prompt,sp,field,limit", [
    ("", [5], sampling(), "request_id", "empty"),
    ("a", [], sampling(), "prompt_token_ids", "empty"),
    ("a", [5] * 64, sampling(), "prompt_token_ids", "max_model_len=64"),
    ("a", [5] * 41, sampling(), "prompt_token_ids", "num_kv_blocks=10"),
    ("a", [5, 500], sampling(), "prompt_token_ids", "0..127"),
    ("a", [5], sampling(max_tokens=0), "max_tokens", ">= 1"),
])
def test_validation_errors_name_field_and_limit(rid, prompt, sp, field, limit):
    sched = create_scheduler(num_blocks=10, block_size=4, max_model_len=64)
    with pytest.raises(RequestValidationError, match=field) as exc:
        sched.add_request(rid, prompt, sp)
    assert limit in str(exc.value) and exc.value.field == field
    assert isinstance(exc.value, ValueError)


def test_duplicate_id_rejected():
    sched = create_scheduler()
    sched.add_request("a", [5], sampling())
    with pytest.raises(ValueError, match="request_id"):
        sched.add_request("a", [6], sampling())


def test_update_rejects_mismatched_or_missing_output_without_changes():
    sched = create_scheduler()
    sched.add_request("a", [5], sampling())
    sched.add_request("b", [6], sampling())
    plan = sched.schedule()
    with pytest.raises(ValueError, match="step_id"):
        sched.update_from_output(plan, StepOutput(plan.step_id + 1, []))
    with pytest.raises(ValueError, match="'b'"):
        sched.update_from_output(plan, StepOutput(plan.step_id, [SeqOutput("a", 9)]))
    assert sched.tokens_for("a") == [5]  # nothing committed
    outs = sched.update_from_output(plan, _outputs_for(plan, {"a": 9, "b": 10}))
    assert [o.new_token_ids for o in outs] == [[9], [10]]


# ---------------------------------------------------------------- reset, load

def test_reset_computed_requeues_running_and_recomputes_identically():
    sched = create_scheduler(block_size=4, budget=8, max_num_seqs=2)
    worker = FakeWorker(64, 4)
    sps = sampling(max_tokens=6)
    for i in range(3):
        sched.add_request(f"r{i}", create_prompt(5, i), sps)
    res = {}
    for _ in range(3):
        _, outs = _step(sched, worker)
        for o in outs:
            res.setdefault(o.request_id, []).extend(o.new_token_ids)
    plan = sched.schedule()  # in flight when the worker dies
    sched.reset_computed()
    assert sched.update_from_output(plan, worker.step(plan)) == []
    assert sched.waiting_ids() == ["r0", "r1", "r2"] and sched.running_ids() == []
    assert sched.load()["free_kv_blocks"] == 64 and sched.num_preemptions == 0
    assert all(sched.get_request(r).num_computed_tokens == 0 for r in ("r0", "r1"))
    fresh = FakeWorker(64, 4)  # the restarted worker has an empty KV cache
    for rid, (toks, reason) in drive(sched, fresh).items():
        res.setdefault(rid, []).extend(toks)
        assert reason == FinishReason.LENGTH
    for i in range(3):
        assert res[f"r{i}"] == reference(create_prompt(5, i), sps)[0]


def test_load_reports_queue_and_outstanding_tokens():
    sched = create_scheduler(num_blocks=8, block_size=4, budget=4, max_num_seqs=1)
    sched.add_request("a", create_prompt(6), sampling(max_tokens=3))
    sched.add_request("b", create_prompt(2), sampling(max_tokens=5))
    assert sched.load()["outstanding_tokens"] == (6 + 3) + (2 + 5)
    sched.schedule()  # a: 4 of 6 prompt tokens
    assert sched.load() == {"num_waiting": 1, "num_running": 1, "free_kv_blocks": 7,
                            "total_kv_blocks": 8, "outstanding_tokens": (2 + 3) + (2 + 5),
                            "free_leases": 0, "total_leases": 0}


def test_core_imports_no_torch_or_grpc():
    core = Path(__file__).resolve().parents[2] / "services" / "scheduler" / "core"
    for path in core.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in ("torch", "grpc", "numpy"), (path, name)
                assert "dspark.v1" not in name and "_pb2" not in name, (path, name)



def test_async_plain_decoding_keeps_the_batch_whole():
    """Async scheduling with plain (K = 0) requests: each one's next step is
    planned while its step is in flight, its anchor left to the worker (the token
    it sampled), so steps run back to back. Requests that arrived at different
    times still decode together, one step per token, every step after the first
    carries deferred anchors, and the outputs are the unbatched reference."""
    from collections import deque

    sched = create_scheduler(num_blocks=64, budget=64)
    assert sched.config.async_scheduling
    worker = FakeWorker(64, 4)
    prompts = {f"r{i}": create_prompt(5 + i, salt=i) for i in range(4)}
    sp = sampling(max_tokens=12, ignore_eos=True)
    results: dict[str, list[int]] = {rid: [] for rid in prompts}
    inflight: deque = deque()
    sizes = []
    for rid in ("r0", "r1"):
        sched.add_request(rid, prompts[rid], sp)
    for step in range(200):
        if not sched.has_unfinished() and not inflight:
            break
        plan = sched.schedule()
        if plan is not None:
            sizes.append(len(plan.seqs))
            inflight.append((plan, worker.step(plan)))
        if step == 2:  # two more arrive while the first two's step is in flight
            for rid in ("r2", "r3"):
                sched.add_request(rid, prompts[rid], sp)
        keep = 1 if plan is not None else 0
        while len(inflight) > keep:
            p, out = inflight.popleft()
            for ro in sched.update_from_output(p, out):
                results[ro.request_id].extend(ro.new_token_ids)
    for rid, prompt in prompts.items():
        assert results[rid] == reference(prompt, sp)[0]
    # once all four run, every step carries all four (no halves taking turns)
    assert sizes.count(4) >= 8 and max(sizes) == 4
    assert len(sizes) <= 12 + 4, sizes
    assert worker.deferred >= 4 * 8  # pipelined: the anchors were the worker's own
    assert sched.allocator.num_free == sched.allocator.num_total  # reservations back
