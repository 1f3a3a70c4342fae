"""ModelRunner on a tiny random Llama: paged KV, chunked prefill, batching, taps."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SeqStep, StepPlan
from dspark.worker.runner import ModelRunner

from .conftest import write_tiny_llama
from .reference import dense_forward, load_weights

BS = 8
TAPS = (0, 2)


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32",
                                    block_size=BS, num_kv_blocks=64, tap_layer_ids=TAPS))


@pytest.fixture(scope="module")
def ref(tiny_model_dir):
    return load_weights(tiny_model_dir)


def _tokens(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 97, (n,), generator=g).tolist()


def _blocks(first: int, n_tokens: int, stride: int = 1) -> list[int]:
    return [first + i * stride for i in range(-(-n_tokens // BS))]


def _logits_of(runner, rid, toks, blocks, chunks):
    """Run toks through the runner in the given chunk sizes; logits of every chunk end."""
    out, pos, lp = [], 0, []
    for c in chunks:
        plan = StepPlan(0, [SeqStep(rid, toks[pos:pos + c], pos, blocks, sample=True,
                                    return_tap_rows=True)])
        o = runner.step(plan).outputs[0]
        out.append(o)
        pos += c
    assert pos == len(toks)
    return out


def test_info(runner):
    info = runner.info()
    assert info.num_layers == 4 and info.hidden_size == 64 and info.vocab_size == 97
    assert info.num_kv_blocks == 64 and info.block_size == BS
    assert info.dtype == "float32" and info.device == "cpu" and info.tap_layer_ids == TAPS
    assert info.eos_token_ids == (2,) and len(info.model_id) == 16


@pytest.mark.parametrize("chunks", [[29], [5, 11, 13], [8, 8, 8, 1, 1, 1, 1, 1], [1] * 12 + [17],
                                    [20, 3, 1, 4, 1]])
@pytest.mark.parametrize("contiguous", [True, False])
def test_chunked_prefill_and_decode_match_dense(runner, ref, chunks, contiguous):
    cfg, w = ref
    toks = _tokens(1, sum(chunks))
    # contiguous tables take the no-gather slice path; others gather by slot
    blocks = _blocks(10, len(toks)) if contiguous else _blocks(10, len(toks), stride=3)[::-1]
    outs = _logits_of(runner, "r", toks, blocks, chunks)
    logits, hidden = dense_forward(cfg, w, toks)
    pos = 0
    for c, o in zip(chunks, outs):
        pos += c
        assert o.token_id == int(torch.argmax(logits[pos - 1]))
        lp = torch.log_softmax(logits[pos - 1], -1)[o.token_id].item()
        assert o.logprob == pytest.approx(lp, abs=1e-4)
        want = torch.cat([hidden[t] for t in TAPS], -1)[pos - c:pos].numpy()
        assert o.num_tap_rows == c and o.tap_rows.shape == (c, len(TAPS) * 64)
        np.testing.assert_allclose(o.tap_rows, want, atol=1e-4)
    start, tail = runner.tap_tail("r")
    assert start == 0 and tail.shape[0] == len(toks)
    runner.release(["r"])
    assert runner.tap_tail("r") is None


def _full_logits(runner, toks, blocks, rid="solo"):
    o = runner.step(StepPlan(0, [SeqStep(rid, toks, 0, blocks, sample=True)])).outputs[0]
    runner.release([rid])
    return o


def test_mixed_batch_equals_each_alone(runner, ref):
    cfg, w = ref
    lens = {"a": 13, "b": 21, "c": 6, "d": 30}
    toks = {k: _tokens(i + 5, n + 4) for i, (k, n) in enumerate(lens.items())}
    blocks = {"a": [1, 2, 3, 40, 41], "b": [7, 5, 9, 11], "c": [60, 20],
              "d": [30, 31, 32, 33, 34, 35]}
    # prefill b, c, d up to their lengths; a is prefilled in the mixed step
    for k in "bcd":
        runner.step(StepPlan(0, [SeqStep(k, toks[k][:lens[k]], 0, blocks[k], sample=False)]))
    # one step: a's 13-token prefill chunk, b decode 1, c verify-style 4 rows, d 2 rows
    plan = StepPlan(1, [
        SeqStep("b", toks["b"][21:22], 21, blocks["b"], sample=True, return_tap_rows=True),
        SeqStep("a", toks["a"][:13], 0, blocks["a"], sample=True, return_tap_rows=True),
        SeqStep("c", toks["c"][6:10], 6, blocks["c"], sample=True, return_tap_rows=True),
        SeqStep("d", toks["d"][30:32], 30, blocks["d"], sample=True, return_tap_rows=True),
    ])
    outs = runner.step(plan).outputs
    assert [o.request_id for o in outs] == ["b", "a", "c", "d"]
    ends = {"b": 22, "a": 13, "c": 10, "d": 32}
    starts = {"b": 21, "a": 0, "c": 6, "d": 30}
    for o in outs:
        logits, hidden = dense_forward(cfg, w, toks[o.request_id][:ends[o.request_id]])
        assert o.token_id == int(torch.argmax(logits[-1]))
        assert o.logprob == pytest.approx(torch.log_softmax(logits[-1], -1)[o.token_id].item(),
                                          abs=1e-4)
        want = torch.cat([hidden[t] for t in TAPS], -1)[starts[o.request_id]:]
        np.testing.assert_allclose(o.tap_rows, want.numpy(), atol=1e-4)
    runner.release(list("abcd"))


def test_batched_logits_equal_single(tiny_model_dir):
    """Raw logits of a mixed batch vs each sequence alone (fp32, atol 1e-4)."""
    r = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32", block_size=BS,
                                 num_kv_blocks=64, tap_layer_ids=()))
    captured = []
    orig = r.model.forward

    def spy(*a, **k):
        out = orig(*a, **k)
        captured.append(out)
        return out

    r.model.forward = spy
    t1, t2, t3 = _tokens(11, 19), _tokens(12, 9), _tokens(13, 3)
    r.step(StepPlan(0, [SeqStep("x", t1[:17], 0, [0, 1, 2], sample=False),
                        SeqStep("y", t2[:5], 0, [5], sample=False)]))
    r.step(StepPlan(1, [SeqStep("x", t1[17:], 17, [0, 1, 2], sample=True),
                        SeqStep("y", t2[5:], 5, [5, 9], sample=True),
                        SeqStep("z", t3, 0, [12], sample=True)]))
    batched = captured[-1]
    singles = []
    for rid, toks, blocks in (("x", t1, [20, 21, 22]), ("y", t2, [30, 31]), ("z", t3, [40])):
        r.step(StepPlan(2, [SeqStep(rid + "1", toks, 0, blocks, sample=True)]))
        singles.append(captured[-1][0])
    torch.testing.assert_close(batched, torch.stack(singles), atol=1e-4, rtol=0)


def test_untied_sharded_and_tied_checkpoints_load(tmp_path):
    for tied, shards in ((True, 1), (False, 3)):
        d = write_tiny_llama(tmp_path / f"m{tied}{shards}", seed=3, tied=tied, shards=shards)
        r = ModelRunner(WorkerConfig(model=str(d), dtype="float32", block_size=BS,
                                     num_kv_blocks=8, tap_layer_ids=(1,)))
        cfg, w = load_weights(d)
        toks = _tokens(4, 9)
        o = r.step(StepPlan(0, [SeqStep("q", toks, 0, [0, 1], sample=True)])).outputs[0]
        assert o.token_id == int(torch.argmax(dense_forward(cfg, w, toks)[0][-1]))


@pytest.mark.parametrize("taps", [(3,), (4,), (-1,), (1, 1)])
def test_invalid_tap_layers_raise(tiny_model_dir, taps):
    with pytest.raises(ValueError, match="tap_layer_ids"):
        ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32",
                                 num_kv_blocks=4, tap_layer_ids=taps))


@pytest.mark.parametrize("seq, msg", [
    (SeqStep("e", [5] * 9, 0, [0], sample=True), "need 2"),
    (SeqStep("e", [5], 16, [0, 1], sample=True), "need 3"),
    (SeqStep("e", [5], 0, [64], sample=True), "out of range"),
    (SeqStep("e", [], 0, [0], sample=True), "empty"),
    (SeqStep("e", [500], 0, [0], sample=True), "token id"),
    (SeqStep("e", [5], 300, list(range(40)), sample=True), "max_model_len"),
])
def test_bad_plans_raise(runner, seq, msg):
    with pytest.raises(ValueError, match=msg):
        runner.step(StepPlan(0, [seq]))


def test_seeded_sampling_is_reproducible(runner):
    toks = _tokens(9, 10)

    def run(seed):
        o = runner.step(StepPlan(0, [SeqStep("s", toks, 0, [3, 4], sample=True,
                                             temperature=1.5, seed=seed)])).outputs[0]
        return o.token_id

    got = [run(s) for s in (7, 7, 8, 9, 10, 11)]
    assert got[0] == got[1]
    assert len(set(got[1:])) > 1


def test_tap_tail_is_bounded_and_rewinds(tmp_path):
    d = write_tiny_llama(tmp_path / "long", seed=5, max_position_embeddings=512)
    r = ModelRunner(WorkerConfig(model=str(d), dtype="float32", block_size=BS,
                                 num_kv_blocks=64, tap_layer_ids=(1,)))
    toks = _tokens(6, 200)
    blocks = list(range(25))
    r.step(StepPlan(0, [SeqStep("t", toks[:150], 0, blocks, sample=False,
                                return_tap_rows=True)]))
    r.step(StepPlan(1, [SeqStep("t", toks[150:170], 150, blocks, sample=False,
                                return_tap_rows=True)]))
    start, tail = r.tap_tail("t")
    assert (start, tail.shape[0]) == (170 - 128, 128)
    before = tail[-20:].clone()
    r.step(StepPlan(2, [SeqStep("t", toks[150:160], 150, blocks, sample=False,
                                return_tap_rows=True)]))  # rewind
    start, tail = r.tap_tail("t")
    assert start + tail.shape[0] == 160
    # the same rows recomputed in a 10-row chunk instead of a 20-row one: equal up to
    # fp32 GEMM rounding, which depends on the matrix shape (and on the threads'
    # blocking: 1.2e-5 seen on a busy machine, past assert_close's default 1e-5)
    torch.testing.assert_close(tail[-10:], before[:10], rtol=1e-4, atol=1e-4)


def test_warmup_and_auto_dtype(tiny_model_dir):
    r = ModelRunner(WorkerConfig(model=str(tiny_model_dir), num_kv_blocks=4, block_size=8,
                                 tap_layer_ids=()))
    r.warmup()
    assert r.info().dtype in ("bfloat16", "float32")


def test_device_errors_are_clear(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("cuda present")
    with pytest.raises(RuntimeError, match="device cuda requested"):
        ModelRunner(WorkerConfig(model=str(tiny_model_dir), device="cuda"))


def test_per_sequence_attention_path_matches_batched(tiny_model_dir, monkeypatch):
    """Short windows over long contexts are attended one sequence at a time."""
    import dspark.worker.model.kv_cache as kvc

    def run():
        r = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32", block_size=BS,
                                     num_kv_blocks=64, tap_layer_ids=(1,)))
        toks = {i: _tokens(20 + i, 40) for i in range(3)}
        tables = {0: [1, 2, 3, 4, 5], 1: [20, 9, 30, 8, 7], 2: [40, 41, 42, 43, 44]}
        r.step(StepPlan(0, [SeqStep(str(i), toks[i][:30 + i], 0, tables[i], sample=False)
                            for i in range(3)]))
        plan = StepPlan(1, [SeqStep(str(i), toks[i][30 + i:34 + 2 * i], 30 + i, tables[i],
                                    sample=True, return_tap_rows=True) for i in range(3)])
        return r.step(plan).outputs

    batched = run()
    monkeypatch.setattr(kvc, "BATCH_GATHER_MAX_KEYS", 0)
    looped = run()
    for a, b in zip(batched, looped):
        assert a.token_id == b.token_id
        np.testing.assert_allclose(a.tap_rows, b.tap_rows, atol=1e-5)


def test_kv_pool_sized_from_gib(tiny_model_dir):
    # tiny: 4 layers * 2 (K, V) * bs 8 * 2 kv heads * 16 hd * 4 bytes = 8 KiB per block
    r = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32", block_size=BS,
                                 kv_cache_gib=1 / 1024, tap_layer_ids=(1,)))
    assert r.info().num_kv_blocks == 128
    toks = _tokens(30, 5)
    r.step(StepPlan(0, [SeqStep("k", toks, 0, [127], sample=False, return_tap_rows=True)]))
    assert r.last_tap_rows("k").shape == (5, 64)
    assert r.info().max_model_len == 256
    with pytest.raises(ValueError, match="max_model_len"):
        ModelRunner(WorkerConfig(model=str(tiny_model_dir), max_model_len=1000))


def test_npu_without_torch_npu_is_a_clear_error(tiny_model_dir):
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu installed")
    with pytest.raises(RuntimeError, match=r"pip install dspark-serve\[npu\]"):
        ModelRunner(WorkerConfig(model=str(tiny_model_dir), device="npu"))


def test_rope_scaling(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    d = write_tiny_llama(tmp_path / "l3", rope_scaling=scaling)
    r = ModelRunner(WorkerConfig(model=str(d), dtype="float32", block_size=BS,
                                 num_kv_blocks=8, tap_layer_ids=()))
    o = r.step(StepPlan(0, [SeqStep("q", _tokens(1, 9), 0, [0, 1], sample=True)])).outputs[0]
    assert 0 <= o.token_id < 97
    d = write_tiny_llama(tmp_path / "yarn", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="rope_scaling"):
        ModelRunner(WorkerConfig(model=str(d), dtype="float32", num_kv_blocks=8))


@pytest.mark.parametrize("linear", ["torch", "auto"])
def test_bfloat16_close_to_float32(tiny_model_dir, linear):
    """bf16 logits are fp32's to bf16 rounding, on oneDNN's packed weights
    (``--linear torch``) and on the native bf16 kernel where the CPU has it."""
    from dspark.worker.model import llama
    from dspark.worker.model.native_linear import Bf16Linear

    logits = {}
    for dt in ("float32", "bfloat16"):
        r = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype=dt, block_size=BS,
                                     num_kv_blocks=8, tap_layer_ids=(), linear=linear))
        if dt == "float32":
            pass
        elif r.native_linear is not None:
            assert linear == "auto" and isinstance(r.model.linear, Bf16Linear)
        elif llama.use_packed_linear(r.model.embed):
            assert r.model.linear is llama.packed_linear  # oneDNN-packed weights
        orig = r.model.forward
        r.model.forward = lambda *a, _o=orig, _d=dt, **k: logits.__setitem__(_d, _o(*a, **k)) \
            or logits[_d]
        toks = _tokens(2, 20)
        r.step(StepPlan(0, [SeqStep("q", toks[:12], 0, [0, 1, 2], sample=False)]))
        r.step(StepPlan(1, [SeqStep("q", toks[12:], 12, [0, 1, 2], sample=True)]))
    # the runner takes logits in the model dtype and converts only the rows it samples
    assert logits["bfloat16"].dtype == torch.bfloat16
    torch.testing.assert_close(logits["bfloat16"].float(), logits["float32"], atol=0.25,
                               rtol=0.05)


def test_float32_runner_packs_weights_and_matches_plain_weights(tiny_model_dir, monkeypatch):
    """A CPU float32 worker with ``--linear torch`` serves with oneDNN-packed weights
    (faster than F.linear at every step size); its logits equal the plain-weight model's to rounding and
    it samples the same tokens. Training loads (pack=False) keep plain weights."""
    from dspark.worker.model import llama

    packed = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32",
                                      block_size=BS, num_kv_blocks=8, tap_layer_ids=(),
                                      linear="torch"))
    if not llama.use_packed_linear(packed.model.embed):
        pytest.skip("no oneDNN fp32 packed linear on this CPU: serving uses F.linear")
    assert packed.model.linear is llama.packed_linear and packed.model.lm_head.is_mkldnn
    assert packed.model.wide_layers is None  # the fp32 prefill copy is for bf16 only
    train = llama.load_llama(tiny_model_dir, torch.float32, torch.device("cpu"), max_len=64)
    assert train.linear is F.linear and not train.lm_head.is_mkldnn
    monkeypatch.setattr(llama, "use_packed_linear", lambda like: False)
    plain = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32",
                                     block_size=BS, num_kv_blocks=8, tap_layer_ids=(),
                                     linear="torch"))
    assert plain.model.linear is F.linear
    logits, outs = {}, {}
    toks = _tokens(3, 20)
    for name, r in (("packed", packed), ("plain", plain)):
        orig = r.model.forward
        r.model.forward = lambda *a, _o=orig, _n=name, **k: logits.__setitem__(
            _n, _o(*a, **k)) or logits[_n]
        r.step(StepPlan(0, [SeqStep("q", toks[:12], 0, [0, 1, 2], sample=False)]))
        outs[name] = r.step(StepPlan(1, [SeqStep("q", toks[12:], 12, [0, 1, 2],
                                                 sample=True)])).outputs[0]
    torch.testing.assert_close(logits["packed"], logits["plain"], atol=1e-4, rtol=1e-4)
    assert outs["packed"].token_id == outs["plain"].token_id
    assert abs(outs["packed"].logprob - outs["plain"].logprob) < 1e-4


@pytest.mark.parametrize("wide", [False, True])
def test_bf16_prefill_fp32_path_matches_decode_path(tiny_model_dir, monkeypatch, wide):
    """A bf16 prefill chunk of >= FP32_ROWS rows may run its linears in fp32
    (plain weights, upcast); its logits agree with the packed bf16 path. (On the
    native bf16 kernel every step runs on it: no fp32 layers, even where an
    upcast measured faster.)"""
    from dspark.worker.model import llama

    monkeypatch.setattr(llama, "wide_gemm_faster_in_fp32", lambda w: wide)
    native = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="bfloat16",
                                      block_size=BS, num_kv_blocks=8, tap_layer_ids=()))
    if native.native_linear is not None:
        assert native.model.wide_layers is None
    r = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="bfloat16", block_size=BS,
                                 num_kv_blocks=64, tap_layer_ids=(), linear="torch"))
    if not llama.use_packed_linear(r.model.embed):
        pytest.skip("no oneDNN bf16 packing on this CPU: the fp32 prefill path is never used")
    assert (r.model.wide_layers is not None) == wide
    toks = _tokens(5, llama.FP32_ROWS + 10)
    n = len(toks)
    wide_logits = r.step(StepPlan(0, [SeqStep("w", toks, 0, list(range(_cdiv(n, BS))),
                                              sample=True, return_tap_rows=False)]))
    # the same sequence fed in small chunks (< FP32_ROWS rows: the packed bf16 path)
    small = None
    for s in range(0, n, 16):
        chunk = toks[s:s + 16]
        small = r.step(StepPlan(1, [SeqStep("s", chunk, s, list(range(32, 32 + _cdiv(n, BS))),
                                            sample=s + 16 >= n)]))
    assert wide_logits.outputs[0].token_id == small.outputs[0].token_id
    assert abs(wide_logits.outputs[0].logprob - small.outputs[0].logprob) < 0.1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_plain_worker_captures_tap_rows_only_when_asked(runner, monkeypatch):
    """K = 0: nothing reads tap rows unless a request asks for them, so the forward
    captures none and no tail is kept; the sampled tokens are the same."""
    seen = []
    forward = runner.model.forward

    def spy(*a, **kw):
        seen.append(a[4] if len(a) > 4 else kw.get("tap_layers", ()))
        return forward(*a, **kw)

    monkeypatch.setattr(runner.model, "forward", spy)
    toks = _tokens(40, 9)
    outs = {}
    for ask in (False, True):
        rid = f"ask-{ask}"
        o = runner.step(StepPlan(0, [SeqStep(rid, toks, 0, _blocks(50, 9), sample=True,
                                             return_tap_rows=ask)])).outputs[0]
        outs[ask] = o
        assert (runner.tap_tail(rid) is not None) == ask
        runner.release([rid])
    assert seen == [(), TAPS]
    assert outs[False].num_tap_rows == 0 and outs[False].tap_rows is None
    assert outs[True].num_tap_rows == 9
    assert outs[False].token_id == outs[True].token_id


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_async_k0_pipelines_plain_requests_with_the_same_output(tiny_model_dir, temperature):
    """Async scheduling without a drafter: each request's next step is planned
    while its step runs, the anchor resolved by the worker from the token it
    sampled; greedy and seeded sampled outputs equal sync scheduling's, and every
    block comes back."""
    import json

    from dspark.shared.types import SamplingParams
    from dspark.worker.training.engine import OfflineEngine

    cfg = WorkerConfig(model=str(tiny_model_dir), dtype="float32", num_kv_blocks=96,
                       block_size=8, tap_layer_ids=(0, 1),
                       speculative_config=json.dumps({"method": "dspark",
                                                      "num_speculative_tokens": 0}))
    r = ModelRunner(cfg)
    prompts = [[(7 * j + i) % 90 + 3 for j in range(5 + 3 * i)] for i in range(4)]
    items = [(f"r{i}", p, SamplingParams(max_tokens=14 + i, temperature=temperature, seed=i,
                                         ignore_eos=True)) for i, p in enumerate(prompts)]
    deferred = []
    step = r.step
    r.step = lambda plan: deferred.append(sum(s.deferred_anchor for s in plan.seqs)) or step(plan)
    outs = {}
    for async_ in (False, True):
        deferred.clear()
        eng = OfflineEngine(r, max_num_seqs=4, max_num_batched_tokens=64, async_scheduling=async_)
        outs[async_] = {rid: ids for rid, ids, _ in eng.generate(items)}
        assert eng.core.load()["free_kv_blocks"] == 96
        assert (sum(deferred) > 30) == async_  # sync: never deferred
    assert outs[True] == outs[False]
    assert all(len(v) == 14 + i for i, v in enumerate(outs[False].values()))
