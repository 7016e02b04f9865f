"""Constrained decoding (instrumented_engine/engine/grammar.py): the output follows the JSON
schema and ends when the value closes; an unconstrained sequence batched with a constrained
one samples exactly the tokens it samples alone; an unusable schema is an input error."""
from __future__ import annotations

import json

import pytest

from instrumented_engine.engine.config import EngineConfig
from instrumented_engine.engine.errors import EngineInputError
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.sampling import SamplingParams

SCHEMA = json.dumps({"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 16},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False})


@pytest.fixture(scope="module")
def engine(loaded_model):
    return LLMEngine(EngineConfig(num_kv_blocks=64), loaded=loaded_model)


def _prompt(engine, text: str) -> list[int]:
    return engine.tokenize(engine.render_chat([{"role": "user", "content": text}]),
                           add_bos=False)


def _run(engine, requests: dict[str, tuple[list[int], SamplingParams]]):
    """Run the requests batched together: (text, token ids, finish reason) of each."""
    seqs = {rid: engine.add_request(rid, ids, sampling) for rid, (ids, sampling) in requests.items()}
    texts, reasons = dict.fromkeys(requests, ""), {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] += out.text
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    return {rid: (texts[rid], seq.output_token_ids, reasons[rid]) for rid, seq in seqs.items()}


def test_a_constrained_neighbour_changes_no_unconstrained_token(engine):
    free = (_prompt(engine, "Tell me about Paris."), SamplingParams(temperature=0, max_tokens=16))
    alone = _run(engine, {"free": free})["free"]
    constrained = (_prompt(engine, "What is the weather in Paris?"),
                   SamplingParams(temperature=0, max_tokens=40, json_schema=SCHEMA))
    together = _run(engine, {"json": constrained, "free": free})
    assert together["free"] == alone and alone[2] == "length"
    text, token_ids, reason = together["json"]
    value = json.loads(text)           # the grammar closed it: valid JSON, whole
    assert set(value) == {"city", "unit"} and value["unit"] in ("celsius", "fahrenheit")
    # It ended at the closing brace, without a step spent on sampling EOS.
    assert reason == "stop" and engine.tokenizer.decode(token_ids[-1:]).endswith("}")


def test_a_sampled_constrained_sequence_follows_the_schema_too(engine):
    text, _, reason = _run(engine, {"json": (_prompt(engine, "Weather in Rome?"), SamplingParams(
        temperature=1.0, seed=3, max_tokens=40, json_schema=SCHEMA))})["json"]
    assert set(json.loads(text)) == {"city", "unit"} and reason == "stop"


@pytest.mark.parametrize("schema", ['{"type": "nope"}', "not json",
                                    '{"type": "string", "pattern": "("}'])
def test_an_unusable_schema_is_an_input_error(engine, schema):
    with pytest.raises(EngineInputError) as caught:
        engine.add_request("bad", [1, 2, 3], SamplingParams(max_tokens=4, json_schema=schema))
    assert caught.value.param == "json_schema"
    assert not engine.has_unfinished()
