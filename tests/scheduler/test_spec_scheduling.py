"""Speculative scheduling in the pure scheduler core: leases, acceptance, stops, fallback.

A fake speculative worker drafts from a controllable "drafter" (the true next
tokens of the fake model, corrupted at chosen slots), writes the KV of every
verify row through the block table, and returns the target's own token after
each row, exactly like the real worker's VerifyResult for greedy requests. The
committed output must equal plain unbatched generation in every case.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from dspark.scheduler.core import Scheduler
from dspark.shared.config import SchedulerConfig
from dspark.shared.types import FinishReason, SeqOutput, StepOutput, StepPlan, WorkerInfo

from sched_helpers import EOS, VOCAB, FakeWorker, create_prompt, next_token, reference, sampling

K = 7


def spec_scheduler(num_blocks=64, block_size=4, budget=64, max_num_seqs=8, leases=8,
                   max_model_len=256, k=K) -> Scheduler:
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                             max_waiting=64)
    info = WorkerInfo(model_name="fake", model_id="fake", vocab_size=VOCAB, hidden_size=8,
                      num_layers=1, num_kv_blocks=num_blocks, block_size=block_size,
                      max_model_len=max_model_len, eos_token_ids=(EOS,), dtype="float32",
                      device="cpu", num_speculative_tokens=k, num_leases=leases)
    return Scheduler(config, info)


class SpecFakeWorker(FakeWorker):
    """FakeWorker plus greedy drafting/verification. ``wrong(step, slot)`` says
    which draft slots (0-based) get a wrong token."""

    def __init__(self, num_blocks, block_size, wrong=lambda step, slot: False,
                 token_fn=next_token):
        super().__init__(num_blocks, block_size, token_fn)
        self.wrong = wrong
        self.leases_seen: dict[str, set[int]] = {}

    def _ctx(self, seq, end):
        return [self.kv[seq.block_ids[p // self.bs]][p % self.bs] for p in range(end)]

    def step(self, plan: StepPlan) -> StepOutput:
        plain = replace(plan, seqs=[s for s in plan.seqs if not s.num_speculative_tokens])
        by_id = {o.request_id: o for o in super().step(plain).outputs} if plain.seqs else {}
        outs = []
        for seq in plan.seqs:
            if seq.lease_id >= 0:
                self.leases_seen.setdefault(seq.request_id, set()).add(seq.lease_id)
            k = seq.num_speculative_tokens
            if not k:
                outs.append(by_id[seq.request_id])
                continue
            assert seq.lease_id >= 0 and len(seq.token_ids) == 1 and seq.sample
            a = seq.start_position
            ctx = self._ctx(seq, a) + [seq.token_ids[0]]
            drafts = []
            for slot in range(k):  # the "drafter": the true continuation, maybe corrupted
                t = self.token_fn(ctx + drafts, seq.seed)
                drafts.append((t + 1) % 97 + 3 if self.wrong(self.steps, slot) else t)
            rows = [seq.token_ids[0]] + drafts
            assert len(seq.block_ids) * self.bs >= a + k + 1, "no KV room for the verify rows"
            for i, tok in enumerate(rows):
                p = a + i
                self.kv[seq.block_ids[p // self.bs]][p % self.bs] = tok
            target = [self.token_fn(self._ctx(seq, a + i + 1), seq.seed) for i in range(k + 1)]
            outs.append(SeqOutput(seq.request_id, draft_tokens=drafts, target_tokens=target,
                                  q_draft=[1.0 if d == t else 0.0 for d, t in zip(drafts, target)],
                                  p_draft=[1.0] * k, residual_tokens=[-1] * k))
        self.steps += 0 if plain.seqs else 1
        return StepOutput(plan.step_id, outs)


def check_spec_invariants(s: Scheduler) -> None:
    bs = s.block_size
    owned, leases = [], []
    for rid in s.running_ids():
        req = s.get_request(rid)
        assert len(req.block_ids) >= -(-req.num_computed_tokens // bs)
        assert len(req.block_ids) <= -(-(req.num_tokens + K + 1) // bs) + 1
        owned += req.block_ids
        assert req.lease_id >= 0
        leases.append(req.lease_id)
    for rid in s.waiting_ids():
        req = s.get_request(rid)
        assert req.block_ids == [] and req.lease_id == -1
    assert len(owned) == len(set(owned)) and len(leases) == len(set(leases))
    assert s.allocator.num_free + len(owned) == s.allocator.num_total
    assert s.load()["free_leases"] + len(leases) == s.num_leases


def run(s: Scheduler, w: SpecFakeWorker, on_step=None, max_steps=5000):
    res: dict[str, list] = {}
    finals = {}
    for _ in range(max_steps):
        if not s.has_unfinished():
            return res, finals
        plan = s.schedule()
        assert plan is not None
        check_spec_invariants(s)
        out = w.step(plan)
        if on_step:
            on_step(plan)
        for ro in s.update_from_output(plan, out):
            res.setdefault(ro.request_id, []).extend(ro.new_token_ids)
            if ro.finished:
                finals[ro.request_id] = ro
        check_spec_invariants(s)
    raise AssertionError("did not finish")


@pytest.mark.parametrize("pattern,tau", [
    ("all", K + 1.0),          # every draft right: K + 1 tokens per verify step
    ("first", 1.0),            # slot 1 always wrong: only the target's own token
    ("middle", 4.0),           # slot 4 wrong: 3 drafts + the correction
    ("mixed", None),
])
def test_greedy_speculation_equals_plain_generation(pattern, tau):
    wrong = {"all": lambda st, sl: False, "first": lambda st, sl: sl == 0,
             "middle": lambda st, sl: sl == 3,
             "mixed": lambda st, sl: (st * 7 + sl * 3) % 5 == 0}[pattern]
    s = spec_scheduler()
    w = SpecFakeWorker(64, 4, wrong)
    prompts = {f"r{i}": create_prompt(5 + 3 * i, salt=i) for i in range(4)}
    for rid, p in prompts.items():
        s.add_request(rid, p, sampling(max_tokens=40, seed=int(rid[1:])))
    res, finals = run(s, w)
    for rid, p in prompts.items():
        want, reason = reference(p, sampling(max_tokens=40, seed=int(rid[1:])))
        assert res[rid] == want
        assert finals[rid].finish_reason == reason == FinishReason.LENGTH
        sp = finals[rid].spec
        assert sp.verify_steps > 0 and sp.num_draft_tokens == K * sp.verify_steps
        if tau is not None:
            assert sp.mean_accepted_length == pytest.approx(tau)
            acc = sp.per_position_acceptance
            if pattern == "all":
                assert acc == [1.0] * K
            if pattern == "first":
                assert acc[0] == 0.0
            if pattern == "middle":
                assert acc[:4] == [1.0, 1.0, 1.0, 0.0]
    assert s.load()["free_kv_blocks"] == 64 and s.load()["free_leases"] == 8
    tot = s.spec_totals
    assert tot.num_accepted_tokens == sum(f.spec.num_accepted_tokens for f in finals.values())


def test_stop_token_inside_the_accepted_run_truncates_it():
    # the fake model emits EOS once the sequence reaches 20 tokens
    def token_fn(ctx, seed):
        return EOS if len(ctx) == 20 else next_token(ctx, seed)

    s = spec_scheduler()
    w = SpecFakeWorker(64, 4, token_fn=token_fn)  # all drafts right: EOS is mid-run
    p = create_prompt(9)
    s.add_request("a", p, sampling(max_tokens=100))
    res, finals = run(s, w)
    want, reason = reference(p, sampling(max_tokens=100), token_fn=token_fn)
    assert res["a"] == want and want[-1] == EOS and len(want) == 12
    assert finals["a"].finish_reason == FinishReason.STOP
    assert s.load()["free_kv_blocks"] == 64 and s.load()["free_leases"] == 8


def test_max_tokens_inside_the_accepted_run():
    s = spec_scheduler()
    w = SpecFakeWorker(64, 4)
    s.add_request("a", create_prompt(6), sampling(max_tokens=10))
    res, finals = run(s, w)
    assert res["a"] == reference(create_prompt(6), sampling(max_tokens=10))[0]
    assert len(res["a"]) == 10 and finals["a"].finish_reason == FinishReason.LENGTH


def test_fallback_at_the_position_ceiling_is_counted():
    s = spec_scheduler(max_model_len=40)
    w = SpecFakeWorker(64, 4)
    p = create_prompt(10)
    s.add_request("a", p, sampling(max_tokens=100))
    res, finals = run(s, w)
    want, reason = reference(p, sampling(max_tokens=100), max_len=40)
    assert res["a"] == want and reason == FinishReason.LENGTH and len(p) + len(want) == 40
    sp = finals["a"].spec
    # the window anchor_pos + K must stay < 40: after that, one token per step
    assert sp.fallback_steps > 0
    assert len(want) == 1 + sum([sp.committed_in_verify]) + sp.fallback_steps


def test_leases_are_stable_queue_when_exhausted_and_return():
    s = spec_scheduler(leases=2, max_num_seqs=8)
    w = SpecFakeWorker(64, 4, lambda st, sl: sl == 2)
    for i in range(5):
        s.add_request(f"r{i}", create_prompt(4 + i, salt=i), sampling(max_tokens=12, seed=i))
    running_max = []
    res, finals = run(s, w, on_step=lambda plan: running_max.append(len(s.running_ids())))
    assert max(running_max) == 2  # only as many speculating requests as leases
    assert all(len(v) == 1 for v in w.leases_seen.values())  # one stable lease each
    assert len(res) == 5 and s.load()["free_leases"] == 2


def test_abort_and_preemption_return_leases_and_blocks():
    s = spec_scheduler(num_blocks=14, block_size=4, leases=3)
    w = SpecFakeWorker(14, 4, lambda st, sl: sl == 5)
    for i in range(3):
        s.add_request(f"r{i}", create_prompt(8, salt=i), sampling(max_tokens=30, seed=i))
    aborted = []

    def on_step(plan):
        if len(aborted) == 0 and w.steps >= 3:
            aborted.append(s.abort("r1"))

    res, finals = run(s, w, on_step=on_step)
    assert aborted[0].finish_reason == FinishReason.ABORT and aborted[0].spec is not None
    assert s.num_preemptions > 0  # 14 blocks cannot hold 3 x (8 + 30 + 8) tokens
    for rid in ("r0", "r2"):
        assert res[rid] == reference(create_prompt(8, salt=int(rid[1])),
                                     sampling(max_tokens=30, seed=int(rid[1])))[0]
    assert s.load()["free_kv_blocks"] == 14 and s.load()["free_leases"] == 3


def test_no_speculation_without_leases_or_k():
    s = spec_scheduler(k=0, leases=0)
    plan = None
    s.add_request("a", create_prompt(5), sampling(max_tokens=3))
    plan = s.schedule()
    assert plan.seqs[0].lease_id == -1 and plan.seqs[0].num_speculative_tokens == 0
    assert s.load()["total_leases"] == 0
