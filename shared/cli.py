"""The `dspark` command line: serve, generate, model prepare, the three
services one by one, and bench."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import typing

from dspark.shared.config import (
    DEFAULT_HOST,
    DEFAULT_ROUTER_PORT,
    OPS_FIELDS,
    RouterConfig,
    SchedulerConfig,
    WorkerConfig,
)


# --- dataclass <-> argparse ---------------------------------------------------

def add_config_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One --flag per field of a config dataclass (help from the default)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        tp = hints[f.name]
        if isinstance(default, tuple):
            item = int if default and isinstance(default[0], int) else str
            if "int" in str(tp):
                item = int
            parser.add_argument(flag, dest=f.name, nargs="+", type=item, default=None,
                                help=f"(default: {' '.join(map(str, default)) or 'none'})")
        elif isinstance(default, bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=f"(default: {default})")
        else:
            parser.add_argument(flag, dest=f.name, type=type(default), default=None,
                                help=f"(default: {default!r})")


def config_from_args(cls, args: argparse.Namespace, **overrides):
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
          if getattr(args, f.name, None) is not None}
    kw.update(overrides)
    return cls(**kw)


# --- subcommands --------------------------------------------------------------

def _run_async(coro) -> int:
    """Run a service; a start-up failure (bad device, bad checkpoint, port in
    use) is one clear line and exit code 1, not a traceback."""
    from dspark.shared.errors import DSparkError

    try:
        asyncio.run(coro)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, ValueError, OSError, DSparkError) as e:
        print(f"dspark: error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_worker(args) -> int:
    from dspark.shared.logging import configure
    from dspark.worker.servicer import serve

    config = config_from_args(WorkerConfig, args)  # validate before anything starts
    configure("worker", args.log_level)
    return _run_async(serve(config))


def cmd_scheduler(args) -> int:
    from dspark.scheduler.servicer import serve
    from dspark.shared.logging import configure

    config = config_from_args(SchedulerConfig, args)  # validate before anything starts
    configure("scheduler", args.log_level)
    return _run_async(serve(config))


def cmd_router(args) -> int:
    from dspark.router.servicer import serve
    from dspark.shared.logging import configure

    config = config_from_args(RouterConfig, args)  # validate before anything starts
    configure("router", args.log_level)
    return _run_async(serve(config))


def cmd_model_prepare(args) -> int:
    from dspark.worker.convert import prepare_default_model

    path = prepare_default_model(args.dest)
    print(path)
    return 0


def cmd_serve(args) -> int:
    from dspark.shared.launcher import serve_all

    return serve_all(args)


def cmd_health(args) -> int:
    """Exit 0 when `service` at `address` reports SERVING (compose / exec probes)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dspark.shared.security import ClientTLS, sync_channel

    tls = None
    if args.tls_ca or args.tls:
        tls = ClientTLS(args.tls_ca, args.tls_client_cert, args.tls_client_key)
    options = ([("grpc.ssl_target_name_override", args.tls_server_name)]
               if args.tls_server_name else None)
    try:
        with sync_channel(args.address, tls, options=options) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
    except grpc.RpcError as e:
        print(f"{args.address} {args.service or '(liveness)'}: {e.code().name}: {e.details()}",
              file=sys.stderr)
        return 1
    except ValueError as e:  # unreadable certificate files
        print(f"dspark health: error: {e}", file=sys.stderr)
        return 2
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    print(f"{args.address} {args.service or '(liveness)'}: {name}")
    return 0 if r.status == health_pb2.HealthCheckResponse.SERVING else 1


def cmd_generate(args) -> int:
    import os

    from dspark.shared.client import Client
    from dspark.shared.errors import DSparkError

    messages = [{"role": "user", "content": args.prompt}] if args.chat else None
    try:
        with Client(args.router, timeout=args.timeout, api_key=os.environ.get("DSPARK_API_KEY"),
                    tls_root_cert=args.tls_ca or None, tls=bool(args.tls_ca)) as client:
            stream = client.stream(
                prompt=None if args.chat else args.prompt, messages=messages,
                max_tokens=args.max_tokens, temperature=args.temperature,
                top_p=args.top_p, top_k=args.top_k, seed=args.seed, model=args.model)
            for chunk in stream:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
    except DSparkError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


def _datasets_dir():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"


def cmd_gen_drafter_data(args) -> int:
    from dspark.worker.training.selfgen import main as selfgen_main

    return selfgen_main(args)


def cmd_bench(args) -> int:
    from dspark.shared.bench import main as bench_main

    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dspark", description="DSpark speculative decoding server")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="start router + scheduler + worker on loopback")
    add_config_args(s, WorkerConfig, skip=("host", "port", *OPS_FIELDS))
    s.add_argument("--http-port", type=int, default=8000,
                   help="OpenAI-compatible HTTP API port of the router; 0 = off (default 8000)")
    s.add_argument("--metrics-port", type=int, default=0,
                   help="first metrics port: router, then scheduler-i and worker-i in turn; "
                        "0 = off (default)")
    s.add_argument("--drain-timeout", type=float, default=None,
                   help="seconds each service lets in-flight work finish after SIGTERM")
    s.add_argument("--replicas", type=int, default=1, help="scheduler+worker pairs (default 1)")
    s.add_argument("--router-port", type=int, default=DEFAULT_ROUTER_PORT)
    s.add_argument("--base-port", type=int, default=DEFAULT_ROUTER_PORT + 1,
                   help="first port for schedulers and workers (default 50052)")
    s.add_argument("--host", default=DEFAULT_HOST)
    s.add_argument("--max-num-seqs", type=int, default=None)
    s.add_argument("--max-num-batched-tokens", type=int, default=None)
    s.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="dispatch step N+1 before step N returns (speculation: position "
                        "correction); output is identical to sync scheduling (default: on "
                        "for a GPU/NPU worker, off for a CPU worker, which shares this "
                        "machine's cores with the scheduler)")
    s.add_argument("--log-dir", default=None, help="write each service's log to a file here")
    s.add_argument("--log-level", default="INFO")
    s.set_defaults(fn=cmd_serve)

    g = sub.add_parser("generate", help="send one prompt to a running router, print the text")
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user chat message")
    g.add_argument("--max-tokens", type=int, default=None)
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--model", default="")
    g.add_argument("--router", default=f"{DEFAULT_HOST}:{DEFAULT_ROUTER_PORT}")
    g.add_argument("--timeout", type=float, default=None, help="seconds")
    g.add_argument("--tls-ca", default="", help="CA certificate of a TLS router (PEM)")
    g.set_defaults(fn=cmd_generate)
    g.epilog = "The API key, when the router requires one, is read from $DSPARK_API_KEY."

    h = sub.add_parser("health", help="check a service's gRPC health (exit 0 = SERVING)")
    h.add_argument("--address", required=True, help="host:port")
    h.add_argument("--service", default="",
                   help='dspark.v1.Router | dspark.v1.Scheduler | dspark.v1.Worker; "" = liveness')
    h.add_argument("--timeout", type=float, default=3.0)
    h.add_argument("--tls", action="store_true", help="TLS with the system's roots")
    h.add_argument("--tls-ca", default="")
    h.add_argument("--tls-client-cert", default="")
    h.add_argument("--tls-client-key", default="")
    h.add_argument("--tls-server-name", default="",
                   help="name to check the server certificate against (default: the host)")
    h.set_defaults(fn=cmd_health)

    m = sub.add_parser("model", help="model management")
    msub = m.add_subparsers(dest="model_cmd", required=True)
    mp = msub.add_parser("prepare", help="convert the default model (offline, idempotent)")
    mp.add_argument("--dest", default=None, help="output directory (default: the cache)")
    mp.set_defaults(fn=cmd_model_prepare)

    for name, cls, fn in (("worker", WorkerConfig, cmd_worker),
                          ("scheduler", SchedulerConfig, cmd_scheduler),
                          ("router", RouterConfig, cmd_router)):
        sp = sub.add_parser(name, help=f"run the {name} service alone")
        add_config_args(sp, cls)
        sp.add_argument("--log-level", default="INFO")
        sp.set_defaults(fn=fn)

    d = sub.add_parser("gen-drafter-data",
                       help="generate the target's own answers to the training prompts")
    d.add_argument("--prompts", default=str(_datasets_dir() / "train"),
                   help="folder of *.jsonl prompt files (default: ../shared/datasets/train)")
    d.add_argument("--out", default="data/selfgen", help="output folder (a subfolder per model)")
    d.add_argument("--model", default="")
    d.add_argument("--dtype", default="auto")
    d.add_argument("--device", default="cpu")
    d.add_argument("--max-tokens", type=int, default=256)
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--temperature", type=float, default=0.0)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--time-budget-min", type=float, default=0.0,
                   help="stop after M minutes: answers still running are kept cut short "
                        "(finish DEADLINE), queued prompts are left for the next run "
                        "(0 = no limit)")
    d.add_argument("--limit", type=int, default=0, help="at most this many new prompts")
    d.set_defaults(fn=cmd_gen_drafter_data)

    from dspark.worker.training.cli import add_export_parser
    from dspark.worker.training.cli import add_parser as add_train_parser

    add_train_parser(sub)
    add_export_parser(sub)
    from dspark.worker.training.evaluate import add_parser as add_eval_parser

    add_eval_parser(sub, _datasets_dir())
    from dspark.worker.training.probe_taps import add_parser as add_probe_parser

    add_probe_parser(sub)
    from dspark.worker.training.calibrate import add_parser as add_calibrate_parser

    add_calibrate_parser(sub)

    b = sub.add_parser("bench", help="benchmark against transformers generate()")
    b.add_argument("--json", default=None, help="write the results here")
    b.add_argument("--num-prompts", type=int, default=8)
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--dtype", default="auto")
    b.add_argument("--plot", default=None, help="PNG path (default: beside the JSON)")
    b.add_argument("--batch1-prompts", type=int, default=6, help="prompts timed at batch 1")
    b.add_argument("--port", type=int, default=50151, help="first port the bench may use")
    b.add_argument("--k", type=int, default=7,
                   help="speculative tokens of the second deployment (0 = K=0 only)")
    b.add_argument("--drafter", default="", help="drafter checkpoint (default: the shipped one)")
    b.add_argument("--rounds", type=int, default=2,
                   help="concurrency rounds per deployment, alternating between them")
    b.add_argument("--attention", default="auto", choices=("auto", "native", "torch"),
                   help="the workers' short-window attention (default: native where built)")
    b.add_argument("--linear", default="auto", choices=("auto", "native", "torch"),
                   help="the workers' CPU linear layers, fp32 or bf16 on AVX512-BF16 "
                        "(default: native where built)")
    b.add_argument("--gguf-weights", default="auto", choices=("auto", "on", "off"),
                   help="the workers' fp32 linear from the model's GGUF blocks (default: "
                        "where the native fp32 linear runs and the model has them)")
    b.add_argument("--memory-check", action=argparse.BooleanOptionalAction, default=True,
                   help="also run 32 concurrent ~2k-token requests and report peak RSS")
    b.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args) or 0
    except ValueError as e:  # config validation
        print(f"dspark {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
