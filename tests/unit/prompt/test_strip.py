"""Volatile-span stripping: Claude Code's billing line in both shapes and every observed layout,
configured patterns, counts, and the cache effect on two conversations."""

from __future__ import annotations

import pytest

from agentserve.conversation import Conversation, Message, Text, ToolResult
from agentserve.prompt.drift import common_prefix
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.strip import (
    BILLING_RULE,
    NO_STRIPPING,
    StripPatternError,
    StripRules,
    strip_billing_line,
    strip_conversation,
)

# Every layout in reference/harness-traffic.md, protocols.md B.3 and dynamo.md section 2.
LAYOUTS = [
    "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli;",
    "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=cli;",
    "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=cli; cch=b0a49;",
    "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=cli; cch=00000;",
    "x-anthropic-billing-header: cc_version=2.1.197.d55; cc_entrypoint=cli; cc_workload=cron;",
    "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli; cch=5866b; "
    "cc_is_subagent=true;",
    "x-anthropic-billing-header: cc_version=2.1.140.a3f; cc_entrypoint=cli; cch=7be21;",
    "x-anthropic-billing-header: cc_version=0.2.93; cch=abc123def456==;",
]
IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."


@pytest.mark.parametrize("line", LAYOUTS)
def test_a_whole_first_system_block_is_dropped(line: str) -> None:
    system, removed = strip_billing_line((Text(line), Text(IDENTITY)))
    assert removed
    assert system == (Text(IDENTITY),)


@pytest.mark.parametrize("line", LAYOUTS)
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_first_line_followed_by_a_newline_is_removed(line: str, newline: str) -> None:
    system, removed = strip_billing_line((Text(line + newline + IDENTITY + "\nMore."),))
    assert removed
    assert system == (Text(IDENTITY + "\nMore."),)


def test_a_lone_billing_block_leaves_no_system_text() -> None:
    assert strip_billing_line((Text(LAYOUTS[0] + "\n"),)) == ((), True)


@pytest.mark.parametrize(
    "text",
    [
        "You are helpful.\nx-anthropic-billing-header: cc_version=1;",  # not at the start
        "x-anthropic-billing-header-like text",  # not the header
    ],
)
def test_other_system_text_is_left_alone(text: str) -> None:
    assert strip_billing_line((Text(text),)) == ((Text(text),), False)


def test_named_patterns_strip_system_user_and_tool_text_but_never_assistant_text() -> None:
    rules = StripRules.parse(True, [r"date=Today's date is \d{4}-\d{2}-\d{2}\.", r"chunk=Chunk ID: \w+\n"])
    conv = Conversation(
        (Text(LAYOUTS[0]), Text("Sys. Today's date is 2026-01-02.")),
        (
            Message("user", (Text("Today's date is 2026-01-02. Hi"),)),
            Message("assistant", (Text("Today's date is 2026-01-02."),)),
            Message("user", (ToolResult("1", (Text("Chunk ID: ab12\nok"),)),)),
        ),
    )
    out, counts = strip_conversation(conv, rules)
    assert counts == {BILLING_RULE: 1, "date": 2, "chunk": 1}
    assert out.system == (Text("Sys. "),)
    assert out.messages[0].parts == (Text(" Hi"),)
    assert out.messages[1] == conv.messages[1]
    assert out.messages[2].parts == (ToolResult("1", (Text("ok"),)),)


def test_nothing_to_strip_returns_the_same_conversation() -> None:
    conv = Conversation((Text("sys"),), (Message("user", (Text("hi"),)),))
    assert strip_conversation(conv, StripRules()) == (conv, {})
    assert strip_conversation(Conversation((Text(LAYOUTS[0]),)), NO_STRIPPING)[1] == {}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("noequals", "NAME=REGEX"),
        ("=x", "NAME=REGEX"),
        ("bad=(", "bad"),
        (f"{BILLING_RULE}=x", "reserved"),
    ],
)
def test_bad_patterns_are_configuration_errors(spec: str, message: str) -> None:
    with pytest.raises(StripPatternError, match=message):
        StripRules.parse(True, [spec])


def claude_code_request(billing: str) -> Conversation:
    return Conversation(
        (Text(billing), Text(IDENTITY), Text("Main instructions. " * 40)),
        (
            Message(
                "user", (Text("<system-reminder>Today's date is 2026-01-02.</system-reminder>"), Text("go"))
            ),
            Message("system", (Text("Agent types: general-purpose."),)),
        ),
    )


def test_two_conversations_differing_only_in_the_billing_line_render_to_identical_tokens() -> None:
    pipeline = PromptPipeline.for_family("qwen3")
    a = render_prompt(claude_code_request(LAYOUTS[2]), pipeline)
    b = render_prompt(claude_code_request(LAYOUTS[5]), pipeline)
    assert a.token_ids == b.token_ids
    assert a.block_hashes == b.block_hashes
    assert a.stripped == b.stripped == {BILLING_RULE: 1}

    # Without stripping, the two conversations share only the first few dozen tokens.
    unstripped = PromptPipeline.for_family("qwen3", strip=NO_STRIPPING)
    a = render_prompt(claude_code_request(LAYOUTS[2]), unstripped)
    b = render_prompt(claude_code_request(LAYOUTS[5]), unstripped)
    assert common_prefix(a.token_ids, b.token_ids) < 40 < len(a.token_ids)
