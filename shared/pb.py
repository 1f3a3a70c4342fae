"""Conversions between protobuf messages and domain types (from_pb / to_pb).

Servicers call these at the boundary; domain code never sees protobuf.
"""
from __future__ import annotations

import numpy as np

from dspark.shared.types import (
    FinishReason,
    SamplingParams,
    SeqOutput,
    SeqStep,
    SpsProfile,
    StepOutput,
    StepPlan,
    WorkerInfo,
)
from dspark.v1 import common_pb2, worker_pb2


# --- sampling ---------------------------------------------------------------

def sampling_to_pb(p: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed,
        max_tokens=p.max_tokens, stop_token_ids=list(p.stop_token_ids),
        stop=list(p.stop), ignore_eos=p.ignore_eos,
    )


def sampling_from_pb(m: common_pb2.SamplingParams) -> SamplingParams:
    """Resolved params (as the router sends them); unset fields take defaults."""
    d = SamplingParams()
    return SamplingParams(
        temperature=m.temperature if m.HasField("temperature") else d.temperature,
        top_p=m.top_p if m.HasField("top_p") else d.top_p,
        top_k=m.top_k if m.HasField("top_k") else d.top_k,
        seed=m.seed if m.HasField("seed") else d.seed,
        max_tokens=m.max_tokens if m.HasField("max_tokens") else d.max_tokens,
        stop_token_ids=tuple(m.stop_token_ids),
        stop=tuple(m.stop),
        ignore_eos=m.ignore_eos if m.HasField("ignore_eos") else d.ignore_eos,
    )


def finish_to_pb(r: FinishReason) -> int:
    return int(r)


# --- worker step ------------------------------------------------------------

def step_to_pb(plan: StepPlan) -> worker_pb2.StepRequest:
    return worker_pb2.StepRequest(
        step_id=plan.step_id, verify_budget=plan.verify_budget,
        verify_step_ms=plan.verify_step_ms or [],
        seqs=[
            worker_pb2.SeqStep(
                request_id=s.request_id, token_ids=s.token_ids,
                start_position=s.start_position, block_ids=s.block_ids,
                sample=s.sample, temperature=s.temperature, top_p=s.top_p,
                top_k=s.top_k, seed=s.seed, return_tap_rows=s.return_tap_rows,
                lease_slot=s.lease_id + 1, num_speculative_tokens=s.num_speculative_tokens,
                deferred_anchor=s.deferred_anchor,
            )
            for s in plan.seqs
        ],
    )


def step_from_pb(m: worker_pb2.StepRequest) -> StepPlan:
    return StepPlan(
        step_id=m.step_id,
        verify_budget=m.verify_budget if m.HasField("verify_budget") else None,
        verify_step_ms=list(m.verify_step_ms) or None,
        seqs=[
            SeqStep(
                request_id=s.request_id, token_ids=list(s.token_ids),
                start_position=s.start_position, block_ids=list(s.block_ids),
                sample=s.sample, temperature=s.temperature, top_p=s.top_p,
                top_k=s.top_k, seed=s.seed, return_tap_rows=s.return_tap_rows,
                lease_id=s.lease_slot - 1, num_speculative_tokens=s.num_speculative_tokens,
                deferred_anchor=s.deferred_anchor,
            )
            for s in m.seqs
        ],
    )


def tensor_to_pb(a: np.ndarray) -> worker_pb2.Tensor:
    a = np.ascontiguousarray(a, dtype=np.float32)
    return worker_pb2.Tensor(shape=list(a.shape), dtype="float32", data=a.tobytes())


def tensor_from_pb(t: worker_pb2.Tensor) -> np.ndarray:
    if t.dtype != "float32":
        raise ValueError(f"tensor dtype {t.dtype!r} is not supported (float32 only)")
    return np.frombuffer(t.data, dtype=np.float32).reshape(tuple(t.shape))


def step_output_to_pb(out: StepOutput) -> worker_pb2.StepResponse:
    msgs = []
    for o in out.outputs:
        m = worker_pb2.SeqOutput(
            request_id=o.request_id, token_id=o.token_id, logprob=o.logprob,
            num_tap_rows=o.num_tap_rows, draft_tokens=o.draft_tokens,
            target_tokens=o.target_tokens, q_draft=o.q_draft, p_draft=o.p_draft,
            residual_tokens=o.residual_tokens, confidences=o.confidences,
            anchor_token=o.anchor_token, anchor_position=o.anchor_position,
        )
        if o.tap_rows is not None:
            m.tap_rows.CopyFrom(tensor_to_pb(np.asarray(o.tap_rows)))
        msgs.append(m)
    return worker_pb2.StepResponse(step_id=out.step_id, outputs=msgs, forward_ms=out.forward_ms)


def step_output_from_pb(m: worker_pb2.StepResponse) -> StepOutput:
    return StepOutput(
        step_id=m.step_id,
        forward_ms=m.forward_ms,
        outputs=[
            SeqOutput(
                request_id=o.request_id, token_id=o.token_id, logprob=o.logprob,
                num_tap_rows=o.num_tap_rows,
                tap_rows=tensor_from_pb(o.tap_rows) if o.HasField("tap_rows") else None,
                draft_tokens=list(o.draft_tokens), target_tokens=list(o.target_tokens),
                q_draft=list(o.q_draft), p_draft=list(o.p_draft),
                residual_tokens=list(o.residual_tokens), confidences=list(o.confidences),
                anchor_token=o.anchor_token, anchor_position=o.anchor_position,
            )
            for o in m.outputs
        ],
    )


def sps_profile_to_pb(p: SpsProfile) -> worker_pb2.SpsProfile:
    return worker_pb2.SpsProfile(rows=list(p.rows), forward_ms=list(p.forward_ms),
                                 draft_fixed_ms=p.draft_fixed_ms,
                                 draft_per_request_ms=p.draft_per_request_ms,
                                 draft_per_position_ms=p.draft_per_position_ms,
                                 pinned=p.pinned)


def sps_profile_from_pb(m: worker_pb2.SpsProfile) -> SpsProfile | None:
    if not m.rows:
        return None
    return SpsProfile(rows=tuple(m.rows), forward_ms=tuple(m.forward_ms),
                      draft_fixed_ms=m.draft_fixed_ms,
                      draft_per_request_ms=m.draft_per_request_ms,
                      draft_per_position_ms=m.draft_per_position_ms, pinned=m.pinned)


def info_to_pb(i: WorkerInfo) -> worker_pb2.InfoResponse:
    m = worker_pb2.InfoResponse(
        model_name=i.model_name, model_id=i.model_id, vocab_size=i.vocab_size,
        hidden_size=i.hidden_size, num_layers=i.num_layers, num_kv_blocks=i.num_kv_blocks,
        block_size=i.block_size, max_model_len=i.max_model_len,
        eos_token_ids=list(i.eos_token_ids), dtype=i.dtype, device=i.device,
        tap_layer_ids=list(i.tap_layer_ids),
        num_speculative_tokens=i.num_speculative_tokens, num_leases=i.num_leases,
        drafter_id=i.drafter_id, verify_policy=i.verify_policy if i.num_speculative_tokens else "",
    )
    if i.sps_profile is not None:
        m.sps_profile.CopyFrom(sps_profile_to_pb(i.sps_profile))
    return m


def info_from_pb(m: worker_pb2.InfoResponse) -> WorkerInfo:
    return WorkerInfo(
        model_name=m.model_name, model_id=m.model_id, vocab_size=m.vocab_size,
        hidden_size=m.hidden_size, num_layers=m.num_layers, num_kv_blocks=m.num_kv_blocks,
        block_size=m.block_size, max_model_len=m.max_model_len,
        eos_token_ids=tuple(m.eos_token_ids), dtype=m.dtype, device=m.device,
        tap_layer_ids=tuple(m.tap_layer_ids),
        num_speculative_tokens=m.num_speculative_tokens, num_leases=m.num_leases,
        drafter_id=m.drafter_id, verify_policy=m.verify_policy or "fixed",
        sps_profile=sps_profile_from_pb(m.sps_profile),
    )


def spec_summary_to_pb(s) -> common_pb2.SpecSummary:
    return common_pb2.SpecSummary(
        verify_steps=s.verify_steps, num_draft_tokens=s.num_draft_tokens,
        num_accepted_tokens=s.num_accepted_tokens,
        mean_accepted_length=s.mean_accepted_length,
        per_position_acceptance=s.per_position_acceptance,
        fallback_steps=s.fallback_steps, num_speculative_tokens=s.num_speculative_tokens,
        unverified_steps=s.unverified_steps,
        verified_per_position=_verified_per_pos(s),
        accepted_per_position=list(s.accepted_per_pos))


def _verified_per_pos(s) -> list[int]:
    if s.verified_per_pos:
        return list(s.verified_per_pos)
    return [s.verify_steps, *s.accepted_per_pos[:-1]][:len(s.accepted_per_pos)]
