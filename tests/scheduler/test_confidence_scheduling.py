"""Confidence-scheduled verification in the pure scheduler core (verify "confidence").

A fake greedy worker drafts the true continuation of the fake model (corrupted at
chosen slots), reports controllable confidences, fills the step's verify budget
with the real fill rule (shared/verify_fill.py), resolves deferred anchors from
its own acceptance (async scheduling) and writes every verify row through the
block tables. Output must equal plain generation; counters, KV blocks and leases
must add up. Hand-built results with chosen l_r check the bookkeeping directly.
"""
from __future__ import annotations

from collections import deque

import pytest

from dspark.scheduler.core import Scheduler
from dspark.shared.acceptance import VerifyResult, accept
from dspark.shared.config import SchedulerConfig
from dspark.shared.types import SeqOutput, SpsProfile, StepOutput, StepPlan, WorkerInfo
from dspark.shared.verify_fill import fill_verify_budget

from sched_helpers import EOS, VOCAB, create_prompt, next_token, reference, sampling

K = 7
FREE = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0))  # extra rows cost nothing
BOUND = SpsProfile(rows=(1, 256), forward_ms=(1.0, 256.0))  # every row costs the same


def conf_scheduler(profile, num_blocks=64, block_size=4, budget=64, max_num_seqs=8,
                   leases=8, async_=False, policy="confidence") -> Scheduler:
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                             max_waiting=64, async_scheduling=async_)
    info = WorkerInfo(model_name="fake", model_id="fake", vocab_size=VOCAB, hidden_size=8,
                      num_layers=1, num_kv_blocks=num_blocks, block_size=block_size,
                      max_model_len=256, eos_token_ids=(EOS,), dtype="float32", device="cpu",
                      num_speculative_tokens=K, num_leases=leases, verify_policy=policy,
                      sps_profile=profile)
    return Scheduler(config, info)


class BudgetWorker:
    """Greedy fake worker: drafts, confidences, the verify-budget fill, deferred anchors."""

    def __init__(self, num_blocks, bs, wrong=lambda rid, pos: False,
                 conf=lambda rid, pos: 0.6):
        self.bs = bs
        self.kv = [[None] * bs for _ in range(num_blocks)]
        self.wrong, self.conf = wrong, conf
        self.last: dict[str, tuple] = {}  # rid -> what its last step yields as next anchor
        self.sampled: set[str] = set()
        self.counts: dict[str, dict[str, int]] = {}
        self.lens: list[list[int]] = []  # per step: l_r of its speculating seqs

    def _ctx(self, blocks, end):
        ctx = [self.kv[blocks[p // self.bs]][p % self.bs] for p in range(end)]
        assert None not in ctx
        return ctx

    def _resolve(self, rid):
        last = self.last[rid]
        if last[0] == "token":
            return last[1], last[2]
        res, a = last[1], last[2]
        toks = accept(res, greedy=True).tokens
        return toks[-1], a + len(toks)

    def step(self, plan: StepPlan) -> StepOutput:
        seen: set[int] = set()
        for s in plan.seqs:
            assert not seen & set(s.block_ids), "block shared in one step"
            seen |= set(s.block_ids)
        work = []
        for s in plan.seqs:
            toks, start = list(s.token_ids), s.start_position
            if s.deferred_anchor:
                tok, start = self._resolve(s.request_id)
                toks = [tok]
            drafts, confs = [], []
            if s.num_speculative_tokens:
                assert len(toks) == 1 and s.lease_id >= 0 and s.sample
                ctx = self._ctx(s.block_ids, start) + toks
                for slot in range(s.num_speculative_tokens):
                    t = next_token(ctx + drafts, s.seed)
                    pos = start + slot + 1
                    drafts.append((t + 1) % 97 + 3 if self.wrong(s.request_id, pos) else t)
                    confs.append(self.conf(s.request_id, pos))
            work.append((s, toks, start, drafts, confs))
        spec = [w for w in work if w[0].num_speculative_tokens]
        if plan.verify_budget is not None:
            lens = fill_verify_budget([w[4] for w in spec], plan.verify_budget,
                                      plan.verify_step_ms,
                                      base_tokens=sum(1 for w in work if w[0].sample))
        else:
            lens = [len(w[3]) for w in spec]
        self.lens.append(lens)
        nver = {id(w[0]): n for w, n in zip(spec, lens)}
        for s, toks, start, drafts, _ in work:  # write every row first (a batched forward)
            rows = toks + drafts[:nver.get(id(s), 0)]
            assert len(s.block_ids) * self.bs >= start + len(rows), "no KV room"
            for i, t in enumerate(rows):
                p = start + i
                self.kv[s.block_ids[p // self.bs]][p % self.bs] = t
        outs = []
        for s, toks, start, drafts, confs in work:
            rid = s.request_id
            c = self.counts.setdefault(rid, dict(verify=0, l0=0, plain=0, drafts=0))
            o = SeqOutput(rid)
            if s.deferred_anchor:
                o.anchor_token, o.anchor_position = toks[0], start
            if s.num_speculative_tokens:
                n = nver[id(s)]
                d = drafts[:n]
                target = [next_token(self._ctx(s.block_ids, start + i + 1), s.seed)
                          for i in range(n + 1)]
                o.draft_tokens, o.target_tokens, o.confidences = d, target, confs
                o.q_draft = [1.0 if x == t else 0.0 for x, t in zip(d, target)]
                o.p_draft, o.residual_tokens = [1.0] * n, [-1] * n
                res = VerifyResult(d, target, o.q_draft, o.p_draft, [0.5] * n, [-1] * n)
                self.last[rid] = ("verify", res, start)
                c["verify" if n else "l0"] += 1
                c["drafts"] += n
                self.sampled.add(rid)  # (a prompt's 1-token last chunk may speculate)
            elif s.sample:
                o.token_id = next_token(self._ctx(s.block_ids, start + len(toks)), s.seed)
                self.last[rid] = ("token", o.token_id, start + len(toks))
                if rid in self.sampled:
                    c["plain"] += 1  # a one-token decode step
                self.sampled.add(rid)
            outs.append(o)
        return StepOutput(plan.step_id, outs)


def drive(s: Scheduler, w: BudgetWorker, async_: bool, on_update=None, max_steps=5000):
    inflight: deque = deque()
    res: dict[str, list[int]] = {}
    finals = {}
    for _ in range(max_steps):
        if not s.has_unfinished() and not inflight:
            return res, finals
        plan = s.schedule()
        if plan is not None:
            inflight.append((plan, w.step(plan)))
        assert inflight, "unfinished requests but nothing scheduled"
        keep = 1 if async_ and plan is not None else 0
        while len(inflight) > keep:
            p, o = inflight.popleft()
            for ro in s.update_from_output(p, o):
                res.setdefault(ro.request_id, []).extend(ro.new_token_ids)
                if ro.finished:
                    finals[ro.request_id] = ro
            if on_update:
                on_update(s, bool(inflight))
    raise AssertionError("did not finish")


def add(s, n=4, max_tokens=40):
    prompts = {f"r{i}": create_prompt(5 + 3 * i, salt=i) for i in range(n)}
    for rid, p in prompts.items():
        s.add_request(rid, p, sampling(max_tokens=max_tokens, seed=int(rid[1:])))
    return prompts


def no_over_reservation(s: Scheduler, inflight: bool) -> None:
    """Between steps (sync): no request holds KV past its next anchor's block."""
    if inflight:
        return
    for rid in s.running_ids():
        req = s.get_request(rid)
        assert len(req.block_ids) <= -(-req.num_tokens // s.block_size), rid


def check_counts(finals, w: BudgetWorker, prompts) -> None:
    for rid in prompts:
        sp, c = finals[rid].spec, w.counts[rid]
        assert sp.verify_steps == c["verify"]
        assert sp.unverified_steps == c["l0"] + c["plain"]
        assert sp.num_draft_tokens == c["drafts"]
        assert sp.fallback_steps == 0
        assert sum(sp.verified_per_pos) >= sp.num_accepted_tokens
        assert sp.verified_per_pos[0] == sp.verify_steps  # a verify step judges draft 1


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("case", ["free", "bound", "capped"])
def test_greedy_output_equals_plain_generation(case, async_):
    # "capped": the token budget leaves V in 1..6 for four requests, so l_r varies
    profile, budget = {"free": (FREE, 64), "bound": (BOUND, 64), "capped": (FREE, 8)}[case]
    s = conf_scheduler(profile, budget=budget, async_=async_)
    w = BudgetWorker(64, 4, wrong=lambda rid, pos: (pos * 7 + int(rid[1:])) % 5 == 0,
                     conf=lambda rid, pos: 0.3 + 0.1 * ((pos + int(rid[1:])) % 7))
    prompts = add(s)
    res, finals = drive(s, w, async_, on_update=no_over_reservation)
    for rid, p in prompts.items():
        assert res[rid] == reference(p, sampling(max_tokens=40, seed=int(rid[1:])))[0]
    check_counts(finals, w, prompts)
    tot = s.spec_totals
    if case == "bound":  # rows are never free: nothing is drafted, ever
        assert tot.verify_steps == 0 and tot.num_draft_tokens == 0
        assert all(lens == [] for lens in w.lens)
        assert tot.unverified_steps == sum(len(res[r]) - 1 for r in prompts)
    elif case == "free":  # every draft verified, as with a fixed K
        assert tot.unverified_steps == 0 and tot.num_draft_tokens == K * tot.verify_steps
    else:
        assert any(0 < sum(lens) < K * len(lens) for lens in w.lens if lens)
        assert any(0 in lens for lens in w.lens if len(lens) > 1)  # some l_r = 0
        assert tot.verify_steps > 0 and tot.unverified_steps > 0
    assert s.load()["free_kv_blocks"] == 64 and s.load()["free_leases"] == 8


def test_async_pipelines_plain_steps_of_speculating_requests():
    """Async, confidence mode, drafting never pays (every step plain): a request
    with a lease is planned again (a deferred anchor) while its plain step is in
    flight, as after a verify step, so it never waits a step out; when only some
    requests draft, the batch thus stays whole instead of splitting into halves
    taking turns. Output is exact and every block and lease comes back."""
    s = conf_scheduler(BOUND, budget=64, async_=True)
    w = BudgetWorker(64, 4)
    plans = []
    real = w.step
    w.step = lambda plan: plans.append(plan) or real(plan)
    prompts = add(s, n=4, max_tokens=24)
    res, finals = drive(s, w, True)
    for rid, p in prompts.items():
        assert res[rid] == reference(p, sampling(max_tokens=24, seed=int(rid[1:])))[0]
    check_counts(finals, w, prompts)
    deferred = [q for plan in plans for q in plan.seqs if q.deferred_anchor]
    assert len(deferred) >= 4 * 20 and all(q.num_speculative_tokens == 0 for q in deferred)
    assert all(len(plan.seqs) == 4 for plan in plans)  # always the whole batch
    assert len(plans) <= 24 + 2  # one step per token (+ prefill), pipelined
    assert s.load()["free_kv_blocks"] == 64 and s.load()["free_leases"] == 8


def test_the_budget_goes_to_the_confident_request():
    s = conf_scheduler(FREE, budget=2 + 4)  # two decoding requests: V = 4
    w = BudgetWorker(64, 4, conf=lambda rid, pos: 0.9 if rid == "r0" else 0.2)
    prompts = add(s, n=2, max_tokens=30)
    res, _ = drive(s, w, False)
    for rid, p in prompts.items():
        assert res[rid] == reference(p, sampling(max_tokens=30, seed=int(rid[1:])))[0]
    both = [lens for lens in w.lens if len(lens) == 2]
    # a(r0) = .9, .81, .73, .66 all beat a(r1) = .2: r0 takes the whole budget
    assert both and all(lens == [4, 0] for lens in both)


def test_fixed_policy_and_no_profile_keep_todays_behaviour():
    for s in (conf_scheduler(FREE, policy="fixed"), conf_scheduler(None)):
        assert s.verify_policy == "fixed"
        s.add_request("a", create_prompt(5), sampling(max_tokens=20))
        w = BudgetWorker(64, 4)
        drive(s, w, False)
        assert s.spec_totals.num_draft_tokens == K * s.spec_totals.verify_steps > 0


# --- hand-built results ------------------------------------------------------

def _prefill(s, n):
    """Admit n requests and commit their first token (from the prefill)."""
    budget = s.config.max_num_batched_tokens
    s.config.max_num_batched_tokens = 64
    for i in range(n):
        s.add_request(f"r{i}", create_prompt(6, salt=i), sampling(max_tokens=50, seed=i))
    plan = s.schedule()
    s.update_from_output(plan, StepOutput(plan.step_id, [
        SeqOutput(q.request_id, token_id=10 + i) for i, q in enumerate(plan.seqs)]))
    s.config.max_num_batched_tokens = budget


def _verify_out(rid, drafts, target, k):
    n = len(drafts)
    return SeqOutput(rid, draft_tokens=drafts, target_tokens=target,
                     q_draft=[1.0 if d == t else 0.0 for d, t in zip(drafts, target)],
                     p_draft=[1.0] * n, residual_tokens=[-1] * n, confidences=[0.5] * k)


def test_hand_built_results_of_varying_length():
    s = conf_scheduler(FREE, num_blocks=40, budget=64)
    _prefill(s, 3)
    plan = s.schedule()
    assert plan.verify_budget == 3 * K  # free rows: every draft of every request
    assert [q.num_speculative_tokens for q in plan.seqs] == [K] * 3
    for q in plan.seqs:  # KV for the anchor (position 6) and 7 drafts: 14 positions
        assert len(q.block_ids) == 4 and q.start_position == 6
    free_before = s.allocator.num_free
    out = StepOutput(plan.step_id, [
        _verify_out("r0", [], [20], K),                           # l = 0: one token
        _verify_out("r1", [21, 22], [21, 22, 23], K),             # both accepted + bonus
        _verify_out("r2", [31, 32, 33], [31, 40, 41, 42], K),     # one accepted
    ])
    outs = s.update_from_output(plan, out)
    assert [o.new_token_ids for o in outs] == [[20], [21, 22, 23], [31, 40]]
    r0, r1, r2 = (s.get_request(f"r{i}") for i in range(3))
    assert [r.num_computed_tokens for r in (r0, r1, r2)] == [7, 9, 8]
    # KV past the next anchor is given back: 8, 10, 9 tokens -> 2, 3, 3 blocks
    assert [len(r.block_ids) for r in (r0, r1, r2)] == [2, 3, 3]
    assert s.allocator.num_free == free_before + 4
    assert r0.spec.unverified_steps == 1 and r0.spec.verify_steps == 0
    assert (r1.spec.verify_steps, r1.spec.num_draft_tokens, r1.spec.num_accepted_tokens) == (1, 2, 2)
    assert r1.spec.verified_per_pos[:3] == [1, 1, 0] and r1.spec.accepted_per_pos[:2] == [1, 1]
    assert r2.spec.verified_per_pos[:3] == [1, 1, 0] and r2.spec.accepted_per_pos[:2] == [1, 0]
    assert r2.spec.per_position_acceptance[:2] == [1.0, 0.0]
    assert s.last_spec_events == [(0, 0, False, True), (2, 2, False, False),
                                  (3, 1, False, False)]
    assert r1.spec_confidences == [0.5] * K
    tot = s.spec_totals
    assert (tot.verify_steps, tot.unverified_steps, tot.num_draft_tokens) == (2, 1, 5)


def test_invalid_budgeted_results_are_refused_before_any_change():
    s = conf_scheduler(FREE, budget=3 + 4)  # three requests, V = 4
    _prefill(s, 3)
    plan = s.schedule()
    assert plan.verify_budget == 4
    assert [q.num_speculative_tokens for q in plan.seqs] == [4] * 3  # min(K, V) each
    before = [list(s.get_request(f"r{i}").output_token_ids) for i in range(3)]
    too_many = StepOutput(plan.step_id, [_verify_out("r0", [1, 2, 3], [1, 2, 3, 4], 4),
                                         _verify_out("r1", [5, 6], [5, 6, 7], 4),
                                         _verify_out("r2", [], [9], 4)])
    with pytest.raises(ValueError, match="more than its verify_budget=4"):
        s.update_from_output(plan, too_many)
    past_k = StepOutput(plan.step_id, [_verify_out("r0", [1] * 5, [1] * 6, 4),
                                       _verify_out("r1", [], [5], 4),
                                       _verify_out("r2", [], [9], 4)])
    with pytest.raises(ValueError, match="invalid verify output"):
        s.update_from_output(plan, past_k)
    assert [s.get_request(f"r{i}").output_token_ids for i in range(3)] == before


def test_without_budget_a_short_result_is_refused():
    s = conf_scheduler(FREE, policy="fixed")
    _prefill(s, 1)
    plan = s.schedule()
    assert plan.verify_budget is None and plan.seqs[0].num_speculative_tokens == K
    with pytest.raises(ValueError, match="invalid verify output"):
        s.update_from_output(plan, StepOutput(plan.step_id, [_verify_out("r0", [], [3], K)]))


def test_zero_budget_plans_plain_steps_counted_unverified():
    s = conf_scheduler(BOUND)
    _prefill(s, 2)
    plan = s.schedule()
    assert plan.verify_budget is None
    assert [(len(q.token_ids), q.num_speculative_tokens) for q in plan.seqs] == [(1, 0)] * 2
    assert all(q.lease_id >= 0 for q in plan.seqs)  # leases still get the rows written
    outs = s.update_from_output(plan, StepOutput(plan.step_id, [
        SeqOutput("r0", token_id=50), SeqOutput("r1", token_id=51)]))
    assert [o.new_token_ids for o in outs] == [[50], [51]]
    assert s.spec_totals.unverified_steps == 2 and s.spec_totals.fallback_steps == 0
    assert s.last_spec_events == [(0, 0, False, True)] * 2


def test_async_correction_after_a_zero_length_result():
    """Step A (drafts) is in flight when step B is planned: B defers r0's anchor and
    reserves KV for the optimistic window. A's result verifies nothing for r0 (l = 0):
    r0 advances one token, B's reservation is cut back to its real window."""
    s = conf_scheduler(FREE, num_blocks=40, budget=64, async_=True)
    _prefill(s, 1)
    a = s.schedule()
    assert a.seqs[0].num_speculative_tokens == K and a.seqs[0].start_position == 6
    b = s.schedule()
    (d,) = b.seqs
    assert d.deferred_anchor and d.num_speculative_tokens == K and b.verify_budget == K
    r0 = s.get_request("r0")
    # optimistic: A's anchor 6 + 7 drafts + bonus -> anchor up to 14, + 7 drafts = 22
    assert len(r0.block_ids) == 6
    s.update_from_output(a, StepOutput(a.step_id, [_verify_out("r0", [], [20], K)]))
    assert r0.output_token_ids[-1] == 20 and r0.num_tokens == 8
    assert r0.num_computed_tokens == 8  # B computes the anchor at position 7
    assert len(r0.block_ids) == 4  # positions 0..14: anchor 7 + 7 drafts
    out = _verify_out("r0", [21], [21, 22], K)
    out.anchor_token, out.anchor_position = 20, 7
    outs = s.update_from_output(b, StepOutput(b.step_id, [out]))
    assert outs[0].new_token_ids == [21, 22] and r0.num_computed_tokens == 9
    assert len(r0.block_ids) == 3  # given back past the next anchor (position 9)
    assert (r0.spec.verify_steps, r0.spec.unverified_steps) == (1, 1)


def test_only_the_requests_worth_their_drafting_cost_draft():
    # drafting costs 20 ms per request on a 30 ms step: only a confident request pays
    dear = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0), draft_per_request_ms=20.0)
    s = conf_scheduler(dear)
    _prefill(s, 3)
    s.get_request("r0").spec_confidences = [0.95] * K  # as from a last verify result
    for rid in ("r1", "r2"):
        s.get_request(rid).spec_confidences = [0.05] * K
    plan = s.schedule()
    ks = [q.num_speculative_tokens for q in plan.seqs]
    assert ks[0] > 0 and ks[1:] == [0, 0] and plan.verify_budget == ks[0]
    n = ks[0]
    outs = s.update_from_output(plan, StepOutput(plan.step_id, [
        _verify_out("r0", [21] * n, [21] * (n + 1), n),
        SeqOutput("r1", token_id=31), SeqOutput("r2", token_id=41)]))
    assert [len(o.new_token_ids) for o in outs] == [n + 1, 1, 1]
    assert [s.get_request(f"r{i}").spec.unverified_steps for i in range(3)] == [0, 1, 1]
    assert s.last_spec_events[1:] == [(0, 0, False, True)] * 2


def _steps_until_r0_drafts(decay: float, limit: int = 12) -> int | None:
    """r0's last draft was poor (confidences 0.05); the replica's drafts have been
    accepted 90% of the time. Plain steps until r0 drafts again (None: not within
    ``limit``); drafting costs 10 ms on a 30 ms step, so 0.05 never pays and the
    running rates do."""
    dear = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0), draft_per_request_ms=10.0)
    s = conf_scheduler(dear)
    s.config.verify_confidence_decay = decay
    _prefill(s, 1)
    s.spec_totals.accepted_per_pos[:K] = [900] * K
    s.spec_totals.verified_per_pos[:K] = [1000] * K
    r0 = s.get_request("r0")
    r0.spec_confidences = [0.05] * K
    for n in range(limit):
        plan = s.schedule()
        (q,) = plan.seqs
        if q.num_speculative_tokens:
            return n
        assert r0.spec_conf_age == n + 1
        s.update_from_output(plan, StepOutput(plan.step_id, [SeqOutput("r0", token_id=20 + n)]))
    return None


def test_a_poor_draft_does_not_stop_a_request_drafting_for_good():
    assert _steps_until_r0_drafts(decay=1.0) is None  # the old confidences never age
    n = _steps_until_r0_drafts(decay=0.5)
    assert n is not None and 1 <= n <= 3
    # a fresh verify result's confidences count in full again
    s = conf_scheduler(FREE)
    _prefill(s, 1)
    r0 = s.get_request("r0")
    r0.spec_conf_age = 5
    plan = s.schedule()
    (q,) = plan.seqs
    k = q.num_speculative_tokens
    s.update_from_output(plan, StepOutput(plan.step_id, [_verify_out("r0", [21] * k, [21] * (k + 1), k)]))
    assert r0.spec_conf_age == 0 and r0.spec_confidences == [0.5] * k


def test_confidence_decay_is_checked():
    with pytest.raises(ValueError, match="verify_confidence_decay"):
        SchedulerConfig(verify_confidence_decay=0.0)
    with pytest.raises(ValueError, match="verify_confidence_decay"):
        SchedulerConfig(verify_confidence_decay=1.5)


class RecordingWorker(BudgetWorker):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.plans: list[StepPlan] = []

    def step(self, plan: StepPlan) -> StepOutput:
        self.plans.append(plan)
        return super().step(plan)


@pytest.mark.parametrize("trim", [True, False])
def test_the_plan_carries_its_step_times_and_the_worker_trims_by_them(trim):
    """Each budgeted plan carries the profile's time of the step with 0..V verified
    rows (drafting at the plan's depth included), unless verify_trim is off. The
    drafts' confidences swing every 4 positions (.95, then .02), so the budget,
    sized from the last ones, is often wrong about the current draft: the
    trimming worker then verifies none of it. The output is the same either way."""
    prof = SpsProfile(rows=(1, 4, 256), forward_ms=(10.0, 11.0, 600.0), draft_fixed_ms=1.0)
    s = conf_scheduler(prof, budget=2 + 8)
    s.config.verify_trim = trim
    w = RecordingWorker(64, 4, conf=lambda rid, pos: 0.95 if (pos // 4) % 2 == 0 else 0.02)
    prompts = add(s, n=2, max_tokens=40)
    res, _ = drive(s, w, False)
    for rid, p in prompts.items():
        assert res[rid] == reference(p, sampling(max_tokens=40, seed=int(rid[1:])))[0]
    budgeted = [(plan, lens) for plan, lens in zip(w.plans, w.lens)
                if plan.verify_budget]
    assert len(budgeted) > 10
    for plan, lens in budgeted:
        drafting = sum(1 for q in plan.seqs if q.num_speculative_tokens)
        if not trim:
            assert plan.verify_step_ms is None
            assert sum(lens) == min(plan.verify_budget, K * drafting)
            continue
        rows = sum(len(q.token_ids) or 1 for q in plan.seqs)
        depth = min(K, plan.verify_budget)
        assert plan.verify_step_ms == [prof.step(rows + u, drafting, depth)
                                       for u in range(plan.verify_budget + 1)]
    if trim:
        assert sum(1 for plan, lens in budgeted if sum(lens) == 0) > 5
        assert any(sum(lens) == plan.verify_budget for plan, lens in budgeted)
