"""The hostile upstream of tests/reliability/test_stream_fuzz.py: Hypothesis strategies for
the answers of every stream format the proxy parses, valid and mutated, and a loopback
server that sends each request the answer registered under its `x-fuzz-id` header (a
request without one, the bystander's, gets a normal chat stream)."""
from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass

from hypothesis import strategies as st

EVENT_BOUND = 1 << 20   # tracer/proxy/sse.py DEFAULT_MAX_EVENT_BYTES
NORMAL = (b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "anthropic": "/v1/messages", "responses": "/v1/responses"}
# Raw JSON no encoder writes: numbers past a double, NaN, lone surrogates, NUL, U+2028.
RAW = [b"1e400", b"-1e400", b"1e-400", b"NaN", b"-Infinity", b"-0", b"9" * 5000,
       b"123456789012345678901234567890", b'"\\ud800"', b'"\\udfff\\ud800x"', b'"\\u0000"',
       b'"\xe2\x80\xa8"', b'"\xff\xfe"', b'"\xf0\x9f\x98"', b'"\\uFFFE"', b"[" * 3000]
_SENTINEL = "@@raw%d@@"


@dataclass
class Scenario:
    status: int
    ctype: bytes
    framing: str              # "length", "chunked" or "close"
    pieces: list[bytes]       # the body, in the writes the upstream makes
    cut: int | None = None    # close after this many body bytes (length / chunked)
    clean: bool = False       # unmutated: its record's outcome is known
    finish: str | None = None  # the finish reason of a clean answer

    @property
    def body(self) -> bytes:
        return b"".join(self.pieces)

    @property
    def sent(self) -> bytes:
        """The body bytes the proxy gets."""
        return self.body if self.cut is None else self.body[:self.cut]


def _dump(obj) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8",
                                                                           "surrogatepass")
    return re.sub(rb'"@@raw(\d+)@@"', lambda m: RAW[int(m[1])], text)


_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
            | st.text(max_size=12) | st.sampled_from(range(len(RAW))).map(lambda i: _SENTINEL % i))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def _paths(obj, prefix=()):
    yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) \
        else ()
    for key, value in items:
        yield from _paths(value, prefix + (key,))


@st.composite
def _mutated(draw, obj):
    """`obj` with some field of any depth replaced by a value of any type, or dropped."""
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(obj))))
        if not path:
            obj = draw(_values)
            continue
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_values)
    return obj


_texts = st.text(min_size=1, max_size=6) | st.sampled_from(["\u2028", "\U0001F600", "\ufeff",
                                                            "é", "\x00"])
_FINISH = st.sampled_from(["stop", "length", "tool_calls", "content_filter"]) | st.text(
    min_size=1, max_size=40)


def _usage(draw) -> dict:
    return {"prompt_tokens": draw(st.integers(0, 99)), "completion_tokens": 1}


def _chat_events(draw, texts, finish, key):
    choice = (lambda t: {"index": 0, "delta": {"content": t}, "finish_reason": None}) \
        if key == "chat" else (lambda t: {"index": 0, "text": t, "finish_reason": None})
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}} if key == "chat" \
        else {"index": 0, "text": ""}
    last = {"index": 0, ("delta" if key == "chat" else "text"): {} if key == "chat" else "",
            "finish_reason": finish}
    timings = {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": len(texts), "cache_n": 0}
    return ([(None, {"choices": [first]})] + [(None, {"choices": [choice(t)]}) for t in texts]
            + [(None, {"choices": [last], "usage": _usage(draw), "timings": timings})])


_STOPS = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


def _anthropic_events(draw, texts, finish):
    stop = draw(st.sampled_from(sorted(_STOPS)))
    events = [("message_start", {"type": "message_start", "message": {
        "id": "m", "type": "message", "usage": {"input_tokens": 3, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"})]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": t}})
               for t in texts]
    events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
               ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop},
                                  "usage": {"output_tokens": len(texts)}})]
    return events, _STOPS[stop]


def _responses_events(texts):
    return ([("response.created", {"type": "response.created", "response": {
        "status": "in_progress"}})]
            + [("response.output_text.delta", {"type": "response.output_text.delta",
                                               "delta": t}) for t in texts]), \
        ("response.completed", {"type": "response.completed", "response": {
            "status": "completed", "usage": {"input_tokens": 3, "output_tokens": len(texts)}}})


def _whole(fmt: str, text: str, finish: str) -> tuple[dict, str]:
    if fmt == "chat":
        return {"choices": [{"message": {"role": "assistant", "content": text},
                             "finish_reason": finish}], "usage": {"prompt_tokens": 3}}, finish
    if fmt == "completions":
        return {"choices": [{"text": text, "finish_reason": finish}]}, finish
    if fmt == "anthropic":
        return {"type": "message", "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "usage": {"input_tokens": 3}}, "stop"
    return {"object": "response", "status": "completed", "output": [{"type": "message",
            "content": [{"type": "output_text", "text": text}]}]}, "stop"


_JUNK = st.sampled_from([b"{", b"[]", b'"x"', b"1e400", b"null", b"[DONE", b"\xff\xfe",
                         b'{"a":' * 5000 + b"1" + b"}" * 5000, b"[" * 5000 + b"]" * 5000])


@st.composite
def _event_bytes(draw, name, data: bytes, end: bytes) -> bytes:
    lines = []
    if draw(st.integers(0, 9)) == 0:
        lines.append(draw(st.sampled_from([b": ping", b":", b"id: 7", b"retry: 3000",
                                           b"id: \x00x", b"retry: x", b"x-field: y"])))
    if name is not None:
        lines.append(b"event: " + name.encode())
    sep = draw(st.sampled_from([b"data: ", b"data: ", b"data:"]))
    if data.startswith(b"{") and len(data) > 1 and draw(st.integers(0, 9)) == 0:
        lines += [sep + b"{", sep + data[1:]]   # two data lines, joined by a LF: valid JSON
    else:
        lines.append(sep + data)
    return b"".join(line + end for line in lines) + end


@st.composite
def scenarios(draw, fmt: str) -> Scenario:
    streamed = draw(st.integers(0, 3)) > 0
    texts = draw(st.lists(_texts, min_size=1, max_size=4))
    finish = draw(_FINISH)
    mutate, junk = draw(st.integers(0, 2)) == 0, draw(st.integers(0, 3)) == 0
    clean = not (mutate or junk)
    if not streamed:
        obj, finish = _whole(fmt, texts[0], finish)
        body = _dump(draw(_mutated(obj)) if mutate else obj)
        body = draw(_JUNK) if junk else body
        ctype = draw(st.sampled_from([b"application/json", b"application/json; charset=utf-8",
                                      b"text/plain"]))
        clean = clean and ctype != b"text/plain"
    else:
        terminator = None
        if fmt in ("chat", "completions"):
            events = _chat_events(draw, texts, finish, fmt)
            terminator = b"[DONE]"
        elif fmt == "anthropic":
            events, finish = _anthropic_events(draw, texts, finish)
            events.append(("message_stop", {"type": "message_stop"}))
        else:
            events, end_event = _responses_events(texts)
            events.append(end_event)
            finish = "stop"
        datas = [(name, _dump(draw(_mutated(obj)) if mutate and draw(st.booleans()) else obj))
                 for name, obj in events]
        if junk:
            at = draw(st.integers(0, len(datas)))
            datas.insert(at, (None, draw(_JUNK)))
        if draw(st.integers(0, 24)) == 0:   # a line near the scanner's bound, either side
            size = EVENT_BOUND + draw(st.integers(-64, 64))
            filler = b'{"choices":[{"delta":{"content":"' 
            datas.insert(1, (None, filler + b"x" * (size - len(filler) - 4) + b'"}}]}'))
            clean = False
        if terminator is not None:
            datas.append((None, terminator))
        if draw(st.integers(0, 9)) == 0:   # no end event: the stream just stops
            datas.pop()
            clean = False
        per_event = draw(st.booleans())
        end = draw(st.sampled_from([b"\n", b"\r", b"\r\n"]))
        body = b"".join(draw(_event_bytes(
            name, data, draw(st.sampled_from([b"\n", b"\r", b"\r\n"])) if per_event else end))
            for name, data in datas)
        if draw(st.integers(0, 9)) == 0:
            body = b"\xef\xbb\xbf" + body
        if draw(st.integers(0, 9)) == 0:   # the upstream's own timing line
            body = b": ttft-timing eyJ4IjoxfQ.AAAA\n\n" + body
        ctype = draw(st.sampled_from([b"text/event-stream",
                                      b"text/event-stream; charset=utf-8"]))
    if draw(st.integers(0, 9)) == 0:   # bytes flipped, inserted or cut
        data = bytearray(body)
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, max(len(data) - 1, 0)))
            data[at:at + draw(st.integers(0, 2))] = draw(st.sampled_from(
                [b"\r", b"\n", b"\n\n", b":", b"\x00", b"\xff", b"", b"data: "]))
        body, clean = bytes(data), False
    status = draw(st.sampled_from([200] * 12 + [400, 404, 429, 500, 503]))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(body) - 1, 1)), max_size=6))))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)]) if body[a:b]]
    cut = None
    if framing != "close" and len(body) > 1 and draw(st.integers(0, 9)) == 0:
        cut = draw(st.integers(0, len(body) - 1))   # early close
    clean = clean and cut is None and status == 200
    return Scenario(status, ctype, framing, pieces, cut, clean, finish[:32])


class HostileUpstream:
    """Loopback HTTP/1.1 server in its own thread and loop, answering each request with the
    scenario named by its `x-fuzz-id` (connections kept alive when the answer allows)."""

    def __init__(self) -> None:
        self.scenarios: dict[str, Scenario] = {}
        self.open_connections = 0
        self._ready = threading.Event()

    def __enter__(self) -> HostileUpstream:
        threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True).start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _serve(self, reader, writer) -> None:
        self.open_connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length:[ \t]*(\d+)", head)
                await reader.readexactly(int(length[1]) if length else 0)
                key = re.search(rb"(?i)\r\nx-fuzz-id:[ \t]*(\S+)", head)
                scenario = (self.scenarios.pop(key[1].decode()) if key else
                            Scenario(200, b"text/event-stream", "length", [NORMAL]))
                if not await self._answer(writer, scenario):
                    break
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_connections -= 1
            writer.close()

    async def _answer(self, writer, s: Scenario) -> bool:
        """Write the answer; True when the connection can carry another request."""
        head = [b"HTTP/1.1 %d X" % s.status, b"content-type: " + s.ctype]
        head += [b"content-length: %d" % len(s.body)] if s.framing == "length" else \
            [b"transfer-encoding: chunked"] if s.framing == "chunked" else [b"connection: close"]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n")
        left = len(s.sent)
        for piece in s.pieces:
            piece, left = piece[:left], left - len(piece[:left])
            if piece:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if s.framing == "chunked"
                             else piece)
                await writer.drain()
        if s.framing == "chunked" and s.cut is None:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        return s.framing != "close" and s.cut is None
