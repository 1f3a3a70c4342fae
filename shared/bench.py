"""`dspark bench`: one run, same prompts, same machine, side by side.

Measures the services (started here, stopped after) at batch 1 and under
concurrency 8 and 32, and the same model through transformers `generate()`
at batch 1 in the same dtype; prints ratios and writes JSON (+ a PNG plot).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

EVAL_SETS = ("mt-bench", "humaneval", "mbpp", "gsm8k", "math500")


def datasets_dir() -> Path:
    """../shared/datasets next to the checkout (where the project keeps them)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent.parent / "shared" / "datasets"
        if (cand / "eval").is_dir():
            return cand
    raise FileNotFoundError("cannot find shared/datasets/eval beside the repository")


def load_eval_prompts(n: int) -> list[str]:
    """n first-turn prompts, round robin over the eval sets."""
    per = {}
    for name in EVAL_SETS:
        lines = (datasets_dir() / "eval" / f"{name}.jsonl").read_text(encoding="utf-8").split("\n")
        per[name] = [json.loads(x)["turns"][0] for x in lines if x.strip()]
    out, i = [], 0
    while len(out) < n:
        for name in EVAL_SETS:
            if i < len(per[name]) and len(out) < n:
                out.append(per[name][i])
        i += 1
    return out


# --- services ---------------------------------------------------------------

def _one_stream(client, prompt: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    times, n, spec = [], 0, None
    for ch in client.stream(messages=[{"role": "user", "content": prompt}],
                            max_tokens=max_tokens, temperature=0, ignore_eos=True,
                            return_spec_summary=True):
        if ch.token_ids:
            times.append(time.perf_counter())
            n += len(ch.token_ids)
        if ch.spec_summary is not None:
            spec = ch.spec_summary
    ttft = times[0] - t0
    decode_s = times[-1] - times[0]
    # inter-token latency: decode time per token after the first (a speculative
    # step delivers several tokens at once: this is the mean per token)
    return {"ttft_s": ttft, "tokens": n, "decode_s": decode_s, "wall_s": times[-1] - t0,
            "itl_s": decode_s / max(1, n - 1), "spec": spec}


def spec_stats(runs: list[dict]) -> dict:
    """Mean accepted length (tokens per verify step), per-position acceptance and, with
    confidence-scheduled verification, the steps left without drafts, pooled over
    requests (from the summaries' per-position counts)."""
    specs = [r["spec"] for r in runs if r.get("spec")]
    unverified = sum(s.get("unverified_steps", 0) for s in specs)
    specs = [s for s in specs if s["verify_steps"]]
    if not specs:
        return {"mean_accepted_length": None, "per_position_acceptance": [],
                "unverified_steps": unverified, "tokens_per_step": 1.0 if unverified else None}
    steps = sum(s["verify_steps"] for s in specs)
    committed = sum(s["mean_accepted_length"] * s["verify_steps"] for s in specs)
    k = max(len(s["per_position_acceptance"]) for s in specs)
    judged, passed = [0.0] * k, [0.0] * k
    for s in specs:
        for i in range(len(s.get("verified_per_position") or [])):
            judged[i] += s["verified_per_position"][i]
            passed[i] += s["accepted_per_position"][i]
    return {"mean_accepted_length": committed / steps,
            "per_position_acceptance": [p / j if j else 0.0 for p, j in zip(passed, judged)],
            "verify_steps": steps, "unverified_steps": unverified,
            "drafts_per_verify_step": sum(s["num_draft_tokens"] for s in specs) / steps,
            # every step of a speculating request after its first token
            "tokens_per_step": (committed + unverified) / (steps + unverified)}


def run_concurrent(client, prompts: list[str], conc: int, max_tokens: int) -> dict:
    return pool_rounds([concurrent_round(client, prompts, conc, max_tokens)])


def concurrent_round(client, prompts: list[str], conc: int, max_tokens: int) -> dict:
    """One round: conc requests at once; their streams and the wall time."""
    jobs = [prompts[i % len(prompts)] for i in range(conc)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        res = list(pool.map(lambda p: _one_stream(client, p, max_tokens), jobs))
    return {"runs": res, "wall_s": time.perf_counter() - t0}


def pool_rounds(rounds: list[dict]) -> dict:
    """Rounds of one deployment pooled: all tokens over all wall time, medians of
    every request's TTFT and ITL, speculation over every request."""
    res = [r for rd in rounds for r in rd["runs"]]
    wall = sum(rd["wall_s"] for rd in rounds)
    return {"tokens_per_s": sum(r["tokens"] for r in res) / wall,
            "ttft_ms": 1000 * statistics.median(r["ttft_s"] for r in res),
            "itl_ms": 1000 * statistics.median(r["itl_s"] for r in res),
            **{f"spec_{k}": v for k, v in spec_stats(res).items()}}


def rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _spec_flag(k: int, verify: str = "fixed") -> list[str]:
    cfg = {"method": "dspark", "num_speculative_tokens": k}
    if k:
        cfg["verify"] = verify
    return ["--speculative-config", json.dumps(cfg)]


# (name, K, verify policy, label): K = 0, a fixed K, and confidence-scheduled K
DEPLOYMENTS = (("k0", 0, "fixed", "K=0"), ("k7", None, "fixed", "K=7 (DSpark)"),
               ("k7c", None, "confidence", "K=7, confidence-scheduled"))


def bench_services(prompts, args, log_dir: Path, hf: "HFBaseline") -> dict:
    """Start the K=0, K=7 (fixed) and K=7 confidence-scheduled deployments side by
    side, measure them, stop them.

    Batch 1 is measured paired, prompt by prompt: every deployment and transformers
    one after the other (never at once), so all see the same machine (these shared
    machines drift by 20-30% over minutes). Concurrency 8 and 32 then run the
    deployments back to back.
    """
    from dspark.shared.client import Client
    from dspark.shared.launcher import colocated_async_default, start_cluster

    variants = [(name, args.k if k is None else k, verify)
                for name, k, verify, _ in DEPLOYMENTS if k == 0 or args.k]
    clusters, clients = {}, {}
    try:
        for i, (name, k, verify) in enumerate(variants):
            port = args.port + 20 * i
            wargs = ["--dtype", args.dtype, "--attention", args.attention,
                     "--linear", args.linear,
                     "--gguf-weights", args.gguf_weights] + _spec_flag(k, verify)
            if k and args.drafter:
                wargs += ["--drafter", args.drafter]
            async_ = colocated_async_default("cpu", k)  # what `dspark serve` runs
            clusters[name] = start_cluster(worker_args=wargs, log_dir=log_dir / name,
                                           scheduler_args=["--async-scheduling" if async_
                                                           else "--no-async-scheduling"],
                                           router_port=port, base_port=port + 1,
                                           timeout_s=600)
            clients[name] = Client(clusters[name].router, timeout=900)
        res: dict = {name: {} for name, _, _ in variants}
        for name, _, _ in variants:
            _one_stream(clients[name], prompts[0], 8)  # warm-up
        hf.decode_rate(prompts[0], 8)
        b1: dict = {name: [] for name, _, _ in variants}
        hf_rates = []
        for p in prompts[: args.batch1_prompts]:
            for name, _, _ in variants:
                b1[name].append(_one_stream(clients[name], p, args.max_tokens))
            hf_rates.append(hf.decode_rate(p, args.max_tokens))
        res["hf_batch1_tokens_per_s"] = len(hf_rates) / sum(1 / r for r in hf_rates)
        for name, _, _ in variants:
            runs = b1[name]
            res[name].update({
                "batch1_tokens_per_s": sum(r["tokens"] - 1 for r in runs) /
                sum(r["decode_s"] for r in runs),
                "ttft_ms": 1000 * statistics.median(r["ttft_s"] for r in runs),
                "itl_ms": 1000 * statistics.median(r["itl_s"] for r in runs),
                **spec_stats(runs)})
            print(f"  {name} batch 1: {res[name]['batch1_tokens_per_s']:.1f} tok/s, "
                  f"tau {res[name]['mean_accepted_length']}", file=sys.stderr)
        for conc in (8, 32):
            # rounds alternate between the deployments (k0, k7, k7c, k0, ...), so
            # a drift of the machine over minutes falls on all of them alike
            rounds: dict = {name: [] for name, _, _ in variants}
            for _ in range(args.rounds):
                for name, _, _ in variants:
                    rounds[name].append(concurrent_round(clients[name], prompts, conc,
                                                         args.max_tokens))
            for name, _, _ in variants:
                r = pool_rounds(rounds[name])
                res[name][f"conc{conc}_tokens_per_s"] = r["tokens_per_s"]
                res[name][f"conc{conc}_ttft_ms"] = r["ttft_ms"]
                res[name][f"conc{conc}_itl_ms"] = r["itl_ms"]
                if r.get("spec_mean_accepted_length") is not None:
                    res[name][f"conc{conc}_mean_accepted_length"] = r["spec_mean_accepted_length"]
                if r.get("spec_tokens_per_step") is not None:
                    res[name][f"conc{conc}_tokens_per_step"] = r["spec_tokens_per_step"]
                    res[name][f"conc{conc}_unverified_steps"] = r["spec_unverified_steps"]
                print(f"  {name} concurrency {conc}: {r['tokens_per_s']:.1f} tok/s",
                      file=sys.stderr)
        for name, _, _ in variants:
            pid = dict(clusters[name].procs)["worker-0"].pid
            res[name]["worker_peak_rss_mib"] = rss_peak_mib(pid)
        if args.memory_check:
            name = variants[-1][0]  # the speculative deployment when there is one
            pid = dict(clusters[name].procs)["worker-0"].pid
            long_prompt = " ".join(load_eval_prompts(40))[:9000]
            r = run_concurrent(clients[name], [long_prompt], 32, 16)
            res[name]["memory_check"] = {"requests": 32, "prompt_chars": len(long_prompt),
                                         "tokens_per_s": r["tokens_per_s"],
                                         "worker_peak_rss_mib": rss_peak_mib(pid)}
        return res
    finally:
        for c in clients.values():
            c.close()
        for c in clusters.values():
            c.stop()


# --- transformers baseline ---------------------------------------------------

class HFBaseline:
    """The same model through transformers `generate()`, same dtype, greedy."""

    def __init__(self, model_dir: Path, dtype: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=tdtype).eval()
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())

    def decode_rate(self, prompt: str, max_tokens: int) -> float:
        """Decode tokens/s for one chat prompt (prefill time subtracted)."""
        text = self.tok.apply_chat_template([{"role": "user", "content": prompt}],
                                            tokenize=False, add_generation_prompt=True)
        ids = self.tok(text, return_tensors="pt").input_ids
        with self.torch.inference_mode():
            t0 = time.perf_counter()
            self.model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            self.model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                do_sample=False)
            total = time.perf_counter() - t0
        return (max_tokens - 1) / max(1e-6, total - prefill)


def read_bandwidth_gbs() -> float:
    """Best of a few full reads of a 1 GiB tensor (sum)."""
    import torch

    x = torch.ones(256 * 1024 * 1024, dtype=torch.float32)
    best = 0.0
    for _ in range(4):
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0))
    return best / 1e9


def gguf_blocks_file(model_dir: Path) -> Path | None:
    from dspark.worker.model.gguf_blocks import GGUF_BLOCKS

    p = Path(model_dir) / GGUF_BLOCKS
    return p if p.is_file() else None


def weight_bytes_read(model_dir: Path, dense_bytes: int, gguf: bool) -> int:
    """Bytes of weights a decode step reads: the dense weights, or with GGUF
    blocks those matrices' packed bytes (native_linear.pack_gguf) instead of
    their float32 ones."""
    path = gguf_blocks_file(model_dir)
    if not gguf or path is None:
        return dense_bytes
    from safetensors import safe_open

    from dspark.worker.model.native_linear import GGUF_KINDS, gguf_kind, packed_gguf_bytes

    with safe_open(str(path), framework="pt") as f:
        types = json.loads((f.metadata() or {}).get("gguf_types", "{}"))
        for name in f.keys():
            n, width = f.get_slice(name).get_shape()
            kind = gguf_kind(types[name])
            k = width // GGUF_KINDS[kind][1] * 32
            dense_bytes += packed_gguf_bytes(n, k, kind) - n * k * 4
    return dense_bytes


def _resolved_dtype(dtype: str) -> str:
    if dtype != "auto":
        return dtype
    import torch

    from dspark.worker.runner import resolve_dtype  # the worker's own choice

    return str(resolve_dtype("auto", torch.device("cpu"))).replace("torch.", "")


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key, _, _, label in DEPLOYMENTS:
        r = result.get(key)
        if not r:
            continue
        xs = [1, 8, 32]
        ys = [r["batch1_tokens_per_s"], r["conc8_tokens_per_s"], r["conc32_tokens_per_s"]]
        ax.plot(xs, ys, marker="o", label=label)
    ax.axhline(result["transformers"]["batch1_tokens_per_s"], ls="--", color="gray",
               label="transformers generate(), batch 1")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"Throughput vs concurrency ({result['dtype']})")
    ax.legend()
    acc = (result.get("k7") or {}).get("per_position_acceptance") or []
    accc = (result.get("k7c") or {}).get("per_position_acceptance") or []
    if acc:
        xs = range(1, len(acc) + 1)
        w = 0.4 if accc else 0.8
        ax2.bar([x - w / 2 if accc else x for x in xs], acc, width=w, label="K=7")
        if accc:
            ax2.bar([x + w / 2 for x in range(1, len(accc) + 1)], accc, width=w,
                    label="K=7, confidence-scheduled (verified drafts)")
            ax2.legend()
        ax2.set_ylim(0, 1)
        tau = result["k7"].get("mean_accepted_length")
        tauc = (result.get("k7c") or {}).get("mean_accepted_length")
        extra = f"\nconfidence-scheduled: {tauc:.2f} on the steps it verified" if tauc else ""
        ax2.set_title(f"Per-position acceptance, batch 1 (tau = {tau:.2f}){extra}")
        ax2.set_xlabel("draft position k")
        ax2.set_ylabel("P(k accepted | 1..k-1 accepted)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # unwind: the finally blocks stop the services


def main(args) -> int:
    import signal

    from dspark.shared.config import default_model_dir

    signal.signal(signal.SIGTERM, _interrupt)
    from dspark.worker.convert import prepare_default_model

    model_dir = prepare_default_model()
    prompts = load_eval_prompts(max(32, args.num_prompts))
    dtype = _resolved_dtype(args.dtype)
    args.dtype = dtype
    if args.attention == "auto":  # what the workers will resolve it to
        from dspark.worker.model import native_attention

        args.attention = "native" if native_attention.load(build=True) is not None else "torch"
    if args.linear == "auto":
        import torch

        from dspark.worker.model import native_linear

        args.linear = "native" if native_linear.resolve(
            "auto", torch.device("cpu"), getattr(torch, dtype)) is not None else "torch"
    mdir = Path(model_dir or default_model_dir())
    if args.gguf_weights == "auto":  # what the workers will resolve it to
        args.gguf_weights = "on" if dtype == "float32" and args.linear == "native" and \
            gguf_blocks_file(mdir) is not None else "off"
    log_dir = Path(tempfile.mkdtemp(prefix="dspark-bench-"))
    print(f"bench: {dtype}, {args.attention} attention, {args.linear} linear"
          f"{' from GGUF blocks' if args.gguf_weights == 'on' else ''}, "
          f"{args.max_tokens} new tokens per "
          f"request, logs in {log_dir}", file=sys.stderr)
    hf = HFBaseline(mdir, dtype)
    services = bench_services(prompts, args, log_dir, hf)
    hf_rate = services.pop("hf_batch1_tokens_per_s")
    bw = read_bandwidth_gbs()
    k0, k7, k7c = services["k0"], services.get("k7"), services.get("k7c")
    read_bytes = weight_bytes_read(mdir, hf.weight_bytes, args.gguf_weights == "on")
    frac = read_bytes * k0["batch1_tokens_per_s"] / (bw * 1e9)
    result = {
        "dtype": dtype, "attention": args.attention, "linear": args.linear,
        "max_tokens": args.max_tokens,
        "k0": k0,
        "transformers": {"batch1_tokens_per_s": hf_rate},
        "speedup_vs_transformers_batch1": k0["batch1_tokens_per_s"] / hf_rate,
        "bandwidth_fraction": frac,
        "read_bandwidth_gb_s": bw,
        "weight_bytes": hf.weight_bytes,
        "gguf_weights": args.gguf_weights,
        "weight_bytes_read": read_bytes,
    }
    print(f"\n{'':34s}{'tokens/s':>10s}")
    print(f"{'transformers generate(), batch 1':34s}{hf_rate:10.1f}")
    names = (("K=0", k0), ("K=7", k7), ("K=7c", k7c))
    for name, r in names:
        if r is None:
            continue
        print(f"{'dspark ' + name + ', batch 1':34s}{r['batch1_tokens_per_s']:10.1f}"
              f"   ({r['batch1_tokens_per_s'] / hf_rate:.2f}x transformers)")
        print(f"{'dspark ' + name + ', concurrency 8':34s}{r['conc8_tokens_per_s']:10.1f}")
        print(f"{'dspark ' + name + ', concurrency 32':34s}{r['conc32_tokens_per_s']:10.1f}")
        print(f"  TTFT {r['ttft_ms']:.1f} ms, ITL {r['itl_ms']:.1f} ms (batch 1, median)")
    if k7 is not None:
        result["k7"] = k7
        result["k7_vs_k0"] = {f: k7[f] / k0[f] for f in
                              ("batch1_tokens_per_s", "conc8_tokens_per_s", "conc32_tokens_per_s")}
        r = result["k7_vs_k0"]
        print(f"K=7 / K=0: batch 1 {r['batch1_tokens_per_s']:.2f}x, concurrency 8 "
              f"{r['conc8_tokens_per_s']:.2f}x, concurrency 32 {r['conc32_tokens_per_s']:.2f}x")
        print(f"K=7 mean accepted length {k7['mean_accepted_length']:.2f}, per position "
              + " ".join(f"{a:.2f}" for a in k7["per_position_acceptance"]))
    if k7c is not None:
        result["k7c"] = k7c
        result["k7c_vs_k0"] = {f: k7c[f] / k0[f] for f in
                               ("batch1_tokens_per_s", "conc8_tokens_per_s",
                                "conc32_tokens_per_s")}
        r = result["k7c_vs_k0"]
        print(f"K=7c / K=0: batch 1 {r['batch1_tokens_per_s']:.2f}x, concurrency 8 "
              f"{r['conc8_tokens_per_s']:.2f}x, concurrency 32 {r['conc32_tokens_per_s']:.2f}x")
        tau = k7c["mean_accepted_length"]
        print("K=7c (confidence-scheduled) batch 1: "
              + (f"mean accepted length {tau:.2f} per verify step, " if tau else "")
              + f"{k7c.get('unverified_steps', 0)} steps without drafts"
              + "".join(f"; concurrency {c}: {k7c.get(f'conc{c}_tokens_per_step', 1.0):.2f} "
                        f"tokens per step, {k7c.get(f'conc{c}_unverified_steps', 0)} without "
                        "drafts" for c in (8, 32)))
    print(f"bandwidth (K=0): {frac:.1%} of {bw:.1f} GB/s measured read bandwidth "
          f"({read_bytes / 1e6:.0f} MB weights read per token"
          + (f", GGUF blocks; {hf.weight_bytes / 1e6:.0f} MB dense)" if read_bytes !=
             hf.weight_bytes else ")"))
    for name, r in names:
        if r is not None:
            print(f"worker peak RSS ({name}): {r['worker_peak_rss_mib']:.0f} MiB")
            if "memory_check" in r:
                print(f"32 concurrent ~2k-token requests ({name}): worker peak RSS "
                      f"{r['memory_check']['worker_peak_rss_mib']:.0f} MiB")
    if args.json:
        p = Path(args.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(result, indent=2))
        png = Path(args.plot) if args.plot else p.with_suffix(".png")
        if plot(result, png):
            print(f"wrote {p} and {png}")
        else:
            print(f"wrote {p} (no matplotlib: no plot)")
    return 0
