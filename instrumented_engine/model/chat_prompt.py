"""A rendered chat prompt in which message content cannot become special tokens.

A chat template pastes client text into one string. Tokenizing that string with special
tokens parsed would turn a client's "<|im_start|>system" into a real role marker. So, before
rendering, each special-token string inside a message is replaced by a placeholder that
holds no special token; after rendering, every special token left in the string is the
template's own. Encoding splits the string there (as the tokenizer itself does at added
tokens) and encodes each piece in between with the placeholders turned back into their text
and special-token parsing off. Messages without special-token strings are encoded in one call,
exactly as before. This is what llama.cpp's server does with `parse_special` off for user text.
"""
from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from instrumented_engine.model.tokenizer import Tokenizer

# The placeholders' nonces. Not `secrets`: os.urandom releases the GIL, and getting it back
# behind a busy thread took milliseconds a request. A Mersenne Twister seeded from the OS is
# unguessable here because none of its output leaves the process (the placeholders are
# restored before anything is sent), so its state cannot be rebuilt from outside.
_NONCE_RNG = random.Random()
os.register_at_fork(after_in_child=_NONCE_RNG.seed)


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """The template's output, and what each placeholder in it stands for.

    >>> ChatPrompt("<s>\\ue000a\\ue001</s>", {"\\ue000a\\ue001": "<s>"}).text
    '<s><s></s>'
    """

    rendered: str
    literals: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The prompt as plain text, client text restored (for display and byte counts)."""
        return _restore(self.rendered, self.literals)


def escape_messages(messages: Sequence[Mapping[str, Any]], special_tokens: Sequence[str]
                    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Messages with each special-token string in a text value (not the role) replaced by a
    random placeholder, and the placeholder → text map.

    >>> msgs, literals = escape_messages([{"role": "user", "content": "a<s>b"}], ["<s>"])
    >>> "<s>" in msgs[0]["content"], _restore(msgs[0]["content"], literals)
    (False, 'a<s>b')
    """
    pattern = _alternation(special_tokens)
    literals: dict[str, str] = {}
    if pattern is None:
        return [dict(m) for m in messages], literals
    # Private-use characters around a random nonce: no special token contains them, and a
    # client cannot guess them to smuggle a placeholder in.
    nonce = f"{_NONCE_RNG.getrandbits(64):016x}"
    placeholder_of: dict[str, str] = {}

    def placeholder(match: re.Match) -> str:
        token = match.group(0)
        if token not in placeholder_of:
            placeholder_of[token] = f"\ue000{nonce}.{len(placeholder_of)}\ue001"
            literals[placeholder_of[token]] = token
        return placeholder_of[token]

    def escape(value: str) -> str:
        # Substring tests are C-fast; the regex runs only on text that needs it.
        return pattern.sub(placeholder, value) if any(t in value for t in special_tokens) else value

    escaped = []
    for message in messages:
        if not isinstance(message, Mapping):
            escaped.append(message)  # the template reports malformed messages
            continue
        escaped.append({key: escape(value) if isinstance(value, str) and key != "role" else value
                        for key, value in message.items()})
    return escaped, literals


def encode_chat_prompt(tokenizer: Tokenizer, prompt: ChatPrompt, *,
                       add_bos: bool | None = None) -> list[int]:
    """Token ids of a rendered chat: the template's special tokens as specials, client text
    as plain text."""
    if not prompt.literals:
        return tokenizer.encode(prompt.rendered, add_bos=add_bos)
    ids: list[int] = []
    if (tokenizer.add_bos_token if add_bos is None else add_bos) and tokenizer.bos_token_id is not None:
        ids.append(tokenizer.bos_token_id)
    pattern = _alternation(tokenizer.special_tokens)
    position = 0
    for match in pattern.finditer(prompt.rendered):
        ids += _encode_plain(tokenizer, prompt.rendered[position:match.start()], prompt.literals)
        ids.append(tokenizer.token_to_id(match.group(0)))
        position = match.end()
    ids += _encode_plain(tokenizer, prompt.rendered[position:], prompt.literals)
    return ids


def _encode_plain(tokenizer: Tokenizer, piece: str, literals: Mapping[str, str]) -> list[int]:
    if not piece:
        return []
    return tokenizer.encode(_restore(piece, literals), add_bos=False, parse_special=False)


def _restore(text: str, literals: Mapping[str, str]) -> str:
    for placeholder, token in literals.items():
        text = text.replace(placeholder, token)
    return text


def _alternation(tokens: Sequence[str]) -> re.Pattern | None:
    # Longest first: where one special token is a prefix of another, the longer one wins,
    # as in the tokenizer's own leftmost-longest matching of added tokens.
    tokens = sorted({t for t in tokens if t}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens))) if tokens else None
