"""Chat templates render as in transformers: sandbox, whitespace control, HF globals and filters,
model-directory loading, and detection of templates that read reasoning."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from agentserve.prompt.template import (
    ChatTemplate,
    TemplateLoadError,
    TemplateRenderError,
    ToolArguments,
    load_model_templates,
)

USER = [{"role": "user", "content": "hi"}]


def render(source: str, messages: list[dict[str, object]] | None = None, **kwargs: object) -> str:
    return ChatTemplate(source).render(messages if messages is not None else USER, **kwargs)


def test_block_tags_do_not_leave_their_newlines_or_indentation() -> None:
    source = (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n"
        "    {% endif %}\n{% endfor %}"
    )
    assert render(source) == "[hi]\n"


def test_raise_exception_becomes_a_render_error_with_the_message() -> None:
    with pytest.raises(TemplateRenderError, match="roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}")


def test_tojson_keeps_unicode_and_markup_and_takes_formatting_options() -> None:
    value = {"b": "<é>", "a": [1, 2]}
    assert render("{{ v | tojson }}", v=value) == '{"b": "<é>", "a": [1, 2]}'
    assert render("{{ v | tojson(indent=2) }}", v={"a": 1}) == '{\n  "a": 1\n}'
    assert render("{{ v | tojson(sort_keys=true) }}", v=value) == '{"a": [1, 2], "b": "<é>"}'
    assert render("{{ v | tojson(separators=(',', ':')) }}", v=value) == '{"b":"<é>","a":[1,2]}'


def test_tool_arguments_render_as_the_models_own_text_and_iterate_as_a_dict() -> None:
    args = ToolArguments({"b": 1, "a": "x"}, '{"b":1,  "a":"x"}')
    assert render("{{ a | tojson }}", a=args) == '{"b":1,  "a":"x"}'
    assert render("{% for k, v in a.items() %}{{ k }}={{ v }};{% endfor %}", a=args) == "b=1;a=x;"
    assert render("{% for k, v in a | items %}{{ k }};{% endfor %}", a=args) == "b;a;"
    assert render("{{ a is mapping }} {{ a is string }}", a=args) == "True False"
    assert render("{{ a | tojson(indent=1) }}", a=args) == '{\n "b": 1,\n "a": "x"\n}'


def test_strftime_now_reads_the_given_moment() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5)
    assert render("{{ strftime_now('%d %b %Y') }}", now=now) == "02 Jan 2026"


def test_loop_controls_and_generation_tags_are_accepted() -> None:
    source = (
        "{% for m in [1, 2, 3, 4] %}{% if m == 2 %}{% continue %}{% endif %}"
        "{% if m == 4 %}{% break %}{% endif %}{{ m }}{% endfor %}"
        "{% generation %}!{% endgeneration %}"
    )
    assert render(source) == "13!"


def test_the_sandbox_refuses_python_internals_and_mutation() -> None:
    with pytest.raises(TemplateRenderError):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TemplateRenderError):
        render("{% set x = [] %}{{ x.append(1) }}")


def test_tools_are_none_without_tools_and_extra_arguments_reach_the_template() -> None:
    source = "{{ tools is none }} {{ enable_thinking }} {{ add_generation_prompt }} {{ bos_token }}"
    out = ChatTemplate(source).render(USER, [], enable_thinking=False, special_tokens={"bos_token": "<s>"})
    assert out == "True False True <s>"


def test_syntax_errors_are_load_errors() -> None:
    with pytest.raises(TemplateLoadError, match="broken"):
        ChatTemplate("{% for %}", "broken")


@pytest.mark.parametrize(
    ("source", "keys"),
    [
        ("{{ message.reasoning_content }}", ("reasoning_content",)),
        ("{% if message.thinking %}{% endif %}", ("thinking",)),
        ("{{ message['thinking'] }}", ("thinking",)),
        ("{% if enable_thinking %}<think>{% endif %}{{ message.content }}", ()),
    ],
)
def test_detects_which_reasoning_keys_a_template_reads(source: str, keys: tuple[str, ...]) -> None:
    assert ChatTemplate(source).reasoning_keys == keys


def test_constants_are_read_without_rendering() -> None:
    source = '{%- set a = "x\\n" %}{%- set b = true %}{%- set c = messages[0] %}{{ raise_exception("no") }}'
    assert ChatTemplate(source).constants() == {"a": "x\n", "b": True}


# -- model directories -------------------------------------------------------------------------


def write_config(path: Path, **config: object) -> None:
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def test_loads_a_string_template_and_special_tokens_from_tokenizer_config(tmp_path: Path) -> None:
    write_config(tmp_path, chat_template="{{ bos_token }}T", bos_token={"content": "<s>"}, eos_token="</s>")
    templates = load_model_templates(tmp_path)
    assert templates is not None
    assert templates.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    out = templates.select(False).render(USER, special_tokens=templates.special_tokens)
    assert out == "<s>T"


def test_named_templates_choose_tool_use_when_tools_are_given(tmp_path: Path) -> None:
    write_config(
        tmp_path,
        chat_template=[{"name": "default", "template": "D"}, {"name": "tool_use", "template": "U"}],
    )
    templates = load_model_templates(tmp_path)
    assert templates is not None
    assert templates.select(False).source == "D"
    assert templates.select(True).source == "U"


def test_chat_template_jinja_wins_over_the_config_and_an_override_wins_over_both(tmp_path: Path) -> None:
    write_config(tmp_path, chat_template="config")
    (tmp_path / "chat_template.jinja").write_text("file", encoding="utf-8")
    override = tmp_path / "mine.jinja"
    override.write_text("override", encoding="utf-8")
    loaded = load_model_templates(tmp_path)
    assert loaded is not None and loaded.select(False).source == "file"
    loaded = load_model_templates(tmp_path, override)
    assert loaded is not None and loaded.select(False).source == "override"


def test_processor_chat_template_json_is_read(tmp_path: Path) -> None:
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "P"}), encoding="utf-8")
    loaded = load_model_templates(tmp_path)
    assert loaded is not None and loaded.select(False).source == "P"


def test_a_directory_without_a_template_gives_none_and_bad_files_are_load_errors(tmp_path: Path) -> None:
    assert load_model_templates(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text("{nope", encoding="utf-8")
    with pytest.raises(TemplateLoadError, match="not valid JSON"):
        load_model_templates(tmp_path)
    write_config(tmp_path, chat_template=[{"name": "x"}])
    with pytest.raises(TemplateLoadError, match="need a 'name' and a 'template'"):
        load_model_templates(tmp_path)
