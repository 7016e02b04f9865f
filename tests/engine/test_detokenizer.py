"""IncrementalDetokenizer: streamed text equals a one-shot decode, cut exactly before a stop string."""
from __future__ import annotations

import codecs
import json
from pathlib import Path

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings, strategies as st
from tokenizers import decoders, models

from instrumented_engine.engine.detokenizer import DetokenizerStatus, IncrementalDetokenizer
from instrumented_engine.model.tokenizer import Tokenizer

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None,
                             suppress_health_check=[HealthCheck.function_scoped_fixture])


def _token_ids(tok: Tokenizer) -> st.SearchStrategy[list[int]]:
    """Any vocab ids, biased towards the ones that make streaming hard."""
    lone_high_bytes = [i for i, raw in enumerate(tok.token_bytes) if len(raw) == 1 and raw[0] >= 0x80]
    multibyte_text = st.sampled_from(["你好", "😀", "é", "👨‍👩‍👧", "日本", " ü"]).map(tok.encode)
    one = st.one_of(
        st.integers(0, tok.vocab_size - 1).map(lambda i: [i]),
        st.sampled_from(tok.all_special_ids).map(lambda i: [i]),
        st.sampled_from(lone_high_bytes).map(lambda i: [i]),
        multibyte_text,
        st.sampled_from(["ab", "a", "b", "\n", "STOP", "ST", " hello"]).map(tok.encode),
    )
    return st.lists(one, max_size=25).map(lambda chunks: [i for chunk in chunks for i in chunk])


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[list[str], str]:
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


def _expected_with_stops(full_text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """The text before the stop string that completes first (earliest end, then longest)."""
    found = [(full_text.find(s) + len(s), full_text.find(s)) for s in stops if s and s in full_text]
    if not found:
        return full_text, False
    return full_text[:min(found)[1]], True


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_stream_equals_decode(tokenizer, skip_special_tokens):
    @PROPERTY_SETTINGS
    @given(ids=_token_ids(tokenizer))
    def check(ids):
        detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        pieces, tail = _stream(detok, ids)
        expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert "".join(pieces) + tail == expected == detok.text
        assert detok.num_pending_tokens == 0 and not detok.stopped
        # Only the very end can hold a dangling byte; nothing printed mid-stream is a broken char.
        assert "\ufffd" not in "".join(pieces) or "\ufffd" in expected

    check()


def _printable_so_far(tok: Tokenizer, ids: list[int]) -> str:
    """All text the ids make, less a trailing incomplete UTF-8 character."""
    raw = b"".join(tok.token_bytes[i] for i in ids if i not in tok.special_ids)
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(raw, final=False)


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    return max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


def test_stream_with_stops(tokenizer):
    stop_strings = st.sampled_from(["STOP", "ab", "\n\n", "你", "aab", "b\nST", "😀", "zzz", "好S", "hello", "ell"])

    @PROPERTY_SETTINGS
    @given(ids=_token_ids(tokenizer), stops=st.lists(stop_strings, max_size=3).map(tuple))
    def check(ids, stops):
        detok = IncrementalDetokenizer(tokenizer, stop=stops)
        emitted = ""
        for k, token_id in enumerate(ids):
            emitted += detok.push(token_id)
            assert not any(s in emitted for s in stops)
            if not detok.stopped:  # out: everything except what a stop string could still complete
                printable = _printable_so_far(tokenizer, ids[:k + 1])
                assert emitted == printable[:len(printable) - _held_back(printable, stops)]
        emitted += detok.flush()
        expected, should_stop = _expected_with_stops(tokenizer.decode(ids), stops)
        assert (emitted, detok.stopped) == (expected, should_stop)
        assert detok.text == emitted

    check()


def test_chinese_needs_four_tokens(tokenizer):
    # SmolLM2 spells 你好 as bytes (e4 bd)(a0)(e5 a5)(bd): no token is a character on its own,
    # so 你 is printable only after the second push and 好 after the fourth.
    ids = tokenizer.encode("你好")
    assert [tokenizer.token_bytes[i] for i in ids] == [b"\xe4\xbd", b"\xa0", b"\xe5\xa5", b"\xbd"]
    detok = IncrementalDetokenizer(tokenizer)
    outputs, pending = [], []
    for token_id in ids:
        outputs.append(detok.push(token_id))
        pending.append(detok.num_pending_tokens)
    assert outputs == ["", "你", "", "好"]
    assert pending == [1, 0, 1, 0]
    assert detok.flush() == "" and detok.text == "你好"


def test_text_before_partial_character_is_released(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    ids = tokenizer.encode("Hi 你好!")
    outputs = [detok.push(i) for i in ids] + [detok.flush()]
    assert outputs[0] == "Hi" and "".join(outputs) == "Hi 你好!"
    assert "" in outputs[1:]  # some byte token printed nothing on its own


def test_lone_byte_is_replaced_at_flush(tokenizer):
    first_byte_of_ni = tokenizer.encode("你")[0]
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push(first_byte_of_ni) == "" and detok.num_pending_tokens == 1
    assert detok.flush() == tokenizer.decode([first_byte_of_ni]) == "\ufffd"
    assert detok.status is DetokenizerStatus.FINISHED
    with pytest.raises(RuntimeError):
        detok.push(first_byte_of_ni)


def test_stop_string_split_across_tokens(tokenizer):
    ids = tokenizer.encode("The answer is 4.\n\nUser: more")
    detok = IncrementalDetokenizer(tokenizer, stop=("\n\nUser:",))
    pieces, tail = _stream(detok, ids)
    assert detok.stopped and tail == ""
    assert "".join(pieces) == detok.text == "The answer is 4."
    assert detok.push(tokenizer.encode(" x")[0]) == ""  # nothing after a stop


def test_failed_partial_match_is_released(tokenizer):
    stop = "\n\nUser:"
    text = "line\n\nUse it"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, stop=(stop,))
    emitted, num_held_pushes = "", 0
    for k, token_id in enumerate(ids):
        emitted += detok.push(token_id)
        decoded = tokenizer.decode(ids[:k + 1])
        held = max((n for n in range(1, len(stop)) if decoded.endswith(stop[:n])), default=0)
        assert emitted == decoded[:len(decoded) - held]
        num_held_pushes += held > 0
    assert num_held_pushes >= 2  # "\n", "\n\n", "\n\nUse" were each held back in turn
    assert not detok.stopped
    assert emitted + detok.flush() == text == detok.text


def test_partial_match_at_end_is_released_by_flush(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop=("STOPPING",))
    pieces, tail = _stream(detok, tokenizer.encode("go STOP"))
    assert "".join(pieces) == "go " and tail == "STOP" and not detok.stopped


def test_stop_string_inside_one_token(tokenizer):
    ids = tokenizer.encode("hello world")
    detok = IncrementalDetokenizer(tokenizer, stop=("lo w",))
    pieces, _ = _stream(detok, ids)
    assert "".join(pieces) == "hel" and detok.stopped


def test_first_completed_stop_wins_regardless_of_token_boundaries(tokenizer):
    # " hello" is one token; char by char, "ell" would complete before "hello" does.
    assert len(tokenizer.encode(" hello")) == 1
    detok = IncrementalDetokenizer(tokenizer, stop=("hello", "ell"))
    assert detok.push(tokenizer.encode(" hello")[0]) == " h" and detok.stopped


def test_out_of_vocab_id_decodes_to_nothing(tokenizer):
    # Checkpoints pad the embedding past the vocabulary; a sampled padding id prints nothing.
    hello = tokenizer.encode("hello")
    ids = [*hello, tokenizer.vocab_size + 7, *hello]
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.push(i) for i in ids) + detok.flush() == tokenizer.decode(ids) == "hellohello"


def test_special_tokens_kept_when_asked(tokenizer):
    ids = tokenizer.encode("<|im_start|>assistant\nHi<|im_end|>")
    kept = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    skipped = IncrementalDetokenizer(tokenizer)
    assert "".join(kept.push(i) for i in ids) == "<|im_start|>assistant\nHi<|im_end|>"
    assert "".join(skipped.push(i) for i in ids) == "assistant\nHi"


def _sentencepiece_dir(tmp_path: Path) -> Path:
    """A tiny Llama-2-style tokenizer: '▁' spaces, <0xNN> byte fallback, a Strip decoder."""
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)),
              "▁", "a", "b", "▁a", "▁b", "ab", "▁ab", "▁hello", "!", "▁STOP"]
    backend = tokenizers.Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[],
                                              unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens(["<s>", "</s>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return tmp_path


def test_window_path_for_non_byte_level_vocab(tmp_path_factory):
    tok = Tokenizer.from_hf_dir(_sentencepiece_dir(tmp_path_factory.mktemp("spm")))
    assert tok.token_bytes is None and tok.eos_token == "</s>" and tok.all_special_ids == (1, 2)
    nihao = [3 + b for b in "你好".encode()]
    whole_pieces = st.integers(0, tok.vocab_size - 1).filter(lambda i: not tok.id_to_token(i).startswith("<0x"))
    # Byte tokens only in runs that form valid UTF-8: on an invalid run, the ByteFallback decoder
    # replaces every byte of the run at once, which no streaming decoder can know in advance.
    valid_bytes = st.text(max_size=3).map(lambda s: [3 + b for b in s.encode()])

    @PROPERTY_SETTINGS
    @given(ids=st.lists(st.one_of(whole_pieces.map(lambda i: [i]), valid_bytes, st.just(nihao)),
                        max_size=20).map(lambda chunks: [i for chunk in chunks for i in chunk]),
           skip=st.booleans())
    def check(ids, skip):
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        pieces, tail = _stream(detok, ids)
        assert "".join(pieces) + tail == tok.decode(ids, skip_special_tokens=skip)

    check()
    detok = IncrementalDetokenizer(tok)
    assert [detok.push(i) for i in nihao] == ["", "", "你", "", "", "好"]
