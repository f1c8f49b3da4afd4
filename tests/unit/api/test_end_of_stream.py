"""A call whose terminator the engine stripped is a call through every API (issue 18, item 5).

The parser dispatches complete arguments at the end of the output; the encoders then report the
finish the client acts on: Chat `tool_calls`, Anthropic `tool_use`, Responses a `function_call` item.
Incomplete arguments are text, and the finish stays `stop` / `end_turn`.
"""

from __future__ import annotations

import pytest

from agentserve.api import build_chat_completion, build_message, build_response, decode_responses
from agentserve.api.signing import Signer
from agentserve.conversation import Finish, OutputEvent, Usage
from agentserve.families import get_family
from agentserve.parsing import ParserOptions, sequential_call_id

SIGNER = Signer(b"0123456789abcdef0123456789abcdef")

# Each family's call with the terminator stripped (what an engine stopping on it returns).
STRIPPED = {
    "deepseek-v3.1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{"cmd": "ls"}',
    "kimi-k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
    '{"cmd": "ls"}',
    "gpt-oss": '<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{"cmd": "ls"}',
    "glm-4.5": "<tool_call>bash\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n",
    "qwen3-coder": "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n",
    "minimax-m2": '</think><minimax:tool_call>\n<invoke name="bash">\n<parameter name="cmd">ls</parameter>\n',
    "deepseek-r1": "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n"
    '```json\n{"cmd": "ls"}\n```',
    "qwen3": '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}',
}


def events_for(family: str, raw: str) -> list[OutputEvent]:
    fam = get_family(family)
    parser = fam.parser(ParserOptions(fam.starts_in_reasoning, (), sequential_call_id))
    return [*parser.feed(raw), *parser.close(), Finish("stop", Usage(10, 5))]


@pytest.mark.parametrize("family", sorted(STRIPPED))
def test_a_stripped_terminator_still_dispatches_through_every_api(family: str) -> None:
    events = events_for(family, STRIPPED[family])
    chat = build_chat_completion(events, model="m")
    message = chat["choices"][0]["message"]
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("bash", '{"cmd": "ls"}')
    ]
    anthropic = build_message(events, model="m", signer=SIGNER)
    assert anthropic["stop_reason"] == "tool_use"
    assert [(b["name"], b["input"]) for b in anthropic["content"] if b["type"] == "tool_use"] == [
        ("bash", {"cmd": "ls"})
    ]
    response = build_response(
        events, decode_responses({"model": "m", "input": "hi"}, signer=SIGNER), signer=SIGNER
    )
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert [(c["name"], c["arguments"]) for c in calls] == [("bash", '{"cmd": "ls"}')]


@pytest.mark.parametrize("family", sorted(STRIPPED))
def test_incomplete_arguments_at_the_end_are_text(family: str) -> None:
    raw = STRIPPED[family]
    cut = raw[: raw.rindex("ls")]  # inside the last argument value
    events = events_for(family, cut)
    chat = build_chat_completion(events, model="m")
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert not chat["choices"][0]["message"].get("tool_calls")
    assert build_message(events, model="m", signer=SIGNER)["stop_reason"] == "end_turn"
