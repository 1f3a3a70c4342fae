"""deploy/k8s: the committed manifests are what render.py writes, validate
against the Kubernetes schemas offline (kubernetes-validate, strict), and
hang together: probes, drain timing, selectors, service names, flags the real
CLI accepts."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
sys.path.insert(0, str(K8S))
import render  # noqa: E402

kv = pytest.importorskip("kubernetes_validate",
                         reason="kubernetes-validate is not installed (in the test extra)")


def committed() -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / "dspark.yaml").read_text()) if d]


def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_committed_manifests_are_rendered():
    out = subprocess.run([sys.executable, str(K8S / "render.py")], capture_output=True,
                         text=True, check=True).stdout
    assert out == (K8S / "dspark.yaml").read_text(), \
        "deploy/k8s/dspark.yaml is stale: python deploy/k8s/render.py > deploy/k8s/dspark.yaml"


@pytest.mark.parametrize("variant", [
    {}, {"replicas": 4}, {"accelerator": "nvidia.com/gpu", "image": "r/dspark:cuda"},
    {"tls_secret": "dspark-tls", "api_keys_secret": "dspark-api-keys"}])
def test_manifests_validate_against_kubernetes_schemas(variant):
    docs = render.render(**variant) if variant else committed()
    for d in docs:
        kv.validate(d, "1.37.0", strict=True)  # raises ValidationError on a bad field


def test_schema_validation_really_rejects(tmp_path):
    bad = render.render()[1]
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, "1.37.0", strict=True)


def _containers(docs):
    for name, d in by_kind(docs, "Deployment").items():
        yield name, d, d["spec"]["template"]["spec"], d["spec"]["template"]["spec"]["containers"][0]


def test_probes_are_native_grpc_on_the_right_service():
    docs = committed()
    for name, _, _, c in _containers(docs):
        kind = c["args"][0]
        port = int(c["args"][c["args"].index("--port") + 1])
        svc = f"dspark.v1.{kind.capitalize()}"
        assert c["livenessProbe"]["grpc"] == {"port": port}  # "" = liveness
        assert c["readinessProbe"]["grpc"] == {"port": port, "service": svc}
        assert c["startupProbe"]["grpc"] == {"port": port, "service": svc}
        budget = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
        if kind in ("worker", "scheduler"):
            assert budget >= 600, f"{name}: {budget}s is short for loading the model"


def test_drain_timing_matches_the_configmap():
    docs = committed()
    drain = int(by_kind(docs, "ConfigMap")["dspark-config"]["data"]["DSPARK_DRAIN_TIMEOUT"])
    for name, _, pod, c in _containers(docs):
        assert c["args"][c["args"].index("--drain-timeout") + 1] == "$(DSPARK_DRAIN_TIMEOUT)"
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre[0] == "sleep"
        # SIGTERM comes after preStop; the drain must fit before the kill.
        assert pod["terminationGracePeriodSeconds"] > int(pre[1]) + drain, name


def test_wiring_selectors_services_and_pdb():
    docs = committed()
    deps, svcs = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    for name, d in deps.items():
        sel = d["spec"]["selector"]["matchLabels"]
        assert d["spec"]["template"]["metadata"]["labels"] == sel
        assert svcs[name]["spec"]["selector"] == sel  # a Service per Deployment
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        if c["args"][0] in ("worker", "scheduler"):
            assert d["spec"]["strategy"]["type"] == "Recreate" and d["spec"]["replicas"] == 1
    router = deps["dspark-router"]["spec"]["template"]["spec"]["containers"][0]["args"]
    scheds = router[router.index("--schedulers") + 1:]
    assert scheds == ["dspark-scheduler-0:50052", "dspark-scheduler-1:50052"]
    for i in (0, 1):
        args = deps[f"dspark-scheduler-{i}"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--worker") + 1] == f"dspark-worker-{i}:50053"
    pdb = by_kind(docs, "PodDisruptionBudget")["dspark-router"]
    assert pdb["spec"]["selector"]["matchLabels"] == deps["dspark-router"]["spec"]["selector"][
        "matchLabels"]
    assert pdb["spec"]["minAvailable"] == 1 and deps["dspark-router"]["spec"]["replicas"] >= 2


def test_container_args_parse_with_the_real_cli():
    """$(VAR) filled from the ConfigMap, every container's args are accepted
    by `dspark <service>` and make a valid config."""
    from dspark.shared.cli import build_parser, config_from_args
    from dspark.shared.config import RouterConfig, SchedulerConfig, WorkerConfig

    docs = committed()
    env = by_kind(docs, "ConfigMap")["dspark-config"]["data"]
    classes = {"worker": WorkerConfig, "scheduler": SchedulerConfig, "router": RouterConfig}
    for name, _, _, c in _containers(docs):
        args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
        ns = build_parser().parse_args(args)
        cfg = config_from_args(classes[args[0]], ns)
        assert cfg.host == "0.0.0.0" and cfg.metrics_port == 9090
        assert cfg.drain_timeout == float(env["DSPARK_DRAIN_TIMEOUT"])


def test_scaling_and_accelerator():
    docs = render.render(replicas=3, accelerator="nvidia.com/gpu")
    deps = by_kind(docs, "Deployment")
    assert {n for n in deps if "worker" in n} == {f"dspark-worker-{i}" for i in range(3)}
    w = deps["dspark-worker-2"]["spec"]["template"]["spec"]["containers"][0]
    assert w["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert by_kind(docs, "ConfigMap")["dspark-config"]["data"]["DSPARK_DEVICE"] == "cuda"
    s = deps["dspark-scheduler-0"]["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in s["resources"]["limits"]  # only workers hold devices
    with pytest.raises(ValueError, match="replicas=0 is invalid"):
        render.render(replicas=0)


def test_tls_variant_uses_exec_probes_and_mounted_secrets():
    """The kubelet's gRPC probe has no TLS: with TLS the probes run `dspark
    health` with the mounted certificates, checking the Service's name."""
    from dspark.shared.cli import build_parser

    docs = render.render(tls_secret="dspark-tls", api_keys_secret="dspark-api-keys")
    for name, d, pod, c in _containers(docs):
        kind = c["args"][0]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            cmd = c[probe]["exec"]["command"]
            assert cmd[:2] == ["dspark", "health"] and "grpc" not in c[probe]
            assert cmd[cmd.index("--tls-server-name") + 1] == name  # Service name = SAN
            ns = build_parser().parse_args(cmd[1:])
            assert ns.address == f"127.0.0.1:{render.PORTS[kind]}"
        assert {v["secret"]["secretName"] for v in pod["volumes"]} >= {"dspark-tls"}
        env = by_kind(docs, "ConfigMap")["dspark-config"]["data"]
        ns = build_parser().parse_args(
            [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]])
        assert ns.tls_cert == "/etc/dspark/tls/tls.crt"
        if kind != "router":
            assert ns.tls_client_ca == "/etc/dspark/tls/ca.crt"  # mutual inside
        if kind != "worker":
            assert ns.tls_ca == "/etc/dspark/tls/ca.crt"
        assert d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    router = by_kind(docs, "Deployment")["dspark-router"]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert args[args.index("--api-keys-file") + 1] == "/etc/dspark/keys/api-keys.txt"
    assert {"name": "api-keys", "mountPath": "/etc/dspark/keys", "readOnly": True} in \
        router["containers"][0]["volumeMounts"]
