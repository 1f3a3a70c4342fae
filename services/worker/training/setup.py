"""What every offline command (gen-drafter-data, train-drafter, eval-drafter,
calibrate-drafter, probe-taps) does first."""
from __future__ import annotations

from pathlib import Path


def prepare_offline(args) -> Path:
    """Cap torch's threads at ``--threads`` (when the command has it and it is
    set), prepare the default model when no ``--model`` is given, and return
    the target's model folder."""
    import torch

    from dspark.shared.config import WorkerConfig

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    if not args.model:
        from dspark.worker.convert import prepare_default_model

        prepare_default_model()
    return WorkerConfig(model=args.model).model_dir
