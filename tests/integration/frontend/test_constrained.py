"""Constrained decoding through the official SDKs (qwen3 family, the sim on loopback).

The sim's script breaks every constraint on purpose (two calls, prose, a wrong-typed argument, a
reasoning block longer than the budget); each API, streamed and not, must still answer as the
request demands: the sim steers its output with the grammar's mask (worker/constrained.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pydantic
import pytest
from constrained_client import (
    BASH_SCHEMA,
    READ_SCHEMA,
    anthropic_tools,
    anthropic_turn,
    chat_tools,
    chat_turn,
    responses_tools,
    responses_turn,
)
from sim_scenarios import END, qwen_call, think, write_scenario
from stack import Served, served

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "temp": {"type": "integer"}},
    "required": ["city", "temp"],
    "additionalProperties": False,
}
TWO_CALLS = (
    think("Two calls.")
    + "Sure.\n"
    + qwen_call("Bash", {"command": "ls"})
    + "\n"
    + qwen_call("Read", {"path": "a.py"})
    + END
)
WRONG_TYPE = think("Wrong type.") + qwen_call("Bash", {"command": 5}) + END
LONG_THINK = think(" ".join(["ponder"] * 600)) + "Done thinking." + END
PROSE = think("Prose.") + "The answer is 42." + END


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    rules = [
        {"match": "TWO", "output": TWO_CALLS},
        {"match": "WRONG", "output": WRONG_TYPE},
        {"match": "LONG", "output": LONG_THINK},
        {"match": "CUSTOM", "output": think("Digits.") + qwen_call("digits", {"input": "twelve"}) + END},
        {"match": "ESSAY", "output": think("Long.") + " ".join(["word"] * 400) + END},
    ]
    scenario = write_scenario(tmp_path_factory.mktemp("constrained"), rules, PROSE)
    with served({"script": scenario, "family": "qwen3", "model": "qwen3-sim"}) as s:
        yield s


STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])

# API → (tools, tool_choice none / required / named Read, no-parallel kwargs)
CHOICES: dict[str, dict[str, dict[str, Any]]] = {
    "anthropic": {
        "none": {"tools": anthropic_tools(), "tool_choice": {"type": "none"}},
        "required": {"tools": anthropic_tools(), "tool_choice": {"type": "any"}},
        "named": {"tools": anthropic_tools(), "tool_choice": {"type": "tool", "name": "Read"}},
        "single": {
            "tools": anthropic_tools(),
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        },
        "strict": {"tools": anthropic_tools(strict=True)},
    },
    "chat": {
        "none": {"tools": chat_tools(), "tool_choice": "none"},
        "required": {"tools": chat_tools(), "tool_choice": "required"},
        "named": {"tools": chat_tools(), "tool_choice": {"type": "function", "function": {"name": "Read"}}},
        "single": {"tools": chat_tools(), "parallel_tool_calls": False},
        "strict": {"tools": chat_tools(strict=True)},
    },
    "responses": {
        "none": {"tools": responses_tools(), "tool_choice": "none"},
        "required": {"tools": responses_tools(), "tool_choice": "required"},
        "named": {"tools": responses_tools(), "tool_choice": {"type": "function", "name": "Read"}},
        "single": {"tools": responses_tools(), "parallel_tool_calls": False},
        "strict": {"tools": responses_tools(strict=True)},
    },
}
TURNS = {"anthropic": anthropic_turn, "chat": chat_turn, "responses": responses_turn}
APIS = pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])


@APIS
@STREAM
def test_tool_choice_none_gets_no_call(stack: Served, api: str, stream: bool) -> None:
    text, calls = TURNS[api](stack, stream, "TWO", **CHOICES[api]["none"])
    assert calls == []
    assert "Sure." in text and "tool_call" not in text


@APIS
@STREAM
def test_required_gets_a_call_from_prose(stack: Served, api: str, stream: bool) -> None:
    text, calls = TURNS[api](stack, stream, "hello", **CHOICES[api]["required"])
    assert calls and all(name in ("Bash", "Read") for name, _ in calls)
    schemas = {"Bash": BASH_SCHEMA, "Read": READ_SCHEMA}
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name])
    assert text.strip() == ""  # a forced call: no text before it


@APIS
@STREAM
def test_named_tool_gets_that_tool_only(stack: Served, api: str, stream: bool) -> None:
    _, calls = TURNS[api](stack, stream, "TWO", **CHOICES[api]["named"])
    assert calls == [("Read", {"path": "a.py"})]


@APIS
@STREAM
def test_no_parallel_calls_gets_one_call(stack: Served, api: str, stream: bool) -> None:
    _, calls = TURNS[api](stack, stream, "TWO", **CHOICES[api]["single"])
    assert calls == [("Bash", {"command": "ls"})]


@APIS
@STREAM
def test_strict_tool_gets_valid_arguments(stack: Served, api: str, stream: bool) -> None:
    _, calls = TURNS[api](stack, stream, "WRONG", **CHOICES[api]["strict"])
    assert [name for name, _ in calls] == ["Bash"]
    jsonschema.validate(calls[0][1], BASH_SCHEMA)


@APIS
@STREAM
def test_unconstrained_script_is_unchanged(stack: Served, api: str, stream: bool) -> None:
    """The control: without a constraint the same script gives its two calls and a wrong type."""
    tools = {k: v for k, v in CHOICES[api]["none"].items() if k == "tools"}
    _, calls = TURNS[api](stack, stream, "TWO", **tools)
    assert calls == [("Bash", {"command": "ls"}), ("Read", {"path": "a.py"})]
    _, calls = TURNS[api](stack, stream, "WRONG", **tools)
    assert calls == [("Bash", {"command": 5})]


def _finish(s: Served, api: str, stream: bool, **kw: Any) -> str:
    """The turn's finish as the API words it (Chat finish_reason, Responses status, stop_reason)."""
    if api == "anthropic":
        c = anthropic.Anthropic(base_url=s.url, api_key="k", max_retries=0)
        request = {"model": "claude-x", "messages": [{"role": "user", "content": "ESSAY"}], **kw}
        if stream:
            with c.messages.stream(**request) as events:
                return str(events.get_final_message().stop_reason)
        return str(c.messages.create(**request).stop_reason)
    o = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
    if api == "chat":
        messages = [{"role": "user", "content": "ESSAY"}]
        if stream:
            chunks = o.chat.completions.create(model="m", messages=messages, stream=True, **kw)  # type: ignore[call-overload]
            return next(
                c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
            )
        return str(o.chat.completions.create(model="m", messages=messages, **kw).choices[0].finish_reason)  # type: ignore[call-overload]
    budget = kw.pop("max_tokens")
    if stream:
        events = o.responses.create(model="m", input="ESSAY", stream=True, max_output_tokens=budget, **kw)
        final = [e.response.status for e in events if e.type in ("response.completed", "response.incomplete")]
        return str(final[-1])
    return str(o.responses.create(model="m", input="ESSAY", max_output_tokens=budget, **kw).status)


CUT = {"anthropic": "max_tokens", "chat": "length", "responses": "incomplete"}


@APIS
@STREAM
@pytest.mark.parametrize("choice", ["none", "single", "strict", "unconstrained"])
def test_an_answer_cut_by_max_tokens_says_so(stack: Served, api: str, stream: bool, choice: str) -> None:
    """Free text is accepted anywhere, so a grammar accepting where the budget ran out is no sign
    that the turn ended: the finish says it was cut, as it does without a constraint."""
    kw = {"tools": CHOICES[api]["none"]["tools"]} if choice == "unconstrained" else dict(CHOICES[api][choice])
    assert _finish(stack, api, stream, max_tokens=60, **kw) == CUT[api]
    assert _finish(stack, api, stream, max_tokens=2000, **kw) != CUT[api]


FORMATS: dict[str, dict[str, Any]] = {
    "anthropic": {"output_config": {"format": {"type": "json_schema", "schema": ANSWER_SCHEMA}}},
    "chat": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
    },
    "responses": {"text": {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA}}},
}


@APIS
@STREAM
def test_json_schema_output_from_prose(stack: Served, api: str, stream: bool) -> None:
    text, calls = TURNS[api](stack, stream, "hello", **FORMATS[api])
    assert calls == []
    jsonschema.validate(json.loads(text), ANSWER_SCHEMA)


@STREAM
def test_streamed_and_whole_answers_are_the_same(stack: Served, stream: bool) -> None:
    whole = chat_turn(stack, False, "hello", **FORMATS["chat"])
    assert chat_turn(stack, stream, "hello", **FORMATS["chat"]) == whole


@STREAM
def test_thinking_budget_closes_the_reasoning(stack: Served, stream: bool) -> None:
    c = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0)
    request: dict[str, Any] = {
        "model": "claude-x",
        "max_tokens": 4000,
        "messages": [{"role": "user", "content": "LONG"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    if stream:
        with c.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = c.messages.create(**request)
    thinking = "".join(b.thinking for b in message.content if b.type == "thinking")
    tokenizer = stack.frontend.pipeline.tokenizer
    assert 0 < len(tokenizer.encode(thinking)) <= 1024
    assert "Done thinking." in "".join(b.text for b in message.content if b.type == "text")
    # Without the budget the whole thought comes through (the control).
    request.pop("thinking")
    request["thinking"] = {"type": "enabled", "budget_tokens": 3000}
    long = c.messages.create(**request)
    assert len(tokenizer.encode("".join(b.thinking for b in long.content if b.type == "thinking"))) > 1024


# --------------------------------------------------------------------------------------------------
# The SDKs' parse helpers


class Answer(pydantic.BaseModel):
    city: str
    temp: int


def test_chat_completions_parse(stack: Served) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    completion = c.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "hello"}], response_format=Answer
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Answer)


def test_responses_parse(stack: Served) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    response = c.responses.parse(model="m", input="hello", text_format=Answer)
    assert isinstance(response.output_parsed, Answer)


# --------------------------------------------------------------------------------------------------
# Bad input: the API's 400 naming the field, before any engine work


def test_invalid_schemas_are_400s(stack: Served) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    bad = {"type": "object", "properties": {"a": {"type": "strin"}}}
    with pytest.raises(openai.BadRequestError) as chat:
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": bad, "strict": True}}],
        )
    assert chat.value.body["param"] == "tools[0].function.parameters"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as fmt:
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
        )
    assert fmt.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as unsupported:
        c.responses.create(
            model="m",
            input="hi",
            text={
                "format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "format": "foo"}}
            },
        )
    assert unsupported.value.body["param"] == "text.format.schema"  # type: ignore[index]
    a = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as tool:
        a.messages.create(
            model="claude-x",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"name": "f", "input_schema": bad, "strict": True}],  # type: ignore[list-item,typeddict-unknown-key]
        )
    assert "tools.0.input_schema" in str(tool.value)


def test_choice_errors_are_400s(stack: Served) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as required:
        c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], tool_choice="required"
        )
    assert required.value.body["param"] == "tool_choice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model="m", input="hi", tool_choice="required")
    a = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="Thinking may not be enabled"):
        a.messages.create(
            model="claude-x",
            max_tokens=4000,
            messages=[{"role": "user", "content": "hi"}],
            tools=anthropic_tools(),  # type: ignore[arg-type]
            tool_choice={"type": "any"},
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    with pytest.raises(anthropic.BadRequestError, match="1024"):
        a.messages.create(
            model="claude-x",
            max_tokens=4000,
            messages=[{"role": "user", "content": "hi"}],
            thinking={"type": "enabled", "budget_tokens": 100},
        )
    with pytest.raises(anthropic.BadRequestError):
        a.messages.create(
            model="claude-x",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            tools=anthropic_tools(),  # type: ignore[arg-type]
            tool_choice={"type": "tool", "name": "Nope"},
        )


@STREAM
def test_a_custom_tools_regex_format_is_enforced(stack: Served, stream: bool) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    fmt = {"type": "grammar", "syntax": "regex", "definition": "[0-9]{2,6}"}
    tools: Any = [{"type": "custom", "name": "digits", "format": fmt}]
    if stream:
        with c.responses.stream(model="m", input="CUSTOM", tools=tools) as events:
            response = events.get_final_response()
    else:
        response = c.responses.create(model="m", input="CUSTOM", tools=tools)
    (call,) = [o for o in response.output if o.type == "custom_tool_call"]
    assert call.name == "digits" and re.fullmatch("[0-9]{2,6}", call.input)
    # The control: without the format the script's own input comes through.
    plain = c.responses.create(model="m", input="CUSTOM", tools=[{"type": "custom", "name": "digits"}])
    assert [o.input for o in plain.output if o.type == "custom_tool_call"] == ["twelve"]


DIGITS_LARK = """
// two to six digits, optionally grouped: "12", "12-34"
start: group ("-" group)?
group: DIGIT{2,3}
%import common.DIGIT
"""


@STREAM
def test_a_custom_tools_lark_format_is_enforced(stack: Served, stream: bool) -> None:
    """The script writes `twelve`; the Lark grammar (flattened into the input's regex) steers it."""
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    fmt = {"type": "grammar", "syntax": "lark", "definition": DIGITS_LARK}
    tools: Any = [{"type": "custom", "name": "digits", "format": fmt}]
    if stream:
        with c.responses.stream(model="m", input="CUSTOM", tools=tools) as events:
            response = events.get_final_response()
    else:
        response = c.responses.create(model="m", input="CUSTOM", tools=tools)
    (call,) = [o for o in response.output if o.type == "custom_tool_call"]
    assert call.name == "digits" and re.fullmatch("[0-9]{2,3}(-[0-9]{2,3})?", call.input), call.input


@STREAM
@pytest.mark.parametrize("syntax", ["lark", "regex"])
def test_a_chat_custom_tools_grammar_format_is_enforced(stack: Served, stream: bool, syntax: str) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    definition = DIGITS_LARK if syntax == "lark" else "[0-9]{2,3}(-[0-9]{2,3})?"
    fmt = {"type": "grammar", "grammar": {"syntax": syntax, "definition": definition}}
    tools: Any = [{"type": "custom", "custom": {"name": "digits", "format": fmt}}]
    messages: Any = [{"role": "user", "content": "CUSTOM"}]
    if stream:  # the SDK keeps a streamed custom call's fields as extras
        calls: list[Any] = []
        for chunk in c.chat.completions.create(model="m", messages=messages, tools=tools, stream=True):
            if chunk.choices and chunk.choices[0].delta.tool_calls:
                calls += chunk.choices[0].delta.tool_calls
        (call,) = calls
        assert call.type == "custom" and call.model_extra is not None
        inputs = call.model_extra["custom"]["input"]
    else:
        message = c.chat.completions.create(model="m", messages=messages, tools=tools).choices[0].message
        (call,) = message.tool_calls or []
        assert call.type == "custom"
        inputs = call.custom.input
    assert re.fullmatch("[0-9]{2,3}(-[0-9]{2,3})?", inputs), inputs


@pytest.mark.parametrize(
    ("definition", "message"),
    [
        ("start: (", "Invalid Lark grammar for the custom tool"),  # llguidance cannot compile it
        (
            'start: item\nitem: "(" item ")" | "x"\n',
            "This Lark grammar cannot be enforced: rule 'item' is recursive",
        ),
        ('start: /[a-z]+/\n%ignore " "\n', "This Lark grammar cannot be enforced: %ignore"),
    ],
)
def test_a_lark_format_that_cannot_be_enforced_is_a_400(stack: Served, definition: str, message: str) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    fmt = {"type": "grammar", "syntax": "lark", "definition": definition}
    with pytest.raises(openai.BadRequestError) as caught:
        c.responses.create(
            model="m", input="CUSTOM", tools=[{"type": "custom", "name": "digits", "format": fmt}]
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == "tools[0].format.definition", body
    assert body["message"].startswith(message), body


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(stack: Served) -> None:
    """qwen3's template renders no tool preamble for an empty list, so `none` sends none: the prompt
    is the one without tools, token for token (as SGLang does)."""
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    messages: Any = [{"role": "user", "content": "hello"}]
    bare = c.chat.completions.create(model="m", messages=messages)
    none = c.chat.completions.create(model="m", messages=messages, tools=chat_tools(), tool_choice="none")  # type: ignore[arg-type]
    auto = c.chat.completions.create(model="m", messages=messages, tools=chat_tools())  # type: ignore[arg-type]
    assert bare.usage is not None and none.usage is not None and auto.usage is not None
    assert none.usage.prompt_tokens == bare.usage.prompt_tokens < auto.usage.prompt_tokens


@STREAM
def test_anthropic_any_without_parallel_calls_is_exactly_one_call(stack: Served, stream: bool) -> None:
    forced = {"type": "any", "disable_parallel_tool_use": True}
    text, calls = anthropic_turn(stack, stream, "TWO", tools=anthropic_tools(), tool_choice=forced)
    assert calls == [("Bash", {"command": "ls"})] and text.strip() == ""
    _, both = anthropic_turn(stack, stream, "TWO", tools=anthropic_tools(), tool_choice={"type": "any"})
    assert len(both) == 2  # parallel calls allowed: the script's two


def test_count_tokens_counts_the_prompt_tool_choice_none_sends(stack: Served) -> None:
    a = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0)
    messages: Any = [{"role": "user", "content": "hello"}]
    none = a.messages.count_tokens(
        model="m", messages=messages, tools=anthropic_tools(), tool_choice={"type": "none"}
    )
    bare = a.messages.count_tokens(model="m", messages=messages)
    sent = a.messages.create(
        model="m", max_tokens=50, messages=messages, tools=anthropic_tools(), tool_choice={"type": "none"}
    )
    usage = sent.usage
    sent_tokens = (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    )
    assert none.input_tokens == bare.input_tokens == sent_tokens


LOOSE = {"type": "object", "properties": {"command": {"type": "string"}, "cwd": {"type": "string"}}}


def test_strict_schemas_that_break_openais_rules_are_400s_naming_the_place(stack: Served) -> None:
    """OpenAI's strict-mode rules (`api/strict.py`), through the SDK, on every strict surface; the
    same schemas without `strict` are served as written."""
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    bad_nested = {
        "type": "object",
        "properties": {
            "opts": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
        },
        "required": ["opts"],
        "additionalProperties": False,
    }
    cases: list[tuple[Any, str, str]] = [
        (
            lambda: c.chat.completions.create(
                model="m",
                messages=messages,
                tools=[
                    {"type": "function", "function": {"name": "Bash", "parameters": LOOSE, "strict": True}}
                ],
            ),
            "tools[0].function.parameters",
            "Invalid schema for function 'Bash': In context=(), 'additionalProperties' is required",
        ),
        (
            lambda: c.responses.create(
                model="m",
                input="hi",
                tools=[{"type": "function", "name": "Bash", "parameters": bad_nested, "strict": True}],
            ),
            "tools[0].parameters",
            "Invalid schema for function 'Bash': In context=('properties', 'opts'), 'additionalProperties'",
        ),
        (
            lambda: c.chat.completions.create(
                model="m",
                messages=messages,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "out", "strict": True, "schema": {**bad_nested, "required": []}},
                },
            ),
            "response_format",
            "Invalid schema for response_format 'out': In context=(), 'required' is required to be supplied",
        ),
        (
            lambda: c.responses.create(
                model="m",
                input="hi",
                text={
                    "format": {
                        "type": "json_schema",
                        "name": "out",
                        "strict": True,
                        "schema": {"type": "array"},
                    }
                },
            ),
            "text.format.schema",
            "Invalid schema for response_format 'out': schema must be a JSON Schema of 'type: \"object\"'",
        ),
    ]
    for call, param, message in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        body = caught.value.body
        assert isinstance(body, dict) and body["type"] == "invalid_request_error", body
        assert body["param"] == param and body["message"].startswith(message), body
    loose = c.chat.completions.create(
        model="m",
        messages=messages,
        tools=[{"type": "function", "function": {"name": "Bash", "parameters": LOOSE}}],
    )
    assert loose.choices[0].finish_reason in ("stop", "tool_calls")


@pytest.mark.parametrize("definition", ["(", "[0-9", "(?=a)a"])
def test_a_regex_format_that_cannot_be_compiled_is_a_400_naming_it(stack: Served, definition: str) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    fn: Any = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    custom: Any = {
        "type": "custom",
        "name": "c",
        "format": {"type": "grammar", "syntax": "regex", "definition": definition},
    }
    with pytest.raises(openai.BadRequestError) as responses:
        c.responses.create(model="m", input="hi", tools=[fn, custom])
    assert responses.value.body["param"] == "tools[1].format.definition"  # type: ignore[index]
    chat_custom: Any = {
        "type": "custom",
        "custom": {
            "name": "c",
            "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": definition}},
        },
    }
    with pytest.raises(openai.BadRequestError) as chat:
        c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], tools=[chat_custom]
        )
    assert chat.value.body["param"] == "tools[0].custom.format.grammar.definition"  # type: ignore[index]


@STREAM
def test_chat_tool_choice_can_force_a_custom_tool(stack: Served, stream: bool) -> None:
    """The script writes prose for `hello`; `{"type": "custom", ...}` forces the custom tool."""
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    tools: Any = [
        *chat_tools(),
        {
            "type": "custom",
            "custom": {
                "name": "digits",
                "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": "[0-9]{2,4}"}},
            },
        },
    ]
    messages: Any = [{"role": "user", "content": "hello"}]
    choice: Any = {"type": "custom", "custom": {"name": "digits"}}
    if stream:
        calls: list[Any] = []
        for chunk in c.chat.completions.create(
            model="m", messages=messages, tools=tools, tool_choice=choice, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.tool_calls:
                calls += chunk.choices[0].delta.tool_calls
        (call,) = calls
        assert call.model_extra is not None
        name, inputs = call.model_extra["custom"]["name"], call.model_extra["custom"]["input"]
    else:
        message = (
            c.chat.completions.create(model="m", messages=messages, tools=tools, tool_choice=choice)
            .choices[0]
            .message
        )
        (call,) = message.tool_calls or []
        assert call.type == "custom"
        name, inputs = call.custom.name, call.custom.input
    assert name == "digits" and re.fullmatch("[0-9]{2,4}", inputs), inputs


def test_a_tool_choice_naming_a_tool_of_the_other_kind_is_a_400(stack: Served) -> None:
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    fn: Any = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    custom: Any = {"type": "custom", "name": "c"}
    for choice in ({"type": "custom", "name": "f"}, {"type": "function", "name": "c"}):
        with pytest.raises(openai.BadRequestError) as caught:
            c.responses.create(model="m", input="hi", tools=[fn, custom], tool_choice=choice)  # type: ignore[arg-type]
        assert caught.value.body["param"] == "tool_choice"  # type: ignore[index]
    chat: Any = [*chat_tools(), {"type": "custom", "custom": {"name": "c"}}]
    messages: Any = [{"role": "user", "content": "hi"}]
    for named in (
        {"type": "custom", "custom": {"name": "Bash"}},
        {"type": "function", "function": {"name": "c"}},
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            c.chat.completions.create(model="m", messages=messages, tools=chat, tool_choice=named)
        assert caught.value.body["param"] == "tool_choice"  # type: ignore[index]
    allowed: Any = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "c"}}]},
    }
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="m", messages=messages, tools=chat, tool_choice=allowed)


def test_a_json_schema_format_needs_its_name_and_schema(stack: Served) -> None:
    """OpenAI requires both (Chat: the name; Responses: the name and the schema)."""
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as chat:
        c.chat.completions.create(
            model="m",
            messages=messages,
            response_format={"type": "json_schema", "json_schema": {"schema": ANSWER_SCHEMA}},
        )  # type: ignore[typeddict-item]
    assert chat.value.body["param"] == "response_format.json_schema.name"  # type: ignore[index]
    for fmt, missing in (({"schema": ANSWER_SCHEMA}, "name"), ({"name": "a"}, "schema")):
        with pytest.raises(openai.BadRequestError) as caught:
            c.responses.create(model="m", input="hi", text={"format": {"type": "json_schema", **fmt}})  # type: ignore[typeddict-item]
        assert caught.value.body["param"] == f"text.format.{missing}"  # type: ignore[index]
