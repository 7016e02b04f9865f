"""How many characters of a chat prompt, as the proxy sees it, make 16 tokens of our engine's
tokenizer: the measurement behind `DEFAULT_CHARS_PER_BLOCK` (tracer/record/block_chain.py;
docs/reference.md, "Trace export (Mooncake JSONL)").

    .venv/bin/python bench/chars_per_block.py CONVERSATIONS.json [MORE.jsonl ...]

Each file holds chat conversations: ShareGPT-style JSON (`[{"conversations": [{"from":
"human"|"gpt", "value": ...}]}]`) or MT-bench JSONL (`{"turns": [...]}` a line, user turns
only). Every prefix of a conversation that ends with a user turn is one prompt, as a chat
client sends it. The proxy's text is `tracer.record.prompt_overlap.prompt_text` of the
messages (the contents joined by newlines). Its tokens are that text tokenized; the chat
template adds tokens the proxy never sees (role markers, SmolLM2's default system prompt),
printed apart as the template's overhead: a constant per conversation shape, it shifts
the engine's block boundaries but not which prompts share a prefix. Prints: characters per
16 tokens of text (the ratio of sums, and per prompt the median and quartiles), and for
each candidate block of N characters how far ceil(chars / N) is from ceil(tokens / 16) over
prompts of at least 4 blocks (median and p90 of the relative error).
"""
from __future__ import annotations

import json
import math
import statistics
import sys

from instrumented_engine.model.loader import load_model
from tracer.record.prompt_overlap import prompt_text

TOKENS_PER_BLOCK = 16
CANDIDATES = range(40, 81, 4)


def conversations(path: str) -> list[list[dict]]:
    with open(path, encoding="utf-8") as stream:
        text = stream.read()
    if path.endswith(".jsonl"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [[{"role": "user", "content": t} for t in row["turns"]] for row in rows]
    out = []
    for conv in json.loads(text):
        roles = {"human": "user", "gpt": "assistant", "system": "system"}
        out.append([{"role": roles.get(m["from"], "user"), "content": m["value"]}
                    for m in conv["conversations"]])
    return out


def prompts(convs: list[list[dict]]):
    for conv in convs:
        for end, message in enumerate(conv, 1):
            if message["role"] == "user":
                yield conv[:end]


def main(paths: list[str]) -> None:
    loaded = load_model(device="cpu", dtype="float32")
    pairs, overhead = [], []
    for path in paths:
        for messages in prompts(conversations(path)):
            text = prompt_text(messages)
            num_tokens = len(loaded.tokenizer.encode(text, add_bos=False))
            rendered = loaded.chat_template.render(messages, add_generation_prompt=True)
            overhead.append(len(loaded.tokenizer.encode(rendered, add_bos=False)) - num_tokens)
            pairs.append((len(text), num_tokens))
    chars, tokens = sum(c for c, _ in pairs), sum(t for _, t in pairs)
    per_prompt = sorted(c / t * TOKENS_PER_BLOCK for c, t in pairs if t)
    q = statistics.quantiles(per_prompt, n=4)
    print(f"{loaded.name}: {len(pairs)} prompts, {chars:,} characters, {tokens:,} tokens")
    print(f"characters per {TOKENS_PER_BLOCK} tokens: {chars / tokens * TOKENS_PER_BLOCK:.1f} "
          f"(ratio of sums); per prompt median {q[1]:.1f}, quartiles {q[0]:.1f}-{q[2]:.1f}")
    print(f"the template's overhead: median {statistics.median(overhead):.0f} tokens a prompt")
    long = [(c, t) for c, t in pairs if t >= 4 * TOKENS_PER_BLOCK]
    print(f"N chars/block  median |blocks error|  p90   ({len(long)} prompts of >= 4 blocks)")
    for n in CANDIDATES:
        errors = sorted(abs(math.ceil(c / n) - math.ceil(t / TOKENS_PER_BLOCK))
                        / math.ceil(t / TOKENS_PER_BLOCK) for c, t in long)
        print(f"{n:13d}  {statistics.median(errors):20.3f}  "
              f"{errors[int(0.9 * (len(errors) - 1))]:.3f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
