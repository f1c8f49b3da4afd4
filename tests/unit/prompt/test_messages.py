"""Conversation → template messages: roles, merging, tool results, native ids, reasoning placement."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentserve.conversation import (
    Conversation,
    Image,
    Message,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
)
from agentserve.prompt.markup import FamilyMarkup
from agentserve.prompt.messages import UnsupportedContentError, template_messages
from agentserve.prompt.replay import ReplayMode
from agentserve.prompt.template import ToolArguments

CHATML = FamilyMarkup("<think>\n", "\n</think>\n\n", "keep", system_anywhere=True)
NO_MID_SYSTEM = FamilyMarkup("<think>\n", "\n</think>\n\n", "keep", system_anywhere=False)


def user(*parts: Any) -> Message:
    return Message("user", tuple(Text(p) if isinstance(p, str) else p for p in parts))


def assistant(*parts: Any) -> Message:
    return Message("assistant", tuple(Text(p) if isinstance(p, str) else p for p in parts))


def render(
    *messages: Message, markup: FamilyMarkup = CHATML, mode: ReplayMode = "native", system: str = ""
) -> list[dict[str, Any]]:
    conv = Conversation((Text(system),) if system else (), tuple(messages))
    return template_messages(conv, markup, mode)


def roles(out: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in out]


def test_system_parts_and_leading_system_messages_form_one_system_prompt() -> None:
    out = render(Message("system", (Text("b"),)), user("hi"), system="a")
    assert out == [{"role": "system", "content": "a\nb"}, {"role": "user", "content": "hi"}]


def test_a_mid_conversation_system_message_stays_system_where_the_markup_allows() -> None:
    out = render(user("hi"), Message("system", (Text("agents: x"),)), system="s")
    assert roles(out) == ["system", "user", "system"]
    assert out[2]["content"] == "agents: x"


def test_a_mid_conversation_system_message_becomes_user_text_elsewhere_and_merges() -> None:
    out = render(user("hi"), Message("system", (Text("agents: x"),)), markup=NO_MID_SYSTEM, system="s")
    assert out == [{"role": "system", "content": "s"}, {"role": "user", "content": "hi\n\nagents: x"}]


def test_consecutive_user_messages_merge_and_parts_join_by_newline() -> None:
    out = render(user("a", "b"), user("c"))
    assert out == [{"role": "user", "content": "a\nb\n\nc"}]


def test_consecutive_assistant_messages_are_one_turn() -> None:
    out = render(user("q"), assistant(Reasoning("r")), assistant("answer"))
    assert out[1:] == [{"role": "assistant", "content": "answer", "reasoning_content": "r"}]


def test_tool_results_become_tool_messages_in_order_with_names_and_following_text() -> None:
    call = ToolCall("toolu_1", "Bash", '{"command": "ls"}')
    out = render(
        user("q"),
        assistant(call),
        user(ToolResult("toolu_1", (Text("a"), Text("b"))), "<system-reminder>x</system-reminder>"),
    )
    assert out[2] == {"role": "tool", "tool_call_id": "toolu_1", "name": "Bash", "content": "a\nb"}
    assert out[3] == {"role": "user", "content": "<system-reminder>x</system-reminder>"}


def test_text_before_a_tool_result_keeps_its_place() -> None:
    out = render(user("q"), assistant(ToolCall("1", "f")), user("note", ToolResult("1", (Text("r"),))))
    assert roles(out) == ["user", "assistant", "user", "tool"]


def test_tool_call_arguments_are_a_dict_that_remembers_the_text() -> None:
    out = render(user("q"), assistant(ToolCall("1", "f", '{"b": 2,"a": 1}')))
    args = out[1]["tool_calls"][0]["function"]["arguments"]
    assert isinstance(args, ToolArguments)
    assert dict(args) == {"b": 2, "a": 1}
    assert args.raw == '{"b": 2,"a": 1}'
    assert out[1]["tool_calls"][0]["type"] == "function"


def test_empty_arguments_are_an_empty_object() -> None:
    out = render(user("q"), assistant(ToolCall("1", "f", "")))
    assert out[1]["tool_calls"][0]["function"]["arguments"].raw == "{}"


def test_kimi_ids_are_mapped_consistently_and_native_ones_kept() -> None:
    kimi = FamilyMarkup("<think>", "</think>", "kimi", True)
    out = render(
        user("q"),
        assistant(ToolCall("toolu_a", "get_weather"), ToolCall("functions.ls:7", "ls")),
        user(ToolResult("toolu_a", (Text("1"),)), ToolResult("functions.ls:7", (Text("2"),))),
        assistant(ToolCall("call_b", "read")),
        markup=kimi,
    )
    assert [c["id"] for c in out[1]["tool_calls"]] == ["functions.get_weather:0", "functions.ls:7"]
    assert [m["tool_call_id"] for m in out[2:4]] == ["functions.get_weather:0", "functions.ls:7"]
    assert out[4]["tool_calls"][0]["id"] == "functions.read:2"


def test_mistral_ids_are_nine_alphanumerics_deterministic_and_shared_with_results() -> None:
    mistral = FamilyMarkup("[THINK]", "[/THINK]", "mistral", True)
    conv = (user("q"), assistant(ToolCall("toolu_01ABC", "f"), ToolCall("abcDEF123", "g")))
    results = user(ToolResult("toolu_01ABC", (Text("r"),)))
    out = render(*conv, results, markup=mistral)
    mapped = out[1]["tool_calls"][0]["id"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", mapped)
    assert out[1]["tool_calls"][1]["id"] == "abcDEF123"
    assert out[2]["tool_call_id"] == mapped
    assert render(*conv, results, markup=mistral)[1]["tool_calls"][0]["id"] == mapped


@pytest.mark.parametrize(
    "message",
    [
        user("look", Image("image/png", "AAAA")),
        user(ToolResult("1", (Image(url="http://x/y.png"),))),
        Message("system", (Image(url="http://x/y.png"),)),
    ],
)
def test_images_are_refused_with_a_clear_error(message: Message) -> None:
    with pytest.raises(UnsupportedContentError, match="text only"):
        render(message)


def test_reasoning_goes_where_the_mode_says() -> None:
    turn = assistant(Reasoning("why"), "text", ToolCall("1", "f"))
    native = render(user("q"), turn, mode="native")[1]
    inject = render(user("q"), turn, mode="inject")[1]
    drop = render(user("q"), turn, mode="drop")[1]
    assert native["reasoning_content"] == "why" and native["content"] == "text"
    assert inject["content"] == "<think>\nwhy\n</think>\n\ntext" and "reasoning_content" not in inject
    assert drop["content"] == "text" and "reasoning_content" not in drop


def test_native_mode_fills_every_key_the_template_reads() -> None:
    conv = Conversation((), (user("q"), assistant(Reasoning("why"), "a")))
    out = template_messages(conv, CHATML, "native", ("reasoning_content", "thinking"))
    assert out[1]["reasoning_content"] == out[1]["thinking"] == "why"


def test_interleaved_reasoning_splits_the_turn_into_runs() -> None:
    turn = assistant(Reasoning("r1"), ToolCall("1", "a"), Reasoning("r2"), ToolCall("2", "b"), "done")
    out = render(user("q"), turn, mode="inject")[1:]
    assert [m["content"] for m in out] == [
        "<think>\nr1\n</think>\n\n",
        "<think>\nr2\n</think>\n\n",
        "done",
    ]
    assert [[c["function"]["name"] for c in m.get("tool_calls", [])] for m in out] == [["a"], ["b"], []]


def test_a_plain_chat_turn_before_the_last_question_loses_its_reasoning() -> None:
    out = render(user("q1"), assistant(Reasoning("r"), "a1"), user("q2"), mode="native")
    assert "reasoning_content" not in out[1]


def test_an_empty_assistant_message_still_renders_as_a_turn() -> None:
    assert render(user("q"), assistant())[1] == {"role": "assistant", "content": ""}
