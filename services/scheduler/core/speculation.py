"""The scheduler's speculation (DSPARK.md 3 and 4): how many drafts each decode
step carries, the async deferred steps, checking and committing verify results,
and the speculation counters. A mixin of ``Scheduler`` (same lock, same state).

Verify policies (``WorkerInfo.verify_policy``):

- "fixed": every speculating request drafts and verifies K tokens (fewer when
  the step's token budget or free KV blocks are short).
- "confidence": the step is first planned without drafts (prefill chunks and
  anchors take the token budget first); then ``_size_verification`` sizes the
  step's verify budget V from earlier confidences and the worker's measured
  costs (``verify_budget.size_verify_budget``). V = 0: no request drafts; the
  speculating requests' steps are plain one-row steps (counted as unverified
  steps). V > 0: the requests with an estimated candidate among the top V draft
  min(K, V) tokens each, KV is reserved for them, and the worker verifies the
  top V by current cumulative confidence (``StepPlan.verify_budget``), l_r in
  0..k per request; the other speculating requests run plain (unverified) steps. A result
  with l_r = 0 commits the target's one token (an unverified step); KV reserved
  past what was used is given back when the result is committed.
"""
from __future__ import annotations

from dspark.shared import rng
from dspark.shared.acceptance import Acceptance, VerifyResult, truncate
from dspark.shared.types import (FinishReason, RequestOutput, SeqOutput, SeqStep, SpecSummary,
                                 WorkerInfo)
from dspark.shared.verify_fill import cumulative

from .profile_fit import OnlineProfile
from .request import Request
from .verify_budget import choose_drafters, estimate, running_cumulative, size_verify_budget


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def explore_windows(k: int) -> tuple[int, ...]:
    """The verify windows of exploration steps that draft, in turn: 1, 2, 4, ...
    below K, then K. Every grid point of the profile between one row and a full
    window is observed once a cycle, at a fraction of the cost of K every time:
    at batch 1 on the project's 2-core CPU an 8-row verify costs ~3 plain steps,
    and K every 32nd step cost ~6% of K = 0's rate where drafting did not pay
    (scripts/perf/verify_policy.py: 0.936x -> 0.974x of K = 0 offline)."""
    out, w = [], 1
    while w < k:
        out.append(w)
        w *= 2
    return tuple(out) + (k,)


class SpeculationMixin:
    """Needs from the scheduler: allocator, block_size, max_model_len, _max_len,
    _eos, _running, _finish, _summary, info."""

    def _init_speculation(self, info: WorkerInfo) -> None:
        self.num_spec = info.num_speculative_tokens if info.num_leases else 0
        self._free_leases: list[int] = list(range(info.num_leases)) if self.num_spec else []
        self.num_leases = len(self._free_leases)
        # "confidence" needs the worker's cost profile; without one: "fixed". A
        # measured profile is refitted from the step times seen (profile_fit.py)
        self.sps_profile = (OnlineProfile(info.sps_profile) if info.sps_profile is not None
                            and not info.sps_profile.pinned else info.sps_profile)
        self.verify_policy = ("confidence" if self.num_spec and info.verify_policy == "confidence"
                              and info.sps_profile is not None else "fixed")
        # Totals since start (metrics): drafts = verify steps with drafts.
        self.spec_totals = self._new_summary()
        # (drafts verified, drafts accepted, fallback, unverified) per request of the
        # last update
        self.last_spec_events: list[tuple[int, int, bool, bool]] = []
        # confidence mode: this plan's speculating seqs (seq, request, anchor position)
        self._cands: list[tuple[SeqStep, Request, int]] = []
        self._sized_steps = 0  # steps whose verify budget was sized
        self.num_explore_steps = 0  # of them, sized the other way (verify_explore_every)
        self._explore_drafts = 0  # of those, the ones that drafted (explore_windows in turn)

    @property
    def confidence_scheduled(self) -> bool:
        return self.verify_policy == "confidence"

    def _new_summary(self) -> SpecSummary:
        k = self.num_spec
        return SpecSummary(num_speculative_tokens=k, accepted_per_pos=[0] * k,
                           verified_per_pos=[0] * k)

    # ------------------------------------------------------------------ planning

    def _spec_eligible(self, req: Request, n: int) -> bool:
        """A decode step (the anchor is the one token to compute) of a request with a
        lease whose window stays below max_model_len; past that it decodes one token
        per step for good (fallback)."""
        if n != 1 or req.num_uncomputed_tokens != 1 or req.lease_id < 0:
            return False  # a prefill chunk
        if req.spec_fallback or req.num_tokens - 1 + self.num_spec >= self.max_model_len:
            req.spec_fallback = True
            return False
        return True

    def _reserve_drafts(self, req: Request, anchor_pos: int, k: int) -> int:
        """KV for verify rows up to anchor_pos + k, fewer while blocks are short (drafts
        never preempt anyone). Returns the k that fits."""
        while k > 0:
            need = _cdiv(anchor_pos + 1 + k, self.block_size) - len(req.block_ids)
            if need <= self.allocator.num_free:
                req.block_ids += self.allocator.allocate(max(need, 0))
                break
            k -= 1
        return k

    def _spec_tokens(self, req: Request, n: int, budget: int) -> int:
        """Fixed policy: K for a decode step of ``req``, fewer when the step budget or
        free KV blocks are short; 0 for a prefill chunk or past the ceiling."""
        if not self._spec_eligible(req, n):
            return 0
        return self._reserve_drafts(req, req.num_tokens - 1, min(self.num_spec, budget - 1))

    def _defer(self, step_id: int, req: Request, budget: int) -> SeqStep | None:
        """Async: plan the next step of a decoding request whose step is still in
        flight. Its anchor lands somewhere in [P+1, P+k+1] (P, k: the in-flight
        step's last row position and its drafts; k = 0 for a plain step, whose
        anchor is exactly P+1), so KV is reserved for the optimistic worst case
        P + k + 1 + K (confidence mode: the anchor now, drafts when the step's
        budget is sized); the commit gives back what acceptance did not use. A
        plain in-flight step is deferred too: under confidence-scheduled
        verification most steps are plain, and leaving them out would split the
        batch into two halves taking turns. A request without a lease (every
        request of a K = 0 deployment) is deferred as a plain step: the worker
        resolves its anchor from the token it sampled, so its steps run back to
        back instead of waiting a round trip each. Returns None (no deferral)
        when it could finish in flight, could pass the position ceiling, or
        blocks are short: it then waits, as in sync mode."""
        if req.deferred_step is not None:
            return None
        plain = req.lease_id < 0  # no drafter: one token a step
        k_prev = req.pending_spec_k
        p_prev = req.num_tokens - 1  # the in-flight step's anchor position
        sp = req.sampling
        if sp.max_tokens - req.num_output_tokens <= k_prev + 1:
            return None  # may finish in flight: nothing to gain
        k = 0 if plain else min(self.num_spec, budget - 1)
        last = p_prev + k_prev + 1 + k  # the furthest verify row the step may write
        if last >= min(self.max_model_len, self._max_len) or (k <= 0 and not plain):
            return None
        if self.confidence_scheduled:
            k = 0  # drafts: _size_verification
        need = _cdiv(p_prev + k_prev + 2 + k, self.block_size) - len(req.block_ids)
        if need > self.allocator.num_free:
            return None
        req.block_ids += self.allocator.allocate(max(need, 0))
        req.deferred_step, req.deferred_k, req.deferred_note = step_id, k, ""
        seq = SeqStep(request_id=req.request_id, token_ids=[], start_position=p_prev,
                      block_ids=list(req.block_ids), sample=True,
                      temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                      seed=sp.seed, lease_id=req.lease_id, num_speculative_tokens=k,
                      deferred_anchor=True)
        if self.confidence_scheduled and not plain:
            self._cands.append((seq, req, p_prev + k_prev + 1))
        return seq

    def _size_verification(self, seqs: list[SeqStep], budget: int
                           ) -> tuple[int | None, list[float] | None]:
        """Confidence mode, after the step is planned without drafts: size the verify
        budget V, then give each speculating seq min(K, V) drafts (KV permitting).
        Returns the plan's verify_budget (None: nothing speculates) and, where the
        worker may trim the fill by the drafts' current confidences
        (``verify_trim``), the step's expected time with 0..V rows verified."""
        cands, self._cands = self._cands, []
        if not cands:
            return None, None
        k_max = self.num_spec
        st = self.spec_totals
        running = running_cumulative(st.accepted_per_pos, st.verified_per_pos, k_max)
        decay = self.config.verify_confidence_decay
        est = [estimate(req.spec_confidences, running, k_max, decay ** req.spec_conf_age)
               for _, req, _ in cands]
        rows = sum(len(s.token_ids) or 1 for s in seqs)  # a deferred anchor is one row
        tokens = sum(1 for s in seqs if s.sample)
        max_v = min(budget, k_max * len(cands))
        v = size_verify_budget(self.sps_profile, rows, tokens, est, max_v)
        drafters = choose_drafters(est, v)
        explore = self._explore_due() and max_v > 0
        if explore:
            # the other way: the refit sees the rows it would not, confidences renew
            if v:
                v, drafters = 0, set()
            else:
                windows = explore_windows(k_max)
                v = min(windows[self._explore_drafts % len(windows)], max_v)
                drafters = {self.num_explore_steps % len(cands)}
                self._explore_drafts += 1
            self.num_explore_steps += 1
        total = 0
        for i, (seq, req, anchor_pos) in enumerate(cands):
            cap = min(k_max, v, min(self.max_model_len, self._max_len) - 1 - anchor_pos)
            k = self._reserve_drafts(req, anchor_pos, cap) if i in drafters else 0
            total += k
            if not k:  # its last confidences age (fresh ones come with a draft)
                req.spec_conf_age += 1
            seq.num_speculative_tokens = k
            seq.block_ids = list(req.block_ids)
            note = "" if k else ("unverified" if i not in drafters else "fallback")
            if anchor_pos < req.num_prompt_tokens:
                note = ""  # the prompt's last token: this step samples the first token
            if seq.deferred_anchor:
                req.deferred_k, req.deferred_note = k, note
            else:
                req.pending_spec_k = k
                req.pending_fallback = note == "fallback"
                req.pending_unverified = note == "unverified"
        if not total:
            return None, None
        v = min(v, total)
        step_ms = None
        if self.config.verify_trim and not explore:  # an exploration step verifies all
            prof, n_drafting = self.sps_profile, sum(
                1 for seq, _, _ in cands if seq.num_speculative_tokens)
            step_ms = [prof.step(rows + u, n_drafting, min(k_max, v)) for u in range(v + 1)]
        return v, step_ms

    def _explore_due(self) -> bool:
        """Every verify_explore_every-th sized step, once the measured profile is
        being refitted (the worker reports step times; a pinned profile never)."""
        self._sized_steps += 1
        every = self.config.verify_explore_every
        prof = self.sps_profile
        return bool(every) and isinstance(prof, OnlineProfile) and prof.num_observed > 0 \
            and self._sized_steps % every == 0

    def _observe_step(self, plan, output, by_id) -> None:
        """Confidence mode with a measured profile: the step's wall time refits it."""
        prof = self.sps_profile
        if not isinstance(prof, OnlineProfile) or not output.forward_ms > 0.0:
            return
        rows = drafting = depth = 0
        for seq in plan.seqs:
            rows += len(seq.token_ids) or 1  # a deferred anchor is one row
            if seq.num_speculative_tokens:
                drafting += 1
                depth = max(depth, seq.num_speculative_tokens)
                out = by_id.get(seq.request_id)
                rows += len(out.draft_tokens) if out is not None else 0
        if plan.verify_budget is not None:  # the worker drafts min(k, budget) positions
            depth = max(1, min(depth, plan.verify_budget))
        prof.observe(rows, drafting, output.forward_ms, depth)

    # ------------------------------------------------------------------ results

    def _verify_result(self, step_id: int, seq: SeqStep, out: SeqOutput | None,
                       budgeted: bool) -> VerifyResult:
        """The worker's verify output as a checked VerifyResult (uniforms made here).
        Under a verify budget it carries l in 0..k drafts, else exactly k."""
        k, v = seq.num_speculative_tokens, self.info.vocab_size
        n = len(out.draft_tokens) if out is not None else -1
        ok = out is not None and (0 <= n <= k if budgeted else n == k) \
            and len(out.target_tokens) == n + 1 and len(out.q_draft) == n \
            and len(out.p_draft) == n and len(out.residual_tokens) == n \
            and len(out.confidences) <= k \
            and all(0 <= t < v for t in out.draft_tokens + out.target_tokens)
        if not ok:
            raise ValueError(f"step {step_id}: invalid verify output for {seq.request_id!r} "
                             f"with K={k}{' under a verify budget' if budgeted else ''} "
                             f"(got {out})")
        # a deferred step's anchor position is the one the worker resolved (checked
        # against the committed sequence by the caller)
        a = out.anchor_position if seq.deferred_anchor else seq.start_position
        return VerifyResult(draft_tokens=list(out.draft_tokens),
                            target_tokens=list(out.target_tokens), q_draft=list(out.q_draft),
                            p_draft=list(out.p_draft),
                            uniforms=[rng.uniform(seq.seed, a + i + 1, rng.STREAM_ACCEPT)
                                      for i in range(n)],
                            residual_tokens=list(out.residual_tokens))

    def _count_plain_step(self, req: Request) -> None:
        """A one-token step of a request that could speculate: fallback or unverified."""
        if req.pending_fallback:
            req.spec.fallback_steps += 1
            self.spec_totals.fallback_steps += 1
            self.last_spec_events.append((0, 0, True, False))
        elif req.pending_unverified:
            req.spec.unverified_steps += 1
            self.spec_totals.unverified_steps += 1
            self.last_spec_events.append((0, 0, False, True))

    def _commit_spec(self, req: Request, result: VerifyResult, acc: Acceptance,
                     confidences: list[float]) -> RequestOutput:
        """Commit an accepted step (``accept(result)``), truncated at stop conditions."""
        sp = req.sampling
        kept, reason = truncate(acc.tokens, remaining_tokens=sp.max_tokens - req.num_output_tokens,
                                remaining_len=self._max_len - req.num_tokens,
                                stop_token_ids=sp.stop_token_ids, eos_token_ids=self._eos,
                                ignore_eos=sp.ignore_eos)
        k = len(result.draft_tokens)
        if confidences:
            req.spec_confidences = list(confidences)
            req.spec_conf_age = 0
        for st in (req.spec, self.spec_totals):
            if k == 0:  # the verify budget left it no draft: the target's one token
                st.unverified_steps += 1
                continue
            st.verify_steps += 1
            st.num_draft_tokens += k
            st.num_accepted_tokens += acc.num_accepted
            st.committed_in_verify += len(acc.tokens)
            for pos in range(acc.num_accepted):
                st.accepted_per_pos[pos] += 1
            for pos in range(min(acc.num_accepted + 1, k)):
                st.verified_per_pos[pos] += 1
        self.last_spec_events.append((k, acc.num_accepted, False, k == 0))
        req.pending_sample_step = None
        req.output_token_ids += kept
        # the anchor and the kept drafts have valid KV; the last kept token is the next anchor
        req.num_computed_tokens += len(kept) - 1
        if reason != FinishReason.NONE:
            self._running.remove(req)
            self._finish(req, reason)
        elif req.deferred_step is not None:
            self._promote_deferred(req)
        elif self.confidence_scheduled:  # give back the rows the budget did not verify
            self._trim_blocks(req, req.num_tokens)
        return RequestOutput(req.request_id, list(kept), reason, self._summary(req, reason))

    def _promote_deferred(self, req: Request) -> None:
        """Async, after committing the step before it: the deferred step in flight
        runs from the anchor just committed; correct positions and free the blocks
        reserved past its real window."""
        req.pending_sample_step, req.pending_spec_k = req.deferred_step, req.deferred_k
        req.pending_fallback = req.deferred_note == "fallback"
        req.pending_unverified = req.deferred_note == "unverified"
        req.deferred_step = None
        req.num_computed_tokens = req.num_tokens  # the anchor is computed in flight
        self._trim_blocks(req, req.num_tokens + req.pending_spec_k)

    def _trim_blocks(self, req: Request, positions: int) -> None:
        keep = _cdiv(positions, self.block_size)
        if len(req.block_ids) > keep:
            self.allocator.free(req.block_ids[keep:])
            req.block_ids = req.block_ids[:keep]
