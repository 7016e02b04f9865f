"""Engine-test fixtures: our GGUF tokenizer and transformers' reading of the same file."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer(gguf_path):
    import gguf

    from instrumented_engine.model.tokenizer import Tokenizer
    return Tokenizer.from_gguf(gguf.GGUFReader(gguf_path))


@pytest.fixture(scope="session")
def reference(gguf_path):
    """transformers' tokenizer for the same GGUF: the parity reference (test-only dep)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
