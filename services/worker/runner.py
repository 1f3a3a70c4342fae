"""ModelRunner: executes one StepPlan (one batched target forward) on a device.

It owns the weights, the paged KV pool and per-request tap-row buffers; it keeps
no scheduling policy: block ids, positions and what to sample all come from the
plan. Sampling position convention: the token sampled from a sequence's last row
is at position ``start_position + len(token_ids)``, and its noise is a pure
function of (seed, that position).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SeqOutput, SeqStep, StepOutput, StepPlan, WorkerInfo

from dspark.shared.verify_fill import fill_verify_budget
from . import memory
from .model import native_attention, native_linear
from .model.kv_cache import PagedKVCache, build_metadata
from .model.llama import Llama, load_llama
from .sampler import RowParams, sample
from .spec import LeasePool
from .verify import VerifyInput, verify

from dspark.shared import rng
from dspark.shared.acceptance import VerifyResult, accept

TAP_TAIL = 128  # positions of tap rows kept per request (the drafter's window)


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError("device cuda requested but torch.cuda.is_available() is False "
                           f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
    return torch.device("cuda")


def _npu() -> torch.device:
    try:
        import torch_npu  # noqa: F401  (registers the npu device)
    except ImportError as e:
        raise RuntimeError("device npu requested but torch_npu is not installed: "
                           "pip install dspark-serve[npu]") from e
    if not torch.npu.is_available():  # type: ignore[attr-defined]
        raise RuntimeError("device npu requested but no NPU is available")
    return torch.device("npu")


DEVICES = {"cpu": lambda: torch.device("cpu"), "cuda": _cuda, "npu": _npu}


def resolve_device(name: str) -> torch.device:
    try:
        return DEVICES[name]()
    except KeyError:
        raise ValueError(f"device={name!r} is invalid: must be one of {sorted(DEVICES)}") from None


def cpu_supports_bf16() -> bool:
    """AVX512-BF16/AMX CPUs run bf16 matmuls natively; elsewhere they are emulated."""
    try:
        if "AVX512" not in torch.backends.cpu.get_cpu_capability():
            return False
        with open("/proc/cpuinfo") as f:
            flags = f.read()
        return "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        return False


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if device.type != "cpu" or cpu_supports_bf16():
        return torch.bfloat16
    return torch.float32


def model_fingerprint(model_dir: Path) -> str:
    """Cheap content id: config.json bytes + each safetensors file's size and header."""
    h = hashlib.sha256((model_dir / "config.json").read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            h.update(f.name.encode() + f.stat().st_size.to_bytes(8, "little") + fh.read(n))
    return h.hexdigest()[:16]


@dataclass
class _TapBuffer:
    """Per request: the latest step's tap rows and a tail of the last TAP_TAIL positions."""

    last: torch.Tensor  # [n_rows, m*d]
    tail: torch.Tensor  # [<= TAP_TAIL, m*d]
    tail_start: int  # position of tail[0]


class ModelRunner:
    """Loads the model and runs steps. Not thread-safe: one step at a time."""

    def __init__(self, config: WorkerConfig):
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model_dir = config.model_dir
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in model dir {self.model_dir} "
                                    "(run `dspark model prepare` for the default model)")
        hf_cfg = json.loads((self.model_dir / "config.json").read_text())
        ctx = int(hf_cfg.get("max_position_embeddings", 2048))
        if config.max_model_len > ctx:
            raise ValueError(f"max_model_len={config.max_model_len} is invalid: must be "
                             f"<= the model's max_position_embeddings ({ctx})")
        self.max_model_len = config.max_model_len or ctx
        # the native fp32 linear (None: oneDNN's packed weights, or F.linear)
        self.native_linear = native_linear.resolve(config.linear, self.device, self.dtype)
        self.model: Llama = load_llama(self.model_dir, self.dtype, self.device,
                                       self.max_model_len, pack=True,
                                       rows_linear=self.native_linear,
                                       gguf_weights=config.gguf_weights)
        # the native short-window attention kernel (None: the PyTorch path)
        self.native_attention = native_attention.resolve(config.attention, self.device,
                                                         self.model.args.head_dim)
        a = self.model.args
        self.model_id = model_fingerprint(self.model_dir)
        self.tap_layers = validate_tap_layers(config.tap_layer_ids, a.num_layers)
        # Speculation: the drafter and its lease rings come before the KV pool, whose
        # budget they are taken from. With K = 0 nothing of the drafter is loaded.
        self.num_spec, drafter_dir = config.speculation()
        self.verify_policy = config.verify_policy() if self.num_spec else ""
        self.sps_profile = None  # measured by profile() after warm-up (K > 0)
        self.drafter = self.leases = None
        self.drafter_id = ""
        self.use_markov = True  # False = the DFlash ablation (evaluation only)
        lease_bytes = 0
        if self.num_spec:
            self._load_drafter(drafter_dir)
            lease_bytes = LeasePool.bytes_needed(self.drafter.config, config.num_leases,
                                                 self.num_spec, self.dtype)
        self.block_size = config.block_size
        per_block = PagedKVCache.bytes_per_block(a.num_layers, self.block_size,
                                                 a.num_kv_heads, a.head_dim, self.dtype)
        num_blocks = config.num_kv_blocks or \
            int((config.kv_cache_gib * 2**30 - lease_bytes) // per_block)
        if num_blocks < 1:
            raise ValueError(f"kv_cache_gib={config.kv_cache_gib} is invalid: "
                             f"too small for one KV block ({per_block} bytes) after "
                             f"{lease_bytes} bytes of drafter leases")
        if self.device.type == "cpu":
            setting = (f"num_kv_blocks={config.num_kv_blocks}" if config.num_kv_blocks
                       else f"kv_cache_gib={config.kv_cache_gib}")
            memory.check_kv_pool(num_blocks * per_block, setting, memory.available())
        if self.num_spec:
            self.leases = LeasePool(self.drafter, config.num_leases, self.num_spec,
                                    self.device)
        self.kv = PagedKVCache(a.num_layers, num_blocks, self.block_size, a.num_kv_heads,
                               a.head_dim, self.dtype, self.device,
                               prefault=config.kv_prefault)
        self._taps: dict[str, _TapBuffer] = {}
        # async scheduling: each speculating request's last result, to resolve a
        # deferred anchor: ("token", token, position) or ("verify", VerifyResult,
        # anchor position, greedy, seed)
        self._last: dict[str, tuple] = {}

    def _load_drafter(self, directory: Path) -> None:
        from .model.drafter_ckpt import load_drafter

        a = self.model.args
        default_taps = WorkerConfig().tap_layer_ids
        dr = load_drafter(directory, dict(
            model_id=self.model_id, vocab_size=a.vocab_size, hidden_size=a.hidden_size,
            num_layers=a.num_layers, dtype=self.dtype, device=str(self.device),
            max_block_size=self.num_spec))
        taps = dr.config.target_layer_ids
        if self.tap_layers not in (taps, default_taps):
            raise ValueError(f"tap_layer_ids={list(self.tap_layers)} conflicts with the "
                             f"drafter at {directory}, which reads layers {list(taps)}")
        self.tap_layers = validate_tap_layers(taps, a.num_layers)
        self.drafter = dr.bind_llama(self.model)
        self.drafter.pack_for_inference()  # CPU: packed like the target
        h = hashlib.sha256((Path(directory) / "drafter_config.json").read_bytes())
        h.update(str((Path(directory) / "drafter.safetensors").stat().st_size).encode())
        self.drafter_id = f"{Path(directory).name}@{h.hexdigest()[:12]}"

    # ------------------------------------------------------------------ info
    def info(self) -> WorkerInfo:
        a = self.model.args
        eos = a.eos_token_ids
        gen = self.model_dir / "generation_config.json"
        if gen.is_file():
            e = json.loads(gen.read_text()).get("eos_token_id")
            if e is not None:
                eos = tuple(e) if isinstance(e, list) else (int(e),)
        return WorkerInfo(
            model_name=self.model_dir.name, model_id=self.model_id,
            vocab_size=a.vocab_size, hidden_size=a.hidden_size, num_layers=a.num_layers,
            num_kv_blocks=self.kv.num_blocks, block_size=self.block_size,
            max_model_len=self.max_model_len, eos_token_ids=tuple(int(x) for x in eos),
            dtype=str(self.dtype).removeprefix("torch."), device=self.device.type,
            tap_layer_ids=self.tap_layers, num_speculative_tokens=self.num_spec,
            num_leases=self.leases.num_leases if self.leases else 0,
            drafter_id=self.drafter_id, verify_policy=self.verify_policy or "fixed",
            sps_profile=self.sps_profile)

    def warmup(self) -> None:
        """One small prefill + decode forward on scratch block 0, then forget it."""
        n = min(4, self.max_model_len - 1, self.block_size - 1)
        ids = [0] * max(n, 1)
        self.step(StepPlan(-1, [SeqStep("__warmup__", ids, 0, [0], sample=True)]))
        self.step(StepPlan(-1, [SeqStep("__warmup__", [0], len(ids), [0], sample=True)]))
        self.release(["__warmup__"])

    def profile(self, budget_s: float = 2.0):
        """Speculating workers: measure the forward and drafting costs the scheduler
        sizes verification with (``dspark.worker.profile``), or take the pinned
        ``sps_profile`` of the config; nothing with K = 0."""
        if self.num_spec and self.config.sps_profile:
            from dspark.shared.config import parse_sps_profile

            self.sps_profile = parse_sps_profile(self.config.sps_profile)
        elif self.num_spec:
            from .profile import measure

            self.sps_profile = measure(self, budget_s)
        return self.sps_profile

    def release(self, request_ids) -> None:
        for rid in request_ids:
            self._taps.pop(rid, None)
            self._last.pop(rid, None)
            if self.leases is not None:
                self.leases.release(rid)

    def last_tap_rows(self, request_id: str) -> torch.Tensor | None:
        """The latest step's tap rows of a request that asked for them
        (``return_tap_rows``): [n_rows, m*d] in the model dtype."""
        buf = self._taps.get(request_id)
        return None if buf is None else buf.last

    def tap_tail(self, request_id: str) -> tuple[int, torch.Tensor] | None:
        """(position of the first row, rows [n, m*d]) of the tap tail of a request
        that asks for tap rows (drafting reads the lease ring instead)."""
        buf = self._taps.get(request_id)
        return None if buf is None else (buf.tail_start, buf.tail)

    # ------------------------------------------------------------------ step
    def _validate(self, s: SeqStep) -> None:
        n, bs = len(s.token_ids), self.block_size
        where = f"request {s.request_id!r}"
        if n == 0:
            raise ValueError(f"{where}: token_ids is empty"
                             + (" (deferred anchor unresolved)" if s.deferred_anchor else ""))
        if s.start_position < 0:
            raise ValueError(f"{where}: start_position={s.start_position} must be >= 0")
        end = s.start_position + n
        if end > self.max_model_len:
            raise ValueError(f"{where}: positions up to {end} exceed "
                             f"max_model_len={self.max_model_len}")
        need = -(-end // bs)
        if len(s.block_ids) < need:
            raise ValueError(f"{where}: block_ids has {len(s.block_ids)} blocks but positions "
                             f"[0, {end}) need {need} (block_size={bs})")
        nb = self.kv.num_blocks
        for b in s.block_ids[:need]:
            if not 0 <= b < nb:
                raise ValueError(f"{where}: block id {b} out of range [0, {nb})")
        vocab = self.model.args.vocab_size
        for t in s.token_ids:
            if not 0 <= t < vocab:
                raise ValueError(f"{where}: token id {t} out of range [0, {vocab})")
        if s.lease_id >= 0:
            if self.leases is None:
                raise ValueError(f"{where}: lease_id {s.lease_id} given but this worker has "
                                 "no drafter (num_speculative_tokens=0)")
            self.leases.check(s.lease_id, s.request_id)
        k = s.num_speculative_tokens
        if k:
            if not 0 < k <= self.num_spec:
                raise ValueError(f"{where}: num_speculative_tokens={k} must be in "
                                 f"[0, {self.num_spec}]")
            if s.lease_id < 0 or n != 1 or not s.sample:
                raise ValueError(f"{where}: a speculative step needs a lease, exactly one "
                                 "token (the anchor) and sample=true")

    @torch.inference_mode()
    def step(self, plan: StepPlan) -> StepOutput:
        """Run one batched forward; outputs are in the plan's order.

        Speculating sequences (num_speculative_tokens = k > 0) are drafted first from
        their lease rings, then verified in the same target forward as everything
        else: rows [anchor, d_1..d_l] at positions start..start+l, l = k, or under
        ``plan.verify_budget`` the lengths of ``fill_verify_budget`` (0..k each).
        """
        t0 = time.perf_counter()
        seqs = plan.seqs
        if not seqs:
            return StepOutput(plan.step_id, [])
        plan_deferred = {s.request_id: s.deferred_anchor for s in seqs}
        seqs = [self._resolve_anchor(s) if s.deferred_anchor else s for s in seqs]
        ids = set()
        for s in seqs:
            self._validate(s)
            if s.request_id in ids:
                raise ValueError(f"request {s.request_id!r} appears twice in step {plan.step_id}")
            ids.add(s.request_id)
        for s in seqs:
            if s.lease_id >= 0:
                self.leases.claim(s.lease_id, s.request_id)
                if s.start_position == 0:  # a (re-)prefill from scratch: forget old rows
                    self.leases.reset(s.lease_id)
        spec = [i for i, s in enumerate(seqs) if s.num_speculative_tokens]
        drafts = None
        if spec:  # no request verifies more than its K, nor more than the whole budget
            depth = max(seqs[i].num_speculative_tokens for i in spec)
            if plan.verify_budget is not None:
                depth = max(1, min(depth, plan.verify_budget))
            drafts = self._draft([seqs[i] for i in spec], depth)
        # verified drafts per speculating seq: all k, or the budget's fill
        nver = [seqs[i].num_speculative_tokens for i in spec]
        if drafts is not None and plan.verify_budget is not None:
            if plan.verify_budget < 0:
                raise ValueError(f"verify_budget={plan.verify_budget} must be >= 0")
            conf = drafts.confidences.float().tolist()
            nver = fill_verify_budget([conf[j][:k] for j, k in enumerate(nver)],
                                      plan.verify_budget, plan.verify_step_ms,
                                      base_tokens=sum(1 for s in seqs if s.sample))
        rows_in: list[list[int]] = []
        for i, s in enumerate(seqs):
            toks = list(s.token_ids)
            if drafts is not None and i in spec:
                j = spec.index(i)
                toks += drafts.tokens[j, :nver[j]].tolist()
                end = s.start_position + len(toks)
                if end > self.max_model_len or -(-end // self.block_size) > len(s.block_ids):
                    raise ValueError(f"request {s.request_id!r}: verify window up to {end} "
                                     f"needs more blocks / exceeds max_model_len")
            rows_in.append(toks)
        dev = self.device
        a = self.model.args
        tokens: list[int] = []
        logit_rows: list[int] = []
        for s, toks in zip(seqs, rows_in):
            tokens.extend(toks)
            if s.num_speculative_tokens:  # every verify row (just the anchor when l = 0)
                logit_rows.extend(range(len(tokens) - len(toks), len(tokens)))
            elif s.sample:
                logit_rows.append(len(tokens) - 1)
        meta = build_metadata([(s.start_position, len(t), s.block_ids)
                               for s, t in zip(seqs, rows_in)],
                              self.block_size, a.num_heads // a.num_kv_heads, dev,
                              native=self.native_attention)
        if meta.gather_blocks:
            meta.ws_k, meta.ws_v = self.kv.workspace(meta.gather_blocks)
        t = len(tokens)
        # tap rows: for the lease rings, and for requests that ask for them (a K = 0
        # worker captures none otherwise)
        want = [s.return_tap_rows for s in seqs]
        taps = (torch.empty(t, len(self.tap_layers) * a.hidden_size, dtype=self.dtype,
                            device=dev)
                if self.tap_layers and (self.leases is not None or any(want)) else None)
        rows = torch.tensor(logit_rows, dtype=torch.long, device=dev) if logit_rows else None
        logits = self.model.forward(torch.tensor(tokens, dtype=torch.long, device=dev), meta,
                                    self.kv, rows, self.tap_layers if taps is not None else (),
                                    taps, float_logits=False)
        outputs = [SeqOutput(s.request_id, num_tap_rows=len(tk) if taps is not None else 0)
                   for s, tk in zip(seqs, rows_in)]
        if logits is not None:
            self._results(seqs, rows_in, logits, drafts, spec, outputs)
        row, ring_writes = 0, []
        for s, toks, out in zip(seqs, rows_in, outputs):
            if plan_deferred.get(s.request_id):
                out.anchor_token, out.anchor_position = s.token_ids[0], s.start_position
            self._remember(s, out)
            n = len(toks)
            if taps is not None:
                rows_s = taps[row:row + n]
                if s.return_tap_rows:  # the lease ring holds what drafting needs
                    self._keep_taps(s, rows_s)
                if s.lease_id >= 0:
                    ring_writes.append((s.lease_id, s.start_position, rows_s))
                if s.return_tap_rows:
                    out.tap_rows = rows_s.float().cpu().numpy()
            row += n
        if ring_writes:  # staged; projected when the lease drafts (LeasePool.flush)
            self.leases.stage_many(ring_writes)
        return StepOutput(plan.step_id, outputs, forward_ms=(time.perf_counter() - t0) * 1e3)

    def _resolve_anchor(self, s: SeqStep) -> SeqStep:
        """Async scheduling: the anchor of a deferred step is this worker's own
        acceptance of the request's previous step (the same shared function, on the
        same float32 values and counter-based uniforms the scheduler will use)."""
        from dataclasses import replace

        last = self._last.get(s.request_id)
        if last is None:
            raise ValueError(f"request {s.request_id!r}: deferred anchor but no previous "
                             "step of it ran on this worker")
        if last[0] == "token":
            _, tok, pos = last
        else:
            _, res, a, greedy, _seed = last
            toks = accept(res, greedy=greedy).tokens
            tok, pos = toks[-1], a + len(toks)
        return replace(s, token_ids=[tok], start_position=pos, deferred_anchor=False)

    def _remember(self, s: SeqStep, out: SeqOutput) -> None:
        """What a deferred next step of the request resolves its anchor from (every
        sampling request: with or without a lease, async scheduling defers it)."""
        if s.num_speculative_tokens:
            a = s.start_position
            k = len(out.draft_tokens)
            res = VerifyResult(draft_tokens=out.draft_tokens, target_tokens=out.target_tokens,
                               q_draft=out.q_draft, p_draft=out.p_draft,
                               uniforms=[rng.uniform(s.seed, a + i + 1, rng.STREAM_ACCEPT)
                                         for i in range(k)],
                               residual_tokens=out.residual_tokens)
            self._last[s.request_id] = ("verify", res, a, s.temperature == 0.0, s.seed)
        elif s.sample:
            self._last[s.request_id] = ("token", out.token_id,
                                        s.start_position + len(s.token_ids))

    def _draft(self, seqs: list[SeqStep], depth: int):
        params = [RowParams(s.temperature, s.top_k, s.top_p, s.seed, s.start_position)
                  for s in seqs]
        return self.leases.draft([s.lease_id for s in seqs], [s.token_ids[0] for s in seqs],
                                 [s.start_position for s in seqs], params,
                                 use_markov=self.use_markov,
                                 depth=min(depth, self.drafter.config.block_size))

    def _results(self, seqs, rows_in, logits, drafts, spec, outputs) -> None:
        """Fill sampled tokens (plain rows) and verify results (speculative rows)."""
        plain, plain_rows, vin, vrows, r = [], [], [], [], 0
        for i, (s, toks) in enumerate(zip(seqs, rows_in)):
            if s.num_speculative_tokens:
                j = spec.index(i)
                k = len(toks) - 1  # the drafts verified
                dist = drafts.dists[j]
                vin.append(VerifyInput(
                    draft_tokens=toks[1:], anchor_position=s.start_position,
                    params=RowParams(s.temperature, s.top_k, s.top_p, s.seed,
                                     s.start_position),
                    draft_probs=None if dist is None else dist[:k]))
                vrows.extend(range(r, r + k + 1))
                r += k + 1
            elif s.sample:
                plain.append(i)
                plain_rows.append(r)
                r += 1
        if plain:
            params = [RowParams(seqs[i].temperature, seqs[i].top_k, seqs[i].top_p,
                                seqs[i].seed, seqs[i].start_position + len(rows_in[i]))
                      for i in plain]
            tok, lp = sample((logits[plain_rows] if vin else logits).float(), params)
            for i, t_, l_ in zip(plain, tok.tolist(), lp.tolist()):
                outputs[i].token_id, outputs[i].logprob = t_, l_
        if vin:
            # the verify rows (no copy when they are all the logits rows)
            results = verify(logits[vrows] if plain else logits, vin)
            for j, (i, res) in enumerate(zip(spec, results)):
                o = outputs[i]
                o.draft_tokens, o.target_tokens = res.draft_tokens, res.target_tokens
                # float32 values already (verify): what the scheduler sees after the wire
                o.q_draft, o.p_draft = res.q_draft, res.p_draft
                o.residual_tokens = res.residual_tokens
                k = seqs[i].num_speculative_tokens  # every drafted token's confidence (<= k)
                o.confidences = drafts.confidences[j, :k].float().tolist()

    def _keep_taps(self, s: SeqStep, rows: torch.Tensor) -> None:
        """Remember the step's rows and update the tail (a copy of <= TAP_TAIL rows, so
        it never pins a whole step's tap tensor)."""
        buf = self._taps.get(s.request_id)
        recent = rows[-TAP_TAIL:]  # only the last TAP_TAIL positions can stay in the tail
        start = s.start_position + rows.shape[0] - recent.shape[0]
        if (buf is None or recent.shape[0] < rows.shape[0] or s.start_position < buf.tail_start
                or s.start_position > buf.tail_start + buf.tail.shape[0]):
            tail, tail_start = recent.clone(), start  # first step, long chunk, rewind, gap
        else:  # drop rows at positions >= start (being recomputed), append
            tail = torch.cat([buf.tail[:s.start_position - buf.tail_start], recent])
            tail_start = buf.tail_start
            if tail.shape[0] > TAP_TAIL:
                tail_start += tail.shape[0] - TAP_TAIL
                tail = tail[-TAP_TAIL:].clone()
        self._taps[s.request_id] = _TapBuffer(rows, tail, tail_start)

def validate_tap_layers(tap_layer_ids, num_layers: int) -> tuple[int, ...]:
    """Tap layer i = residual stream after decoder layer i; 0 <= i < num_layers - 1."""
    taps = tuple(int(x) for x in tap_layer_ids)
    for x in taps:
        if not 0 <= x < num_layers - 1:
            raise ValueError(f"tap_layer_ids={taps!r} is invalid: each must be in "
                             f"[0, {num_layers - 2}] (the model has {num_layers} layers; "
                             "the final layer cannot be tapped)")
    if len(set(taps)) != len(taps):
        raise ValueError(f"tap_layer_ids={taps!r} is invalid: duplicates")
    return taps

