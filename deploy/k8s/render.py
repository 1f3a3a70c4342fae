#!/usr/bin/env python3
"""Render the Kubernetes manifests of a DSpark deployment.

    python deploy/k8s/render.py > deploy/k8s/dspark.yaml            # 2 replicas, CPU
    python deploy/k8s/render.py --replicas 4 > dspark-4.yaml        # scale out
    python deploy/k8s/render.py --accelerator nvidia.com/gpu --image REG/dspark-serve:cuda
    python deploy/k8s/render.py --tls-secret dspark-tls --api-keys-secret dspark-api-keys

What it writes (see the README section "Kubernetes"):
- ConfigMap ``dspark-config``: the tunables every service reads (through
  ``$(VAR)`` expansion in the container args), the drain timeout included;
- router: Deployment (2 pods) + Service (gRPC 50051, HTTP 8000, metrics 9090)
  + PodDisruptionBudget (at least one router up during voluntary disruptions);
- per model replica i: a worker Deployment + Service ``dspark-worker-i`` and a
  scheduler Deployment + Service ``dspark-scheduler-i`` (one pod each,
  ``Recreate``: two schedulers must never share one worker's KV blocks).

Probes are Kubernetes' native gRPC probes against ``grpc.health.v1``: a
startup probe on the readiness service name, long enough for model loading
(``--startup-timeout``), then liveness on "" and readiness on the service
name. ``preStop`` sleeps while endpoints drop the pod, then SIGTERM starts the
drain; ``terminationGracePeriodSeconds`` = preStop + drain timeout + margin.

With ``--tls-secret`` (a Secret holding ``ca.crt``, ``tls.crt``, ``tls.key``,
as cert-manager writes them) every hop uses TLS, mutual between router,
scheduler and worker, and the HTTP API and metrics are served over TLS (the
schedulers' and workers' metrics ports are mutual too: scrape them with a
certificate of the CA). The certificate must name every Service it is
reached by: dspark-router, dspark-scheduler-i, dspark-worker-i (subject
alternative names). The kubelet's gRPC probes cannot speak TLS, so the
probes become exec probes running ``dspark health`` with the same
certificates. ``--api-keys-secret`` mounts a Secret with ``api-keys.txt``
on the router and requires the keys.

Only the standard library and PyYAML.
"""
from __future__ import annotations

import argparse
import sys

import yaml

NAME = "dspark"
PORTS = {"router": 50051, "scheduler": 50052, "worker": 50053}
HTTP_PORT = 8000
METRICS_PORT = 9090
PRESTOP_SLEEP_S = 5
GRACE_MARGIN_S = 10
CONFIG = "dspark-config"
TLS_DIR = "/etc/dspark/tls"
KEYS_DIR = "/etc/dspark/keys"


def tls_flags(component: str) -> list[str]:
    """Serve TLS (mutual inside the cluster; the router's public side is
    server-only) and reach the next hop with our certificate."""
    out = ["--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key"]
    if component != "router":
        out += ["--tls-client-ca", f"{TLS_DIR}/ca.crt"]
    if component != "worker":
        out += ["--tls-ca", f"{TLS_DIR}/ca.crt", "--tls-client-cert", f"{TLS_DIR}/tls.crt",
                "--tls-client-key", f"{TLS_DIR}/tls.key"]
    return out


def labels(component: str, replica: int | None = None) -> dict:
    out = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": component}
    if replica is not None:
        out["dspark.io/replica"] = str(replica)
    return out


def grpc_probe(port: int, service: str, period: int, failures: int, timeout: int = 3,
               tls_name: str = "") -> dict:
    if tls_name:  # the kubelet's gRPC probe has no TLS: ask `dspark health` inside the pod
        cmd = ["dspark", "health", "--address", f"127.0.0.1:{port}", "--service", service,
               "--tls-ca", f"{TLS_DIR}/ca.crt", "--tls-client-cert", f"{TLS_DIR}/tls.crt",
               "--tls-client-key", f"{TLS_DIR}/tls.key", "--tls-server-name", tls_name]
        p = {"exec": {"command": cmd}}
    else:
        p = {"grpc": {"port": port}}
        if service:
            p["grpc"]["service"] = service
    p.update(periodSeconds=period, failureThreshold=failures, timeoutSeconds=timeout)
    return p


def container(component: str, args: list[str], *, image: str, resources: dict,
              startup_s: int, extra_ports: list[dict] = (), tls_name: str = "",
              api_keys: bool = False) -> dict:
    """``tls_name``: the DNS name this service's certificate is checked
    against (its Service name); "" = no TLS."""
    port = PORTS[component]
    service = f"dspark.v1.{component.capitalize()}"
    period = 5
    mounts = []
    tls = bool(tls_name)
    if tls:
        args = [*args, *tls_flags(component)]
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    if api_keys:
        args = [*args, "--api-keys-file", f"{KEYS_DIR}/api-keys.txt"]
        mounts.append({"name": "api-keys", "mountPath": KEYS_DIR, "readOnly": True})
    c = {
        "name": component,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": [component, "--host", "0.0.0.0", "--port", str(port),
                 "--metrics-port", str(METRICS_PORT),
                 "--drain-timeout", "$(DSPARK_DRAIN_TIMEOUT)",
                 "--log-level", "$(DSPARK_LOG_LEVEL)", *args],
        "envFrom": [{"configMapRef": {"name": CONFIG}}],
        "ports": [{"name": "grpc", "containerPort": port},
                  {"name": "metrics", "containerPort": METRICS_PORT}, *extra_ports],
        # Model loading (worker) or waiting for the worker (scheduler) happens
        # before readiness: the startup probe allows for it, then liveness and
        # readiness take over.
        "startupProbe": grpc_probe(port, service, period, max(1, startup_s // period),
                                   tls_name=tls_name),
        "livenessProbe": grpc_probe(port, "", 10, 3, timeout=5 if tls else 3,
                                    tls_name=tls_name),
        "readinessProbe": grpc_probe(port, service, 5, 2, timeout=5 if tls else 3,
                                     tls_name=tls_name),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}},
        "resources": resources,
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if mounts:
        c["volumeMounts"] = mounts
    return c


def pod_spec(c: dict, drain_s: int, node_selector: dict | None = None,
             tls_secret: str = "", api_keys_secret: str = "") -> dict:
    spec = {
        "terminationGracePeriodSeconds": PRESTOP_SLEEP_S + drain_s + GRACE_MARGIN_S,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                            "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [c],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    volumes = []
    if tls_secret:
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret,
                                                  "defaultMode": 0o440}})
    if api_keys_secret:
        volumes.append({"name": "api-keys", "secret": {"secretName": api_keys_secret,
                                                       "defaultMode": 0o440}})
    if volumes:
        spec["volumes"] = volumes
    return spec


def deployment(name: str, lab: dict, spec: dict, replicas: int, recreate: bool,
               scheme: str = "http") -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": lab},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": lab},
            "strategy": {"type": "Recreate"} if recreate else
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": lab, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                    "prometheus.io/scheme": scheme}},
                "spec": spec,
            },
        },
    }


def service(name: str, lab: dict, ports: list[tuple[str, int]]) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": lab},
        "spec": {"selector": lab, "ports": [
            {"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports]},
    }


def render(replicas: int = 2, image: str = "dspark-serve:latest", drain_s: int = 30,
           startup_s: int = 600, router_replicas: int = 2, accelerator: str = "",
           tls_secret: str = "", api_keys_secret: str = "") -> list[dict]:
    if replicas < 1:
        raise ValueError(f"replicas={replicas} is invalid: must be >= 1")
    if drain_s < 0:
        raise ValueError(f"drain_timeout={drain_s} is invalid: must be >= 0")
    tls = bool(tls_secret)
    scheme = "https" if tls else "http"
    docs: list[dict] = [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIG, "labels": {"app.kubernetes.io/name": NAME}},
        "data": {
            "DSPARK_DRAIN_TIMEOUT": str(drain_s),
            "DSPARK_LOG_LEVEL": "INFO",
            "DSPARK_DTYPE": "auto",
            "DSPARK_DEVICE": "cuda" if accelerator else "cpu",
            "DSPARK_KV_CACHE_GIB": "1.6",
            "DSPARK_MAX_NUM_SEQS": "64",
            "DSPARK_MAX_NUM_BATCHED_TOKENS": "512",
        },
    }]
    schedulers = []
    for i in range(replicas):
        wname, sname = f"dspark-worker-{i}", f"dspark-scheduler-{i}"
        wl, sl = labels("worker", i), labels("scheduler", i)
        wres = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "6Gi"}}
        node_selector = None
        if accelerator:
            # The accelerator goes to the worker: one device per worker pod.
            wres["limits"][accelerator] = 1
            wres["requests"][accelerator] = 1
        w = container("worker", ["--dtype", "$(DSPARK_DTYPE)", "--device", "$(DSPARK_DEVICE)",
                                 "--kv-cache-gib", "$(DSPARK_KV_CACHE_GIB)"],
                      image=image, resources=wres, startup_s=startup_s,
                      tls_name=wname if tls else "")
        s = container("scheduler", ["--worker", f"{wname}:{PORTS['worker']}",
                                    "--max-num-seqs", "$(DSPARK_MAX_NUM_SEQS)",
                                    "--max-num-batched-tokens",
                                    "$(DSPARK_MAX_NUM_BATCHED_TOKENS)"],
                      image=image, startup_s=startup_s + 60, tls_name=sname if tls else "",
                      resources={"requests": {"cpu": "250m", "memory": "256Mi"},
                                 "limits": {"memory": "1Gi"}})
        docs += [
            deployment(wname, wl, pod_spec(w, drain_s, node_selector, tls_secret), 1,
                       recreate=True, scheme=scheme),
            service(wname, wl, [("grpc", PORTS["worker"]), ("metrics", METRICS_PORT)]),
            deployment(sname, sl, pod_spec(s, drain_s, None, tls_secret), 1, recreate=True,
                       scheme=scheme),
            service(sname, sl, [("grpc", PORTS["scheduler"]), ("metrics", METRICS_PORT)]),
        ]
        schedulers.append(f"{sname}:{PORTS['scheduler']}")
    rl = labels("router")
    r = container("router", ["--http-port", str(HTTP_PORT), "--schedulers", *schedulers],
                  image=image, startup_s=60, tls_name="dspark-router" if tls else "",
                  api_keys=bool(api_keys_secret),
                  extra_ports=[{"name": "http", "containerPort": HTTP_PORT}],
                  resources={"requests": {"cpu": "500m", "memory": "512Mi"},
                             "limits": {"memory": "1Gi"}})
    docs += [
        deployment("dspark-router", rl, pod_spec(r, drain_s, None, tls_secret, api_keys_secret),
                   router_replicas, recreate=False, scheme=scheme),
        service("dspark-router", rl, [("grpc", PORTS["router"]), ("http", HTTP_PORT),
                                      ("metrics", METRICS_PORT)]),
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {"name": "dspark-router", "labels": rl},
         "spec": {"minAvailable": 1, "selector": {"matchLabels": rl}}},
    ]
    return docs


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):  # plain YAML, no &anchors
        return True


def to_yaml(docs: list[dict]) -> str:
    head = ("# Generated by deploy/k8s/render.py; edit that, then re-render:\n"
            "#   python deploy/k8s/render.py > deploy/k8s/dspark.yaml\n")
    return head + "---\n".join(yaml.dump(d, Dumper=_NoAliases, sort_keys=False, width=100) for d in docs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=2, help="model replicas (scheduler + worker)")
    p.add_argument("--router-replicas", type=int, default=2)
    p.add_argument("--image", default="dspark-serve:latest")
    p.add_argument("--drain-timeout", type=int, default=30, help="seconds")
    p.add_argument("--startup-timeout", type=int, default=600,
                   help="seconds a worker may take to load its model")
    p.add_argument("--accelerator", default="",
                   help="extended resource per worker, e.g. nvidia.com/gpu (sets --device cuda)")
    p.add_argument("--tls-secret", default="",
                   help="Secret with ca.crt, tls.crt, tls.key: TLS on every hop (mutual inside)")
    p.add_argument("--api-keys-secret", default="",
                   help="Secret with api-keys.txt: the router requires API keys")
    a = p.parse_args(argv)
    try:
        docs = render(a.replicas, a.image, a.drain_timeout, a.startup_timeout,
                      a.router_replicas, a.accelerator, a.tls_secret, a.api_keys_secret)
    except ValueError as e:
        print(f"render.py: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(to_yaml(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
