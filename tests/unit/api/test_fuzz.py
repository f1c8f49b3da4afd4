"""Decoders answer every input with a decoded request or an ApiError, never anything else.

Two generators: arbitrary JSON values, and realistic harness bodies with random mutations at random
places (values swapped for other JSON, keys deleted, type/role tags swapped for other known tags),
which reach far deeper into the decoders than random JSON does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentserve.api.anthropic import decode_count_tokens, decode_messages
from agentserve.api.chat import decode_chat
from agentserve.api.errors import ApiError
from agentserve.api.memory import CallMemory
from agentserve.api.responses import ResponseStore, decode_responses
from agentserve.api.signing import Signer
from agentserve.conversation import Conversation, Image, Message, Reasoning, Text, ToolCall, ToolResult

from .harness_bodies import claude_code_turn1, claude_code_turn2, codex_turn1, openclaw_turn1, pi_turn1

SIGNER = Signer(b"f" * 32)
MEMORY = CallMemory()
MEMORY.remember(
    Message("assistant", (Reasoning("r"), Text("t"), ToolCall("call_1", "bash", '{"command": "ls"}')))
)
STORE = ResponseStore()
STORE.put("resp_1", (Message("assistant", (ToolCall("call_9", "f", "{}"),)),))

Decoder = Callable[[Any], Any]
DECODERS: dict[str, Decoder] = {
    "messages": lambda b: decode_messages(b, memory=MEMORY, signer=SIGNER),
    "count_tokens": decode_count_tokens,
    "chat": lambda b: decode_chat(b, memory=MEMORY),
    "responses": lambda b: decode_responses(b, signer=SIGNER, store=STORE),
}

TAGS = [
    "text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking", "message",
    "reasoning", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
    "user", "assistant", "system", "developer", "tool", "function", "input_text", "output_text", "image_url",
    "input_image", "reasoning_text", "namespace", "custom", "additional_tools", "enabled", "adaptive",
    "base64", "url", "auto", "any", "none", "required", "toolu_1", "call_1", "call_9", "resp_1",
    "toolu__Y2FsbF8x", "asr1.xx.yy", '{"command": "ls"}', "{", "",
]  # fmt: skip
KEYS = [
    "type", "role", "content", "text", "id", "call_id", "name", "input", "arguments", "tool_use_id",
    "output", "tool_calls", "tool_call_id", "encrypted_content", "summary", "source", "function", "tools",
    "tool_choice", "thinking", "reasoning", "reasoning_content", "previous_response_id", "nvext", "metadata",
    "user_id", "max_tokens", "model", "messages", "system", "instructions", "n", "stop", "data", "media_type",
    "is_error",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(TAGS),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=4),
    ),
    max_leaves=20,
)


def bodies() -> list[tuple[str, dict[str, Any]]]:
    assistant = [
        {"type": "thinking", "thinking": "plan", "signature": "s"},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
    ]
    chat_history = pi_turn1()
    chat_history["messages"] += [
        {"role": "assistant", "content": "t", "reasoning_content": "r",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "out"},
    ]  # fmt: skip
    codex = codex_turn1()
    codex["input"] += [
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "r"}],
         "encrypted_content": SIGNER.seal_reasoning("r")},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1",
         "output": [{"type": "input_text", "text": "x"}]},
    ]  # fmt: skip
    return [
        ("messages", claude_code_turn1()),
        ("messages", claude_code_turn2(assistant, "toolu_1")),
        ("chat", chat_history),
        ("chat", openclaw_turn1()),
        ("responses", codex),
    ]


BODIES = bodies()


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name, original = draw(st.sampled_from(BODIES))
    body = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(paths(body)[1:]))
        parent: Any = body
        for step in where[:-1]:
            parent = parent[step]
        last = where[-1]
        action = draw(st.sampled_from(["replace", "delete", "tag", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[last]
        elif action == "delete" and isinstance(parent, list):
            parent.pop(last)
        elif action == "tag":
            parent[last] = draw(st.sampled_from(TAGS))
        elif action == "add" and isinstance(parent[last], dict):
            parent[last][draw(st.sampled_from(KEYS))] = draw(json_values)
        else:
            parent[last] = draw(json_values)
    return name, body


def well_typed(conv: Conversation) -> None:
    """Decoded values have the types the rest of the pipeline relies on."""
    assert all(type(t) is Text and type(t.text) is str for t in conv.system)
    for m in conv.messages:
        assert m.role in ("system", "user", "assistant", "tool") and type(m.parts) is tuple
        for p in m.parts:
            if isinstance(p, Text | Reasoning):
                assert type(p.text) is str
            if isinstance(p, Reasoning):
                assert p.signature is None or type(p.signature) is str
            elif isinstance(p, ToolCall):
                assert (
                    type(p.id) is str and p.id and type(p.name) is str and p.name and type(p.arguments) is str
                )
            elif isinstance(p, ToolResult):
                assert type(p.call_id) is str and type(p.is_error) is bool and type(p.name) is str
                assert all(isinstance(c, Text | Image) for c in p.content)
            elif isinstance(p, Image):
                assert all(type(v) is str for v in (p.media_type, p.data, p.url))
            else:
                assert isinstance(p, Text)
    for t in conv.tools:
        assert type(t.name) is str and t.name and type(t.description) is str and type(t.parameters) is dict


def decode_or_api_error(decoder: Decoder, body: Any) -> None:
    try:
        decoded = decoder(body)
    except ApiError as err:
        assert err.status_for("openai") in (400, 404, 413) and err.message
        assert err.anthropic_body()["error"]["type"] and err.openai_body()["error"]["type"]
        return
    well_typed(decoded.conversation)
    o = decoded.options
    assert type(o.model) is str and all(type(x) is str for x in o.stop)
    assert o.max_tokens is None or type(o.max_tokens) is int
    assert all(v is None or type(v) is float for v in (o.temperature, o.top_p))


@settings(max_examples=300)
@given(st.sampled_from(sorted(DECODERS)), json_values)
def test_arbitrary_json(name: str, body: Any) -> None:
    decode_or_api_error(DECODERS[name], body)


@settings(max_examples=1000)
@given(mutated())
def test_randomly_mutated_harness_bodies(case: tuple[str, dict[str, Any]]) -> None:
    name, body = case
    decode_or_api_error(DECODERS[name], body)


REPLACEMENTS: list[Any] = [None, True, 1, 1.5, "x", "", [], {}, [{}], {"type": "text"}]


def test_every_single_mutation_of_every_harness_body() -> None:
    """Exhaustive: each place in each body deleted or replaced by each kind of JSON value."""
    count = 0
    for name, original in BODIES:
        for where in paths(original)[1:]:
            for replacement in [*REPLACEMENTS, DELETE]:
                body = copy.deepcopy(original)
                parent: Any = body
                for step in where[:-1]:
                    parent = parent[step]
                if replacement is DELETE:
                    del parent[where[-1]]
                else:
                    parent[where[-1]] = replacement
                decode_or_api_error(DECODERS[name], body)
                count += 1
    assert count > 3000


DELETE = object()


def test_unmutated_bodies_decode() -> None:
    for name, body in BODIES:
        decode_or_api_error(DECODERS[name], body)
        DECODERS[name](body)  # and not by an error
