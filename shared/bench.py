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
    times, n = [], 0
    for ch in client.stream(messages=[{"role": "user", "content": prompt}],
                            max_tokens=max_tokens, temperature=0, ignore_eos=True):
        if ch.token_ids:
            times.append(time.perf_counter())
            n += len(ch.token_ids)
    ttft = times[0] - t0
    decode_s = times[-1] - times[0]
    return {"ttft_s": ttft, "tokens": n, "decode_s": decode_s, "wall_s": times[-1] - t0,
            "itl_s": decode_s / max(1, n - 1)}


def run_concurrent(client, prompts: list[str], conc: int, max_tokens: int) -> dict:
    jobs = [prompts[i % len(prompts)] for i in range(conc)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        res = list(pool.map(lambda p: _one_stream(client, p, max_tokens), jobs))
    wall = time.perf_counter() - t0
    return {"tokens_per_s": sum(r["tokens"] for r in res) / wall,
            "ttft_ms": 1000 * statistics.median(r["ttft_s"] for r in res),
            "itl_ms": 1000 * statistics.median(r["itl_s"] for r in res)}


def rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_services(prompts, args, log_dir: Path, hf: "HFBaseline") -> dict:
    """Start the services, measure them, stop them. Batch 1 is measured paired
    with transformers: prompt by prompt, one run of each, so that both see the
    same machine (these shared machines drift by 20-30% over minutes)."""
    from dspark.shared.client import Client
    from dspark.shared.launcher import start_cluster

    c = start_cluster(worker_args=["--dtype", args.dtype], log_dir=log_dir,
                      router_port=args.port, base_port=args.port + 1, timeout_s=600)
    try:
        worker_pid = dict(c.procs)["worker-0"].pid
        with Client(c.router, timeout=900) as client:
            _one_stream(client, prompts[0], 8)  # warm-up
            hf.decode_rate(prompts[0], 8)
            b1, hf_rates = [], []
            for p in prompts[: args.batch1_prompts]:
                b1.append(_one_stream(client, p, args.max_tokens))
                hf_rates.append(hf.decode_rate(p, args.max_tokens))
            res = {
                "batch1_tokens_per_s": sum(r["tokens"] - 1 for r in b1) / sum(r["decode_s"] for r in b1),
                "ttft_ms": 1000 * statistics.median(r["ttft_s"] for r in b1),
                "itl_ms": 1000 * statistics.median(r["itl_s"] for r in b1),
                "hf_batch1_tokens_per_s": len(hf_rates) / sum(1 / r for r in hf_rates),
            }
            print(f"  batch 1: {res['batch1_tokens_per_s']:.1f} tok/s "
                  f"(transformers {res['hf_batch1_tokens_per_s']:.1f})", file=sys.stderr)
            for conc in (8, 32):
                r = run_concurrent(client, prompts, conc, args.max_tokens)
                res[f"conc{conc}_tokens_per_s"] = r["tokens_per_s"]
                res[f"conc{conc}_ttft_ms"] = r["ttft_ms"]
                res[f"conc{conc}_itl_ms"] = r["itl_ms"]
                print(f"  concurrency {conc}: {r['tokens_per_s']:.1f} tok/s", file=sys.stderr)
            res["worker_peak_rss_mib"] = rss_peak_mib(worker_pid)
            if args.memory_check:
                long_prompt = " ".join(load_eval_prompts(40))[:9000]
                r = run_concurrent(client, [long_prompt], 32, 16)
                res["memory_check"] = {"requests": 32, "prompt_chars": len(long_prompt),
                                       "tokens_per_s": r["tokens_per_s"],
                                       "worker_peak_rss_mib": rss_peak_mib(worker_pid)}
        return res
    finally:
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
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("k0", "DSpark services, K=0"),):
        r = result[key]
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
    log_dir = Path(tempfile.mkdtemp(prefix="dspark-bench-"))
    print(f"bench: {dtype}, {args.max_tokens} new tokens per request, logs in {log_dir}",
          file=sys.stderr)
    hf = HFBaseline(Path(model_dir or default_model_dir()), dtype)
    services = bench_services(prompts, args, log_dir, hf)
    hf_rate = services.pop("hf_batch1_tokens_per_s")
    bw = read_bandwidth_gbs()
    frac = hf.weight_bytes * services["batch1_tokens_per_s"] / (bw * 1e9)
    result = {
        "dtype": dtype, "max_tokens": args.max_tokens,
        "k0": services,
        "transformers": {"batch1_tokens_per_s": hf_rate},
        "speedup_vs_transformers_batch1": services["batch1_tokens_per_s"] / hf_rate,
        "bandwidth_fraction": frac,
        "read_bandwidth_gb_s": bw,
        "weight_bytes": hf.weight_bytes,
    }
    k0 = services
    print(f"\n{'':34s}{'tokens/s':>10s}")
    print(f"{'transformers generate(), batch 1':34s}{hf_rate:10.1f}")
    print(f"{'dspark K=0, batch 1':34s}{k0['batch1_tokens_per_s']:10.1f}"
          f"   ({result['speedup_vs_transformers_batch1']:.2f}x transformers)")
    print(f"{'dspark K=0, concurrency 8':34s}{k0['conc8_tokens_per_s']:10.1f}")
    print(f"{'dspark K=0, concurrency 32':34s}{k0['conc32_tokens_per_s']:10.1f}")
    print(f"TTFT {k0['ttft_ms']:.1f} ms, ITL {k0['itl_ms']:.1f} ms (batch 1, median)")
    print(f"bandwidth: {frac:.1%} of {bw:.1f} GB/s measured read bandwidth "
          f"({hf.weight_bytes / 1e6:.0f} MB weights per token)")
    print(f"worker peak RSS: {k0['worker_peak_rss_mib']:.0f} MiB")
    if "memory_check" in k0:
        print(f"32 concurrent ~2k-token requests: worker peak RSS "
              f"{k0['memory_check']['worker_peak_rss_mib']:.0f} MiB")
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
