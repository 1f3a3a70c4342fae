"""Fixtures of the router tests: a tiny tokenizer model directory (see router_tiny_tok)."""
from __future__ import annotations

import pytest
from router_tiny_tok import write_model_dir

from dspark.router.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_model")
    write_model_dir(path)
    return path


@pytest.fixture(scope="session")
def tok(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)
