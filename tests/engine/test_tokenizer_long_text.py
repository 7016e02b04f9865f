"""Long texts take the GIL-releasing batch call (issue 13, item 7): it must give exactly the
ids of the plain call, with and without special-token parsing."""
from __future__ import annotations

import random
import string

from instrumented_engine.model import tokenizer as tokenizer_module


def test_long_text_path_gives_the_plain_call_ids(tokenizer):
    rng = random.Random(13)
    alphabet = string.printable + "éü你好😀 \n\t" + "<|>"
    for _ in range(20):
        n = rng.randint(tokenizer_module._RELEASE_GIL_MIN_CHARS, 3 * tokenizer_module._RELEASE_GIL_MIN_CHARS)
        text = "".join(rng.choice(alphabet) for _ in range(n)) + "<|im_start|>user\n12  3<|im_end|>"
        assert tokenizer.encode(text) == tokenizer._backend.encode(text, add_special_tokens=False).ids
        plain = tokenizer._plain_backend.encode(text, add_special_tokens=False).ids
        assert tokenizer.encode(text, parse_special=False) == plain
        assert tokenizer.token_to_id("<|im_start|>") not in plain


def test_lone_surrogate_is_a_value_error(tokenizer):
    for text in ("a\ud800b", "x" * tokenizer_module._RELEASE_GIL_MIN_CHARS + "\udfff"):
        try:
            tokenizer.encode(text)
        except ValueError as exc:
            assert "surrogate" in str(exc)
        else:
            raise AssertionError("a lone surrogate was encoded")
