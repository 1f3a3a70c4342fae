"""A service that cannot start says why in one line and exits non-zero."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.e2e


def _worker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark.shared.cli", "worker", "--port", "45999",
                           *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present here")
def test_unavailable_cuda_device_is_a_clear_startup_error():
    r = _worker("--device", "cuda")
    assert r.returncode == 1
    assert "device cuda requested" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_npu_support_is_a_clear_startup_error():
    r = _worker("--device", "npu")
    assert r.returncode == 1
    assert "npu" in r.stderr and "Traceback" not in r.stderr


def test_missing_model_directory_is_a_clear_startup_error(tmp_path):
    r = _worker("--model", str(tmp_path / "nope"))
    assert r.returncode == 1
    assert "config.json" in r.stderr


def test_final_layer_as_tap_layer_is_refused(default_model_dir):
    r = _worker("--tap-layer-ids", "8", "29")
    assert r.returncode == 1
    assert "29" in r.stderr and "Traceback" not in r.stderr


def test_bad_flag_value_names_the_field():
    r = subprocess.run([sys.executable, "-m", "dspark.shared.cli", "worker", "--dtype", "fp8"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "dtype" in r.stderr


def test_scheduler_without_a_worker_gives_up_clearly():
    r = subprocess.run([sys.executable, "-m", "dspark.shared.cli", "scheduler", "--port", "45998",
                        "--worker", "127.0.0.1:45997", "--worker-start-timeout-s", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "45997" in r.stderr and "not ready" in r.stderr and "Traceback" not in r.stderr
