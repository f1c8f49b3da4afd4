"""Ids, signatures, SSE framing, the turn accumulator and the call memory."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentserve.api.ids import anthropic_tool_id, canonical_call_id, is_safe_id, new_id
from agentserve.api.memory import CallMemory, same_arguments
from agentserve.api.signing import Signer
from agentserve.api.sse import dumps, event, quote
from agentserve.api.turn import FailedCall, TurnAccumulator
from agentserve.conversation import Finish, Message, Reasoning, Text, ToolCall, ToolCallStart
from agentserve.parsing.events import summarize

from .helpers import parse_sse, turn

SIGNER = Signer(b"s" * 32)


@given(st.text(min_size=1, max_size=80))
def test_anthropic_tool_ids_round_trip_and_fit_the_alphabet(call_id: str) -> None:
    wire = anthropic_tool_id(call_id)
    assert is_safe_id(wire) and wire.startswith("toolu_")
    assert canonical_call_id(wire) == call_id


def test_anthropic_tool_id_examples() -> None:
    assert anthropic_tool_id("call_a1b2") == "toolu_a1b2"
    assert canonical_call_id("toolu_01AbC") == "call_01AbC"  # a real Anthropic id maps consistently
    kimi = anthropic_tool_id("functions.get_weather:0")
    assert kimi.startswith("toolu__") and canonical_call_id(kimi) == "functions.get_weather:0"
    assert canonical_call_id("toolu__!!notbase64") == "toolu__!!notbase64"
    assert canonical_call_id("my-own-id") == "my-own-id"
    assert new_id("msg_").startswith("msg_") and len(new_id("msg_")) == 28 and new_id("x") != new_id("x")


@given(st.text(max_size=300))
def test_thinking_signatures(text: str) -> None:
    sig = SIGNER.sign_thinking(text)
    assert SIGNER.verify_thinking(text, sig)
    assert not SIGNER.verify_thinking(text + "x", sig)
    assert not Signer(b"t" * 32).verify_thinking(text, sig)
    assert not SIGNER.verify_thinking(text, None) and not SIGNER.verify_thinking(text, "erased")


@given(st.text(max_size=2000))
def test_sealed_reasoning_round_trips_and_rejects_tampering(text: str) -> None:
    token = SIGNER.seal_reasoning(text)
    assert SIGNER.unseal_reasoning(token) == text
    assert Signer(b"o" * 32).unseal_reasoning(token) is None
    head, body, mac = token.split(".")
    assert SIGNER.unseal_reasoning(f"{head}.{body[:-2]}AA.{mac}") in (None, text)


@given(st.text(max_size=200))
def test_unseal_never_raises(junk: str) -> None:
    SIGNER.unseal_reasoning(junk)
    SIGNER.unseal_reasoning("asr1." + junk)


def test_signer_key_length() -> None:
    try:
        Signer(b"short")
    except ValueError:
        pass
    else:  # pragma: no cover
        raise AssertionError("short keys must be refused")
    assert Signer.random().sign_thinking("a") != Signer.random().sign_thinking("a")


@given(st.text(max_size=100))
def test_sse_frames_are_one_line_of_json(text: str) -> None:
    frame = event("x", {"t": text})
    assert frame.count(b"\n") == 3  # event line, data line, blank line
    assert parse_sse(frame) == [("x", {"t": text})]
    assert "\u2028" not in dumps(text) and "\x85" not in dumps(text)


@given(st.text(max_size=100) | st.sampled_from(["\u2028", "a\x85b", '\u2029\n"', "é\\"]))
def test_quote_is_dumps_of_a_string(text: str) -> None:
    assert quote(text) == dumps(text)
    assert json.loads(quote(text)) == text


def test_turn_accumulator_matches_the_event_invariants() -> None:
    events = turn(
        ("r", "a"), ("t", "b"), ("call", "c1", "f", '{"x": 1}'), ("r", "d"), ("bad", "c2", "g", "{", "raw")
    )
    acc = TurnAccumulator().feed_all(events)
    assert acc.items == [
        Reasoning("a"),
        Text("b"),
        ToolCall("c1", "f", '{"x": 1}'),
        Reasoning("d"),
        FailedCall("c2", "g", "raw", "malformed", "bad json"),
    ]
    assert summarize(events) == [
        {"reasoning": "a"},
        {"text": "b"},
        {"call": "f", "args": {"x": 1}},
        {"reasoning": "d"},
        {"error": "malformed", "name": "g"},
    ]
    assert acc.message(SIGNER).parts[0] == Reasoning("a", SIGNER.sign_thinking("a"))
    assert acc.message().parts[-1] == Text("raw")
    cut = TurnAccumulator().feed_all([ToolCallStart(0, "c", "f"), Finish("length")])
    assert cut.items == [FailedCall("c", "f", "", "truncated")]
    assert cut.message().parts == ()


def test_call_memory_is_bounded_scoped_and_tolerant_of_rewritten_ids() -> None:
    memory = CallMemory(max_turns=2)
    turn_a = Message("assistant", (Reasoning("r"), ToolCall("call_a_1", "f", '{"k": 1}')))
    memory.remember(turn_a, scope="s")
    memory.remember(Message("assistant", (Text("no calls"),)), scope="s")
    assert len(memory) == 1
    assert memory.turn("calla1", scope="s") is turn_a  # OpenClaw strips underscores
    assert memory.turn("call_a_1") is None  # other scope
    assert memory.restore_arguments("call_a_1", "f", {"k": 1}, scope="s") == '{"k": 1}'
    assert memory.restore_arguments("call_a_1", "g", {"k": 1}, scope="s") is None
    assert memory.restore_arguments("call_a_1", "f", {"k": 2}, scope="s") is None
    for i in range(3):
        memory.remember(Message("assistant", (ToolCall(f"call_{i}", "f"),)), scope="s")
    assert memory.turn("call_a_1", scope="s") is None and len(memory) == 2


def test_same_arguments() -> None:
    assert same_arguments('{"a": [1, 2]}', '{"a":[1,2]}')
    assert same_arguments('{"a": 1}', {"a": 1})
    assert not same_arguments('{"a": 1}', "{not json")
    assert not same_arguments("{not json", {"a": 1})
    assert json.loads('{"a": 1.0}') == {"a": 1}  # numbers compare by value, as JSON means


def test_call_memory_keeps_turns_of_conversations_whose_native_ids_repeat() -> None:
    # Kimi's ids (`functions.NAME:IDX`) are the same in every conversation: a second conversation's
    # turn must not evict the first's, and each echo gets its own turn back.
    memory = CallMemory()
    mine = Message("assistant", (Reasoning("list it"), ToolCall("functions.bash:0", "bash", '{"cmd": "ls"}')))
    other = Message(
        "assistant", (Reasoning("where am I"), ToolCall("functions.bash:0", "bash", '{"cmd": "pwd"}'))
    )
    memory.remember(mine)
    memory.remember(other)
    echo = Message("assistant", (ToolCall("functions.bash:0", "bash", '{"cmd":"ls"}'),))
    assert memory.restore_turn(echo, None) is mine
    assert memory.restore_arguments("functions.bash:0", "bash", {"cmd": "ls"}) == '{"cmd": "ls"}'
    assert memory.turn("functions.bash:0") is other  # the newest
    for i in range(5):  # a few per id at most
        memory.remember(Message("assistant", (ToolCall("functions.bash:0", "bash", f'{{"n": {i}}}'),)))
    assert memory.restore_turn(echo, None) is None and len(memory) == 1
