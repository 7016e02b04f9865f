"""Ollama's native answers for the fake upstream (`fake_upstream.py`): `/api/chat` and
`/api/generate` streams as `Recording`s, replayed in pieces with a pause before the first
output (text, thinking or a tool call: where Ollama's prompt evaluation ends).

The lines have the shapes of ollama/ollama's API reference (`api.md` in its docs folder)
@9fbfa74219fa74d030c816cc99d3bee0d1c1923d
("Generate a chat completion", "Generate a completion": a stream of JSON objects, the
final one `"done": true` with `total_duration`, `load_duration`, `prompt_eval_count`,
`prompt_eval_duration`, `eval_count`, `eval_duration`, all ns integers; the chat's final
line there has no `message`) and of api/types.go (`thinking`, `done_reason`). The final
line's timing fields are the caller's, given as they go on the wire, so a test can send
hostile ones.

    upstream = FakeUpstream(recordings=ollama_recordings(final={"load_duration": 40_000_000}))
"""
from __future__ import annotations

import json

from tracer.record.first_content import NEITHER, RULES
from tracer.testing.recording import Recording

NDJSON = b"application/x-ndjson"
MODEL = "fake-model"
# The example final line of that API reference (the streamed chat's "Final response").
DOCS_FINAL = {"total_duration": 4883583458, "load_duration": 1334875, "prompt_eval_count": 26,
              "prompt_eval_duration": 342546000, "eval_count": 282, "eval_duration": 4535599000}


def _line(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=True).encode() + b"\n"


def chat_lines(final: dict, *, texts=("The", " sky"), thinking: str | None = "Hm") -> list[bytes]:
    """An /api/chat stream: an empty role line, a thinking line, the texts, the final line."""
    head = {"model": MODEL, "created_at": "2023-08-04T08:52:19.385406455-07:00"}
    lines = [_line({**head, "message": {"role": "assistant", "content": ""}, "done": False})]
    if thinking is not None:
        lines.append(_line({**head, "message": {"role": "assistant", "content": "",
                                                "thinking": thinking}, "done": False}))
    lines += [_line({**head, "message": {"role": "assistant", "content": t, "images": None},
                     "done": False}) for t in texts]
    lines.append(_line({"model": MODEL, "created_at": "2023-08-04T19:22:45.499127Z",
                        "done": True, "done_reason": "stop", **final}))
    return lines


def generate_lines(final: dict, *, texts=("The", " sky"), thinking: str | None = "Hm") -> list[bytes]:
    """An /api/generate stream: `response` text, `thinking` beside it, `context` at the end."""
    head = {"model": MODEL, "created_at": "2023-08-04T19:22:45.499127Z"}
    lines = []
    if thinking is not None:
        lines.append(_line({**head, "response": "", "thinking": thinking, "done": False}))
    lines += [_line({**head, "response": t, "done": False}) for t in texts]
    lines.append(_line({**head, "response": "", "done": True, "done_reason": "stop",
                        "context": [1, 2, 3], **final}))
    return lines


def recording(lines: list[bytes], *, hold_ms: float, split_lines: bool = True) -> Recording:
    """The lines as one body, written line by line (`split_lines`: each line also cut in
    two, so a line spans two reads), paused `hold_ms` before the first line with an output
    by Ollama's rule (`tracer.record.first_content`)."""
    body, cuts, hold_at, at = b"", [], None, 0
    for line in lines:
        if hold_at is None and RULES["ollama"](json.loads(line)) not in (None, NEITHER):
            hold_at = at
        if split_lines:
            cuts.append(at + len(line) // 2)
        body += line
        at += len(line)
        cuts.append(at)
    return Recording(body, NDJSON, tuple(cuts), hold_at, hold_ms)


def ollama_recordings(final: dict | None = None, *, hold_ms: float = 150.0) -> dict[str, Recording]:
    """Both paths' recordings for `FakeUpstream(recordings=...)`, with `final`'s fields (the
    docs' example by default) on the last line."""
    final = DOCS_FINAL if final is None else final
    return {"/api/chat": recording(chat_lines(final), hold_ms=hold_ms),
            "/api/generate": recording(generate_lines(final), hold_ms=hold_ms)}
