"""Config validation names the field; protobuf conversions round-trip."""
from __future__ import annotations

import numpy as np
import pytest

from dspark.shared import pb
from dspark.shared.cli import build_parser, config_from_args
from dspark.shared.config import RouterConfig, SchedulerConfig, WorkerConfig
from dspark.shared.types import SamplingParams, SeqOutput, SeqStep, StepOutput, StepPlan, WorkerInfo


@pytest.mark.parametrize("cls,kw,field", [
    (WorkerConfig, dict(dtype="fp8"), "dtype"),
    (WorkerConfig, dict(device="tpu"), "device"),
    (WorkerConfig, dict(block_size=7), "block_size"),
    (WorkerConfig, dict(kv_cache_gib=0), "kv_cache_gib"),
    (WorkerConfig, dict(port=70000), "port"),
    (SchedulerConfig, dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (SchedulerConfig, dict(max_num_seqs=0), "max_num_seqs"),
    (SchedulerConfig, dict(max_waiting=0), "max_waiting"),
    (RouterConfig, dict(schedulers=()), "schedulers"),
    (RouterConfig, dict(default_max_tokens=0), "default_max_tokens"),
    (RouterConfig, dict(max_tokens_limit=10, default_max_tokens=20), "max_tokens_limit"),
])
def test_bad_config_names_the_field(cls, kw, field):
    with pytest.raises(ValueError, match=field):
        cls(**kw)


def test_cli_flags_build_configs():
    args = build_parser().parse_args(
        ["worker", "--dtype", "float32", "--tap-layer-ids", "3", "5", "--num-kv-blocks", "64"])
    cfg = config_from_args(WorkerConfig, args)
    assert (cfg.dtype, cfg.tap_layer_ids, cfg.num_kv_blocks) == ("float32", (3, 5), 64)
    args = build_parser().parse_args(["router", "--schedulers", "a:1", "b:2"])
    assert config_from_args(RouterConfig, args).schedulers == ("a:1", "b:2")


def test_cli_rejects_bad_config_with_exit_code_2(capsys):
    from dspark.shared.cli import main

    assert main(["scheduler", "--max-num-seqs", "0"]) == 2
    assert "max_num_seqs" in capsys.readouterr().err


def test_sampling_round_trip():
    p = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=2**62 + 3, max_tokens=17,
                       stop_token_ids=(5, 6), stop=("\n\n",), ignore_eos=True)
    q = pb.sampling_from_pb(pb.sampling_to_pb(p))
    assert q.top_k == 40 and q.seed == 2**62 + 3 and q.max_tokens == 17
    assert q.stop_token_ids == (5, 6) and q.stop == ("\n\n",) and q.ignore_eos
    assert q.temperature == pytest.approx(0.7) and q.top_p == pytest.approx(0.9)


def test_unset_sampling_fields_take_defaults():
    from dspark.v1 import common_pb2

    q = pb.sampling_from_pb(common_pb2.SamplingParams())
    assert q == SamplingParams()


def test_step_round_trip_with_tap_rows():
    plan = StepPlan(step_id=9, seqs=[
        SeqStep("a", [1, 2, 3], 0, [4, 7], True, 0.5, 0.75, 3, 11, True),
        SeqStep("b", [8], 40, [1, 2, 3], False)])
    assert pb.step_from_pb(pb.step_to_pb(plan)) == plan
    taps = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = StepOutput(step_id=9, outputs=[SeqOutput("a", 5, -0.25, 3, taps), SeqOutput("b")],
                     forward_ms=1.5)
    back = pb.step_output_from_pb(pb.step_output_to_pb(out))
    assert back.outputs[0].token_id == 5 and back.outputs[0].num_tap_rows == 3
    np.testing.assert_array_equal(back.outputs[0].tap_rows, taps)
    assert back.outputs[1].tap_rows is None and back.outputs[1].token_id == -1


def test_worker_info_round_trip():
    info = WorkerInfo("m", "id", 100, 8, 2, 64, 16, 512, (2, 3), "float32", "cpu", (0, 1))
    assert pb.info_from_pb(pb.info_to_pb(info)) == info


def test_serve_passes_worker_options_through():
    from dspark.shared.launcher import worker_flags

    args = build_parser().parse_args(["serve", "--dtype", "float32", "--tap-layer-ids", "4", "9",
                                      "--num-kv-blocks", "128"])
    flags = worker_flags(args)
    assert flags == ["--dtype", "float32", "--num-kv-blocks", "128", "--tap-layer-ids", "4", "9"]
    cfg = config_from_args(WorkerConfig, build_parser().parse_args(["worker", *flags]))
    assert (cfg.dtype, cfg.num_kv_blocks, cfg.tap_layer_ids) == ("float32", 128, (4, 9))


def test_colocated_scheduling_is_async_for_k0_and_off_cpu():
    """`dspark serve` / `dspark bench`: a CPU worker is scheduled synchronously
    while it speculates (or may: "auto"), asynchronously with K = 0 and on a
    GPU / NPU."""
    from dspark.shared.launcher import _spec_tokens, colocated_async_default

    k0 = '{"method": "dspark", "num_speculative_tokens": 0}'
    k7 = '{"method": "dspark", "num_speculative_tokens": 7, "verify": "confidence"}'
    assert [_spec_tokens(t) for t in (k0, k7, "auto", None, "{bad")] == [0, 7, None, None, None]
    assert colocated_async_default("cpu", 0)
    assert not colocated_async_default("cpu", 7)
    assert not colocated_async_default("cpu")  # "auto": the shipped drafter, K = 7
    assert colocated_async_default("cuda", 7) and colocated_async_default("npu")


def test_speculative_config_verify_policy():
    import json

    from dspark.shared.config import AUTO_VERIFY_POLICY

    def spec(**kw):
        return json.dumps({"method": "dspark", "num_speculative_tokens": 7, **kw})

    assert WorkerConfig(speculative_config=spec()).verify_policy() == "fixed"
    assert WorkerConfig(speculative_config=spec(verify="confidence")).verify_policy() == \
        "confidence"
    assert WorkerConfig().verify_policy() == AUTO_VERIFY_POLICY  # "auto"
    with pytest.raises(ValueError, match=r"speculative_config.verify='sometimes' is invalid"):
        WorkerConfig(speculative_config=spec(verify="sometimes"))


def test_verify_budget_spec_summary_and_profile_round_trip():
    from dspark.shared.types import SpecSummary, SpsProfile

    for budget in (None, 0, 5):  # 0 is a budget, not "unset"
        plan = StepPlan(step_id=3, seqs=[SeqStep("a", [1], 9, [0], True, lease_id=2,
                                                 num_speculative_tokens=7)],
                        verify_budget=budget)
        assert pb.step_from_pb(pb.step_to_pb(plan)) == plan
    prof = SpsProfile(rows=(1, 8, 32), forward_ms=(30.0, 32.0, 45.0), draft_fixed_ms=9.0,
                      draft_per_request_ms=1.0, draft_per_position_ms=0.25)
    info = WorkerInfo("m", "id", 100, 8, 2, 64, 16, 512, (2, 3), "float32", "cpu", (0, 1),
                      num_speculative_tokens=7, num_leases=4, verify_policy="confidence",
                      sps_profile=prof)
    assert pb.info_from_pb(pb.info_to_pb(info)) == info
    s = SpecSummary(num_speculative_tokens=3, verify_steps=4, num_draft_tokens=7,
                    num_accepted_tokens=3, unverified_steps=2, accepted_per_pos=[2, 1, 0],
                    verified_per_pos=[4, 2, 1], committed_in_verify=7)
    m = pb.spec_summary_to_pb(s)
    assert m.unverified_steps == 2 and list(m.verified_per_position) == [4, 2, 1]
    assert list(m.accepted_per_position) == [2, 1, 0]
    assert list(m.per_position_acceptance) == pytest.approx([0.5, 0.5, 0.0])


def test_pinned_sps_profile():
    import json

    from dspark.shared.config import parse_sps_profile

    text = json.dumps({"rows": [1, 8, 9], "forward_ms": [30, 30, 60], "draft_fixed_ms": 2})
    cfg = WorkerConfig(sps_profile=text)
    prof = parse_sps_profile(cfg.sps_profile)
    assert prof.rows == (1, 8, 9) and prof.forward(8) == 30.0 and prof.step(9, 1) == 62.0
    assert prof.draft_per_position_ms == 0.0 and prof.step(9, 1, depth=7) == 62.0
    deep = parse_sps_profile(json.dumps({"rows": [1], "forward_ms": [10],
                                         "draft_per_request_ms": 1,
                                         "draft_per_position_ms": 0.5}))
    assert deep.step(1, 2, depth=1) == 12.0 and deep.step(1, 2, depth=7) == 18.0
    with pytest.raises(ValueError, match="sps_profile=.*>= 0"):
        parse_sps_profile(json.dumps({"rows": [1], "forward_ms": [10],
                                      "draft_per_position_ms": -1}))
    for bad in ('{"rows": [8, 1], "forward_ms": [1, 2]}', '{"rows": [1], "forward_ms": [0]}',
                '{"rows": [1]}', '{"rows": [1], "forward_ms": [1], "x": 1}', "[1]", "{"):
        with pytest.raises(ValueError, match="sps_profile=.* is invalid"):
            WorkerConfig(sps_profile=bad)
