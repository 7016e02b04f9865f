"""Fixtures shared by every test folder: the real default model, loaded once per session."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def loaded_model():
    from instrumented_engine.loader import load_model

    # Two cores: tests and the model share them; more threads only add contention.
    torch.set_num_threads(2)
    return load_model(None, device="cpu", dtype="float32")
