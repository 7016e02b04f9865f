"""Shared engine fixtures: the packaged SmolLM2, loaded once per test session (fp32, CPU)."""
from __future__ import annotations

import pathlib

import pytest


@pytest.fixture(scope="session")
def gguf_path() -> pathlib.Path:
    from instrumented_engine.loader import default_model_path
    return default_model_path()


@pytest.fixture(scope="session")
def loaded_model(gguf_path):
    import torch

    from instrumented_engine.loader import load_model
    # The build machines have two cores shared by everything; more threads only thrash.
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return load_model(gguf_path, device="cpu", dtype="float32")
