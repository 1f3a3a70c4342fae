"""The native CPU kernels: their build, and the paged attention kernel for short
query windows.

One extension holds both kernels, compiled from ``native/`` with the machine's
C++ compiler (torch's ``cpp_extension``, ``-O3 -march=native``, OpenMP) into the
cache directory, keyed by the sources, torch's version and this CPU's
instruction set, so a cache shared between machines never loads a binary built
for another CPU:

- ``native/paged_attention.cpp`` attends every decode row and verify window of
  a step in one call per layer, reading keys and values from the paged pool in
  place (the PyTorch path copies them into a padded batch, or calls SDPA once
  per sequence); ``native/drafter_attention.cpp`` the drafter's block rows
  over their cached context (both on ``native/attention_tiles.h``);
- ``native/linear_rows.cpp`` is the fp32 linear layer for the row counts of
  decode and verify steps, and ``native/row_ops.cpp`` their RMSNorm and SwiGLU
  product (``native_linear``);
- ``native/markov.cpp`` is the drafter's greedy Markov loop, all draft
  positions in one call (``native_markov``);
- ``native/top_kp.cpp`` is the sampler's top-k / top-p filter, a batch of
  rows in one call (``sampler``).

``make setup`` builds it (``python -m dspark.worker.model.native_attention``);
a worker with ``--attention auto`` (``--linear auto``) uses a kernel when it is
built, and the PyTorch path otherwise (not built, a machine without a compiler,
another device); ``native`` builds it if needed.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys
import threading
from pathlib import Path

import torch

_DIR = Path(__file__).resolve().parent / "native"
SOURCES = tuple(_DIR / f for f in ("module.cpp", "paged_attention.cpp", "drafter_attention.cpp",
                                    "linear_rows.cpp", "linear_gguf.cpp", "linear_bf16.cpp",
                                    "row_ops.cpp", "markov.cpp", "top_kp.cpp"))
HEADERS = (_DIR / "vec_exp.h", _DIR / "linear_units.h", _DIR / "linear_rows_kernels.h",
           _DIR / "attention_tiles.h")  # included: part of the build key
NAME = "dspark_native"
BACKENDS = ("auto", "native", "torch")

log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict = {}  # "ext": the loaded module, or "error": why it is unavailable


def _cpu_key() -> str:
    """This CPU's instruction set (the flags line), so -march=native builds stay local."""
    flags = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags += line.split(":", 1)[1]
                break
    except OSError:
        pass
    return hashlib.sha256(flags.encode()).hexdigest()[:12]


def build_dir() -> Path:
    from dspark.shared.config import cache_dir

    src = hashlib.sha256(b"".join(f.read_bytes() for f in SOURCES + HEADERS)).hexdigest()[:12]
    tv = torch.__version__.replace("+", "_")
    return cache_dir() / "native" / f"{NAME}-{src}-torch{tv}-cpu{_cpu_key()}"


def load(build: bool = True, verbose: bool = False):
    """The compiled module, or None when it cannot be had (the reason is kept in
    ``unavailable_reason()``). ``build=False`` only loads an existing build. A
    build that failed is not tried again in this process."""
    with _lock:
        if "ext" in _state:
            return _state["ext"]
        if _state.get("build_failed") or ("error" in _state and not build):
            return None
        d = build_dir()
        if not build and not any(d.glob(f"{NAME}*.so")):
            _state["error"] = f"not built (no {NAME}*.so in {d}; run `make setup`)"
            return None
        try:
            from torch.utils.cpp_extension import load as cpp_load

            d.mkdir(parents=True, exist_ok=True)
            ext = cpp_load(NAME, [str(f) for f in SOURCES], build_directory=str(d), verbose=verbose,
                           extra_cflags=["-O3", "-march=native", "-fopenmp"],
                           extra_ldflags=["-fopenmp"])
        except Exception as e:  # no compiler, no ninja, a failed build: use the torch path
            _state["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
            _state["build_failed"] = build
            return None
        _state.pop("error", None)
        _state["ext"] = ext
        return ext


def unavailable_reason() -> str:
    return _state.get("error", "")


LANES = 16  # the kernel's head_dim granularity (paged_attention.cpp, kW)


def resolve(backend: str, device: torch.device, head_dim: int) -> object | None:
    """The kernel module for a worker's ``--attention`` choice, or None (the
    PyTorch path). "auto" only loads a kernel already built (`make setup`), so a
    worker never spends its start-up compiling; "native" builds it when missing,
    and one that cannot be had is a start-up error."""
    if backend not in BACKENDS:
        raise ValueError(f"attention={backend!r} is invalid: must be one of {', '.join(BACKENDS)}")
    if backend == "torch":
        return None
    why = ""
    if device.type != "cpu":
        why = f"it is a CPU kernel and the device is {device.type}"
    elif head_dim % LANES:
        why = f"head_dim={head_dim} is not a multiple of {LANES}"
    if why:
        if backend == "native":
            raise ValueError(f"attention='native' is unavailable: {why}")
        return None
    ext = load(build=backend == "native")
    if ext is None:
        if backend == "native":
            raise ValueError(f"attention='native' is unavailable: {unavailable_reason()}")
        log.warning("native attention unavailable (%s); using the PyTorch path",
                    unavailable_reason())
    return ext


def main() -> int:
    """Build (or find) the kernel and check it against the PyTorch path once."""
    ext = load(build=True, verbose="-v" in sys.argv)
    if ext is None:
        print(f"native kernels: unavailable ({unavailable_reason()}); "
              "workers will use the PyTorch path", file=sys.stderr)
        return 0 if os.environ.get("DSPARK_REQUIRE_NATIVE") != "1" else 1
    from .kv_cache import build_metadata, pack_keys, pack_values, paged_attention

    g = torch.Generator().manual_seed(0)
    bs, kvh, hd, h = 16, 2, 32, 4
    k = pack_keys(torch.randn(64 * bs, kvh, hd, generator=g), bs)
    v = pack_values(torch.randn(64 * bs, kvh, hd, generator=g), bs)
    seqs = [(40, 1, list(range(8, 16))), (17, 3, [30, 2, 5])]
    q = torch.randn(4, h, hd, generator=g)
    kn, vn = torch.randn(4, kvh, hd, generator=g), torch.randn(4, kvh, hd, generator=g)

    def attend(native):
        meta = build_metadata(seqs, bs, h // kvh, torch.device("cpu"), native=native)
        return paged_attention(q, kn, vn, k.clone(), v.clone(), meta)

    ref, got = attend(None), attend(ext)
    err = float((ref - got).abs().max())
    w, x = torch.randn(40, 24, generator=g), torch.randn(3, 24, generator=g)
    lin_err = float((ext.linear_rows(x, ext.pack_rows_weight(w), 40) - x @ w.T).abs().max())
    print(f"native kernels: built in {build_dir()} (max |diff| vs PyTorch: attention "
          f"{err:.2e}, linear {lin_err:.2e})")
    return 0 if err < 1e-4 and lin_err < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
