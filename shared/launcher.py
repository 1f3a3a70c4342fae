"""`dspark serve`: start workers, schedulers and the router as separate
processes on loopback, wait until the router is ready, print the endpoints,
and stop everything cleanly on Ctrl-C / SIGTERM."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass
class Cluster:
    """A set of service processes started together."""

    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    router: str = ""
    schedulers: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)

    def stop(self, timeout_s: float = 40.0) -> None:
        """SIGTERM in dependency order (router first), then wait (long enough for
        the default 30 s drain), then kill."""
        for _, p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    log_dir: Path | None = None
    tls: object = None  # dspark.shared.security.ClientTLS used to reach the services
    api_key: str | None = None
    http: str = ""  # host:port of the router's HTTP API ("" = off)
    metrics: dict = field(default_factory=dict)  # process name -> host:port of /metrics

    def proc(self, name: str) -> subprocess.Popen:
        """The process called ``name`` (router, scheduler-0, worker-1, ...)."""
        return dict(self.procs)[name]

    def check_alive(self) -> None:
        for name, p in self.procs:
            if p.poll() is not None:
                hint = ""
                if self.log_dir is not None and (self.log_dir / f"{name}.log").is_file():
                    tail = (self.log_dir / f"{name}.log").read_text(errors="replace").strip()
                    hint = "; last log lines:\n" + "\n".join(tail.splitlines()[-5:])
                raise RuntimeError(f"{name} exited with code {p.returncode}{hint}")


def wait_ready(address: str, service: str, timeout_s: float, cluster: Cluster | None = None,
               tls=None) -> None:
    """Poll grpc.health.v1 readiness of `service` at `address` (TLS: a ClientTLS)."""
    from dspark.shared.security import sync_channel

    deadline = time.monotonic() + timeout_s
    with sync_channel(address, tls) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if cluster is not None:
                cluster.check_alive()
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"{service} at {address} not ready after {timeout_s:.0f}s")


def _router_replicas(address: str, tls=None, api_key: str | None = None) -> int:
    from dspark.shared.security import sync_channel
    from dspark.v1 import router_pb2, router_pb2_grpc

    md = (("authorization", f"Bearer {api_key}"),) if api_key else None
    with sync_channel(address, tls) as ch:
        models = router_pb2_grpc.RouterStub(ch).ListModels(router_pb2.ListModelsRequest(),
                                                           timeout=5, metadata=md)
    return max((m.num_replicas for m in models.models), default=0)


def _spawn(name: str, argv: list[str], log_dir: Path | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dspark.shared.cli", *argv]
    out = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        out = open(log_dir / f"{name}.log", "ab")
    # Own process group: Ctrl-C in the terminal reaches us, and we stop the
    # children in order instead of all at once.
    return subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)


def start_cluster(*, replicas: int = 1, host: str = "127.0.0.1", router_port: int = 50051,
                  base_port: int = 50052, worker_args: list[str] = (),
                  scheduler_args: list[str] = (), router_args: list[str] = (),
                  log_dir: Path | None = None, log_level: str = "INFO",
                  timeout_s: float = 600.0, tls=None, api_key: str | None = None,
                  http_port: int = 0, metrics_base_port: int = 0) -> Cluster:
    """Start `replicas` worker+scheduler pairs and one router; return when the
    router is ready (or raise, after stopping what was started).

    ``tls`` (a ClientTLS) and ``api_key`` are what the readiness checks use
    when the services were told (through the *_args) to require them;
    ``http_port`` > 0 starts the router's OpenAI-compatible HTTP API;
    ``metrics_base_port`` > 0 gives every process a metrics port from it
    (router first, then scheduler-i, worker-i)."""
    c = Cluster(router=f"{host}:{router_port}", log_dir=log_dir, tls=tls, api_key=api_key,
                http=f"{host}:{http_port}" if http_port else "")
    if http_port:
        router_args = [*router_args, "--http-port", str(http_port)]

    def metrics_flag(name: str, k: int) -> list[str]:
        if not metrics_base_port:
            return []
        c.metrics[name] = f"{host}:{metrics_base_port + k}"
        return ["--metrics-port", str(metrics_base_port + k)]

    try:
        for i in range(replicas):
            wport, sport = base_port + 2 * i + 1, base_port + 2 * i
            waddr, saddr = f"{host}:{wport}", f"{host}:{sport}"
            c.procs.append((f"worker-{i}", _spawn(f"worker-{i}", [
                "worker", "--host", host, "--port", str(wport), "--log-level", log_level,
                *metrics_flag(f"worker-{i}", 2 + 2 * i), *worker_args], log_dir)))
            c.procs.append((f"scheduler-{i}", _spawn(f"scheduler-{i}", [
                "scheduler", "--host", host, "--port", str(sport), "--worker", waddr,
                "--log-level", log_level, *metrics_flag(f"scheduler-{i}", 1 + 2 * i),
                *scheduler_args], log_dir)))
            c.workers.append(waddr)
            c.schedulers.append(saddr)
        c.procs.insert(0, ("router", _spawn("router", [
            "router", "--host", host, "--port", str(router_port), "--schedulers", *c.schedulers,
            "--log-level", log_level, *metrics_flag("router", 0), *router_args], log_dir)))
        # Every replica ready (not just the first), then the router.
        for addr in c.schedulers:
            wait_ready(addr, "dspark.v1.Scheduler", timeout_s, c, tls=tls)
        wait_ready(c.router, "dspark.v1.Router", timeout_s, c, tls=tls)
        for _ in range(50):  # the router has seen every replica
            if _router_replicas(c.router, tls, api_key) >= replicas:
                break
            time.sleep(0.1)
        return c
    except BaseException:
        c.stop()
        raise


def colocated_async_default(device: str, num_speculative_tokens: int | None = None) -> bool:
    """Async scheduling for a scheduler on the same machine as its worker.

    Async dispatch overlaps the scheduler's per-step work with the worker's
    forward. A CPU worker computes on every core, so on one machine that
    overlap takes a core from the forward (its OpenMP team then waits at each
    barrier): on the 2-core VM, 8 concurrent requests of the confidence-scheduled
    K = 7 deployment ran at 125.5 tok/s async against 150.2 sync (later, on the
    2-core AVX2 VM: 155.6 against 162.1, and 67.5 against 67.6 at batch 1). So
    `dspark serve` and `dspark bench` schedule a speculating CPU worker
    synchronously unless told otherwise (--async-scheduling). A K = 0 worker
    (``num_speculative_tokens`` 0) is scheduled asynchronously: its steps' work
    in the scheduler is light, and without pipelining each step waits a round
    trip (2-core AVX2 VM: 63.2 tok/s async against 55.7 at batch 1, 165.2
    against 143.8 at 8 concurrent). A GPU/NPU worker, or a scheduler on its own
    machine (`dspark scheduler`, Kubernetes), keeps async, the config's
    default. Output is identical either way."""
    return device != "cpu" or num_speculative_tokens == 0


def _spec_tokens(text: str | None) -> int | None:
    """K of an explicit speculative config; None for "auto" / unset / invalid (the
    worker reports an invalid one)."""
    from dspark.shared.config import parse_speculative_config

    if not text or text == "auto":
        return None
    try:
        return parse_speculative_config(text)[0]
    except ValueError:
        return None


def worker_flags(args) -> list[str]:
    """The `dspark worker` flags for the WorkerConfig options given to `serve`."""
    from dspark.shared.config import WorkerConfig

    from dspark.shared.config import OPS_FIELDS

    flags: list[str] = []
    for f in WorkerConfig.__dataclass_fields__:
        v = getattr(args, f, None)
        if v is None or f in ("host", "port") or f in OPS_FIELDS:
            continue
        flag = "--" + f.replace("_", "-")
        if isinstance(v, (list, tuple)):
            flags += [flag, *map(str, v)]
        elif isinstance(v, bool):
            flags += [flag if v else "--no-" + f.replace("_", "-")]
        else:
            flags += [flag, str(v)]
    return flags


def serve_all(args) -> int:
    """The body of `dspark serve`."""
    wargs = worker_flags(args)
    sargs: list[str] = []
    drain = getattr(args, "drain_timeout", None)
    if drain is not None:
        wargs += ["--drain-timeout", str(drain)]
        sargs += ["--drain-timeout", str(drain)]
    if args.max_num_seqs is not None:
        sargs += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.max_num_batched_tokens is not None:
        sargs += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    async_ = getattr(args, "async_scheduling", None)
    if async_ is None:
        async_ = colocated_async_default(getattr(args, "device", None) or "cpu",
                                         _spec_tokens(getattr(args, "speculative_config", None)))
    sargs += ["--async-scheduling" if async_ else "--no-async-scheduling"]
    # Prepare the default model once here, not in each worker.
    if not getattr(args, "model", None):
        from dspark.worker.convert import prepare_default_model

        prepare_default_model()
    log_dir = Path(args.log_dir) if args.log_dir else None
    print(f"starting {args.replicas} worker(s), scheduler(s) and the router ...", file=sys.stderr)
    stop = {"flag": False}

    def _on_signal(signum, frame):
        stop["flag"] = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        cluster = start_cluster(replicas=args.replicas, host=args.host,
                                router_port=args.router_port, base_port=args.base_port,
                                worker_args=wargs, scheduler_args=sargs,
                                # the router tokenizes with the same model directory
                                router_args=(["--model", args.model] if args.model else [])
                                + (["--drain-timeout", str(drain)] if drain is not None else []),
                                log_dir=log_dir,
                                log_level=args.log_level,
                                http_port=getattr(args, "http_port", 0) or 0,
                                metrics_base_port=getattr(args, "metrics_port", 0) or 0)
    except (RuntimeError, TimeoutError) as e:
        print(f"dspark serve: {e}", file=sys.stderr)
        return 1
    print("\nDSpark is serving.", flush=True)
    print(f"  router (public gRPC API): {cluster.router}")
    if cluster.http:
        print(f"  OpenAI-compatible HTTP API: http://{cluster.http}/v1")
    for name, addr in cluster.metrics.items():
        print(f"  metrics ({name}): http://{addr}/metrics")
    for s, w in zip(cluster.schedulers, cluster.workers):
        print(f"  scheduler: {s}   worker: {w}")
    print(f'\nTry:  dspark generate --prompt "What is speculative decoding?" --chat '
          f'--router {cluster.router}')
    print("Stop: Ctrl-C\n", flush=True)
    try:
        while not stop["flag"]:
            cluster.check_alive()
            time.sleep(0.5)
    except RuntimeError as e:
        print(f"dspark serve: {e}; stopping", file=sys.stderr)
    finally:
        print("stopping ...", file=sys.stderr)
        cluster.stop()
        print("stopped", file=sys.stderr)
    return 0
