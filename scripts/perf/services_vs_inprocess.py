"""What the services cost over the engine alone: K = 0, N concurrent eval prompts.

    .venv/bin/python scripts/perf/services_vs_inprocess.py [CONC] [ROUNDS]

Starts one K = 0 deployment as `dspark serve` runs it (worker, scheduler with
sync scheduling, router; gRPC on loopback) and, in this process, the same
scheduler core driving a K = 0 runner (`OfflineEngine`, no gRPC). Alternating
rounds of CONC requests (the first CONC eval prompts, round robin over the
sets, 256 greedy tokens each, `ignore_eos`) go through each; prints both
rates, their ratio, and how much CPU each service process and this client
used during the services' rounds. Not a test; the machine's noise applies
(compare within one run, on an idle machine).
"""
from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from dspark.router.tokenizer import Tokenizer
from dspark.shared.bench import _one_stream, concurrent_round, load_eval_prompts, pool_rounds
from dspark.shared.client import Client
from dspark.shared.config import WorkerConfig
from dspark.shared.launcher import start_cluster
from dspark.shared.types import SamplingParams
from dspark.worker.bench_spec import run_round
from dspark.worker.convert import prepare_default_model
from dspark.worker.runner import ModelRunner
from dspark.worker.training.engine import OfflineEngine

K0 = '{"method": "dspark", "num_speculative_tokens": 0}'
MAX_TOKENS = 256


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main() -> None:
    conc = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    model = prepare_default_model()
    prompts = load_eval_prompts(conc)
    tok = Tokenizer.from_dir(model)
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
           for p in prompts]
    cluster = start_cluster(worker_args=["--speculative-config", K0],
                            scheduler_args=["--no-async-scheduling"],
                            log_dir=Path(tempfile.mkdtemp(prefix="dspark-svc-")),
                            router_port=23300, base_port=23301, timeout_s=600)
    client = Client(cluster.router, timeout=900)
    try:
        runner = ModelRunner(WorkerConfig(model=str(model), num_kv_blocks=max(256, 48 * conc),
                                          speculative_config=K0))
        runner.warmup()
        engine = OfflineEngine(runner, max_num_seqs=conc)
        sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        _one_stream(client, prompts[0], 8)  # warm
        procs = dict(cluster.procs)
        cpu = {name: 0.0 for name in [*procs, "client"]}
        svc, inproc, svc_wall = [], [], 0.0
        for rd in range(rounds):
            before = {n: cpu_seconds(p.pid) for n, p in procs.items()}
            before["client"] = self_cpu()
            t0 = time.perf_counter()
            svc.append(concurrent_round(client, prompts, conc, MAX_TOKENS))
            svc_wall += time.perf_counter() - t0
            for n, p in procs.items():
                cpu[n] += cpu_seconds(p.pid) - before[n]
            cpu["client"] += self_cpu() - before["client"]
            n_tok, secs = run_round(engine, [(f"{rd}-{i}", ids[i]) for i in range(conc)],
                                    sampling)
            inproc.append(n_tok / secs)
            print(f"round {rd}: services {pool_rounds([svc[-1]])['tokens_per_s']:.1f} tok/s, "
                  f"in process {inproc[-1]:.1f} tok/s", flush=True)
        s, i = pool_rounds(svc)["tokens_per_s"], sum(inproc) / len(inproc)
        print(f"{conc} concurrent, {rounds} rounds, torch threads {torch.get_num_threads()}: "
              f"services {s:.1f} tok/s, in process {i:.1f} tok/s, ratio {s / i:.3f}")
        print("CPU during the services' rounds (cores): " + ", ".join(
            f"{n} {c / svc_wall:.2f}" for n, c in cpu.items()))
    finally:
        client.close()
        cluster.stop()


if __name__ == "__main__":
    main()
