"""ChatTemplate renders the GGUF's template exactly as transformers' apply_chat_template."""
from __future__ import annotations

from datetime import datetime

import pytest

from instrumented_engine.model.chat_template import ChatTemplate, ChatTemplateError


CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "What is the capital of France?"}],
    "system_user": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of France?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. 你好 😀"},
        {"role": "user", "content": "Say it again\n\twith  spacing."},
    ],
    "none_valued_key": [{"role": "user", "content": "x", "name": None}],
}


@pytest.fixture(scope="module")
def template(tokenizer) -> ChatTemplate:
    return ChatTemplate(tokenizer.chat_template_source, tokenizer.bos_token, tokenizer.eos_token)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_render_matches_transformers(template, reference, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert template.render(messages, add_generation_prompt=add_generation_prompt) == expected


def test_default_adds_generation_prompt(template):
    rendered = template.render(CONVERSATIONS["user_only"])
    assert rendered.endswith("<|im_start|>assistant\n")
    assert "You are a helpful AI assistant named SmolLM" in rendered  # the template's default system


def test_helpers_match_transformers(reference):
    source = ("{{ bos_token }}{{ messages | tojson }}|{{ {'b': '<&>'} | tojson(indent=2) }}"
              "{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}[{{ m.role }}]{% endfor %}"
              "{% if tools is not none %}TOOLS{% endif %}{{ eos_token }}")
    template = ChatTemplate(source, reference.bos_token, reference.eos_token)
    messages = CONVERSATIONS["multi_turn"]
    expected = reference.apply_chat_template(messages, chat_template=source, tokenize=False)
    assert template.render(messages, add_generation_prompt=False) == expected
    assert "<&>" in expected and "TOOLS" not in expected


def test_strftime_now_uses_injected_clock():
    template = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}", "<s>", "</s>", now=lambda: datetime(2024, 2, 29))
    assert template.render([]) == "2024-02-29"


def test_raise_exception_becomes_chat_template_error():
    source = ("{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
              "{{ raise_exception('Unsupported role: ' + m.role) }}{% endif %}{{ m.content }}{% endfor %}")
    template = ChatTemplate(source, "<s>", "</s>")
    assert template.render([{"role": "user", "content": "ok"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="Unsupported role: tool"):
        template.render([{"role": "tool", "content": "x"}])


def test_content_of_wrong_type_is_rejected(template):
    # OpenAI content parts reach a template that concatenates strings.
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user"}])  # undefined content


@pytest.mark.parametrize("messages", ["just a string", [42], [["role", "user"]], None])
def test_malformed_messages_are_rejected(template, messages):
    with pytest.raises(ChatTemplateError):
        template.render(messages)


def test_broken_template_source_is_rejected():
    with pytest.raises(ChatTemplateError, match="invalid chat template"):
        ChatTemplate("{% for m in messages %}{{ m.content }}", "<s>", "</s>")


def test_sandbox_blocks_attribute_escape():
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", "<s>", "</s>")
    with pytest.raises(ChatTemplateError):
        template.render([])


def test_is_a_value_error():
    assert issubclass(ChatTemplateError, ValueError)
