"""A conversation's key without a session header (issue 18, item 3): stable across turns, robust to
what harnesses vary or rewrite, and distinct for two conversations that start alike."""

from __future__ import annotations

from agentserve.conversation import Conversation, Message, Reasoning, Text, ToolCall, ToolResult, ToolSpec
from agentserve.prompt.session import anchor, conversation_key, key_after
from agentserve.prompt.strip import StripRules

TOOLS = (
    ToolSpec("bash", "Run a command.", {"type": "object", "properties": {"command": {"type": "string"}}}),
)
SYSTEM = "You are pi.\nCurrent date: 2026-11-21\nCurrent working directory: /srv/proj"
PROMPT = "run echo hello using your shell tool, then say done"


def reply(call_id: str) -> Message:
    return Message(
        "assistant",
        (Reasoning("Run it."), Text("I'll run it."), ToolCall(call_id, "bash", '{"command": "echo hello"}')),
    )


def conversation(system: str, *messages: Message, prompt: str = PROMPT) -> Conversation:
    return Conversation((Text(system),), (Message("user", (Text(prompt),)), *messages), TOOLS)


def tool_result(call_id: str, text: str = "hello\n") -> Message:
    return Message("tool", (ToolResult(call_id, (Text(text),), False, "bash"),))


def test_the_key_is_stable_from_the_second_turn_on_and_turn_one_knows_it() -> None:
    first = conversation(SYSTEM)
    produced = reply("call_0a1b2c3d4e5f60718293a4b5")
    second = conversation(SYSTEM, produced, tool_result(produced.tool_calls[0].id))
    third = conversation(
        SYSTEM,
        produced,
        tool_result(produced.tool_calls[0].id),
        Message("assistant", (Text("done."),)),
        Message("user", (Text("again"),)),
    )
    k1, k2, k3 = (conversation_key(c) for c in (first, second, third))
    assert k1 is not None and k1.startswith("conv-")
    assert k2 == k3 != k1
    # What turn 1's drift state is remembered under is what turn 2 will look up.
    assert key_after(first, produced) == k2
    assert key_after(second, Message("assistant", (Text("done."),))) == k2


def test_two_conversations_that_start_alike_do_not_merge() -> None:
    a = conversation(
        SYSTEM, reply("call_aaaaaaaaaaaaaaaaaaaaaaaa"), tool_result("call_aaaaaaaaaaaaaaaaaaaaaaaa")
    )
    b = conversation(
        SYSTEM, reply("call_bbbbbbbbbbbbbbbbbbbbbbbb"), tool_result("call_bbbbbbbbbbbbbbbbbbbbbbbb")
    )
    assert conversation_key(conversation(SYSTEM)) == conversation_key(conversation(SYSTEM))
    assert conversation_key(a) != conversation_key(b)
    # A different start is a different conversation from turn 1.
    assert conversation_key(conversation(SYSTEM, prompt="another task")) != conversation_key(
        conversation(SYSTEM)
    )
    assert conversation_key(conversation(SYSTEM + "!")) != conversation_key(conversation(SYSTEM))


def test_what_harnesses_vary_or_rewrite_does_not_change_the_key() -> None:
    produced = reply("call_0a1b2c3d4e5f60718293a4b5")
    base = conversation(SYSTEM, produced, tool_result(produced.tool_calls[0].id))
    # The date moved on (pi re-renders its system prompt), OpenClaw stripped `_` from the id and
    # re-serialised the arguments, and the client dropped the reasoning.
    echoed = Message(
        "assistant",
        (Text("I'll run it."), ToolCall("call0a1b2c3d4e5f60718293a4b5", "bash", '{"command":"echo hello"}')),
    )
    later = conversation(
        SYSTEM.replace("2026-11-21", "2026-11-22"), echoed, tool_result("call0a1b2c3d4e5f60718293a4b5")
    )
    assert conversation_key(later) == conversation_key(base)
    # OpenClaw's first user message carries a timestamp; Claude Code's billing line changes per request.
    stamped = "[Sat 2026-11-21 17:42 UTC] " + PROMPT
    assert conversation_key(conversation(SYSTEM, prompt=stamped)) == conversation_key(
        conversation(SYSTEM, prompt=stamped.replace("Sat 2026-11-21 17:42", "Sun 2026-11-22 00:03"))
    )
    billed = Conversation(
        (
            Text("x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=cli; cch=b0a49;"),
            Text(SYSTEM),
        ),
        (Message("user", (Text(PROMPT),)),),
        TOOLS,
    )
    rebilled = Conversation(
        (
            Text("x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=cli; cch=5866b;"),
            Text(SYSTEM),
        ),
        billed.messages,
        TOOLS,
    )
    assert conversation_key(billed, StripRules()) == conversation_key(rebilled, StripRules())
    # Configured strip patterns apply too.
    rules = StripRules.parse(True, ["cwd=Current working directory: \\S+"])
    moved = SYSTEM.replace("/srv/proj", "/srv/other")
    assert conversation_key(conversation(moved), rules) == conversation_key(conversation(SYSTEM), rules)


def test_a_text_reply_anchors_on_its_text() -> None:
    answer = Message("assistant", (Text("Paris is  sunny.\n"),))
    assert anchor(answer) == anchor(Message("assistant", (Text("Paris is sunny."),)))
    first = conversation(SYSTEM)
    second = conversation(SYSTEM, answer, Message("user", (Text("and Rome?"),)))
    assert key_after(first, answer) == conversation_key(second)


def test_no_user_message_no_key() -> None:
    assert conversation_key(Conversation((Text(SYSTEM),), (), TOOLS)) is None


def test_native_ids_that_repeat_anchor_on_the_calls_arguments_too() -> None:
    # Kimi numbers calls `functions.NAME:IDX`: two conversations that open alike make the same id.
    def kimi(arguments: str) -> Conversation:
        call = Message("assistant", (ToolCall("functions.bash:0", "bash", arguments),))
        return conversation(SYSTEM, call, tool_result("functions.bash:0"))

    assert conversation_key(kimi('{"command": "ls"}')) != conversation_key(kimi('{"command": "pwd"}'))
    # Re-serialised by the client (pi, OpenClaw): still the same conversation.
    assert conversation_key(kimi('{"command": "ls", "timeout": 5}')) == conversation_key(
        kimi('{"timeout":5,"command":"ls"}')
    )
    # Same opening, same first call: nothing in the requests tells them apart (docs/api-codecs.md).
    assert conversation_key(kimi('{"command": "ls"}')) == conversation_key(kimi('{"command": "ls"}'))
