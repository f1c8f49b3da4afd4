"""Issue 23 through the official SDKs: every field a request carries has its effect or is a 400.

Client-executed tool types are shown to the model and their calls come back in each API's own
shape; tool errors, documents and search results reach the prompt; Anthropic context edits are
applied and reported; Responses `truncation: auto` drops the oldest items; log-probabilities of the
answer come back in each API's shape and `logit_bias` moves the sim's distribution and choice; the
Response echoes only the tools offered; `nvext.agent_hints.speculative_prefill` warms the next
turn's prefix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import anthropic
import openai
import pytest
from sim_scenarios import END, qwen_call, think, write_scenario
from stack import Served, served

from agentserve.router.placement import RouteRequest
from agentserve.worker.engine import GenerateRequest, Retention

RULES: list[dict[str, Any]] = [
    {"match": "USEBASH", "output": think("Run it.") + qwen_call("bash", {"command": "ls"}) + END},
    {
        "match": "USEEDITOR",
        "output": qwen_call("str_replace_based_edit_tool", {"command": "view", "path": "/a.py"}) + END,
    },
    {"match": "LOCALSHELL", "output": qwen_call("local_shell", {"command": ["ls", "-la"], "env": {}}) + END},
    {"match": "SHELLTOOL", "output": qwen_call("shell", {"commands": ["ls", "pwd"]}) + END},
    {
        "match": "PATCHME",
        "output": qwen_call("apply_patch", {"type": "create_file", "path": "a.txt", "diff": "+hi\n"}) + END,
    },
    {"match": "CUSTOMME", "output": qwen_call("grep_tool", {"input": "foo bar"}) + END},
    {"match": "CALLREAD", "output": qwen_call("Read", {"path": "a.py"}) + END},
]
DEFAULT = think("Nothing left.") + "All done." + END
READ = {"name": "Read", "description": "Read a file.", "input_schema": {"type": "object"}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    scenario = write_scenario(tmp_path_factory.mktemp("contract"), RULES, DEFAULT)
    with served({"script": scenario, "context_length": 2048}) as s:
        yield s


def claude(s: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key="k", max_retries=0)


def oai(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# -- Anthropic ------------------------------------------------------------------------------------

CLIENT_TOOLS = [
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 10000},
    {"type": "memory_20250818", "name": "memory"},
    {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768},
]


def test_anthropic_client_tools_are_shown_to_the_model(stack: Served) -> None:
    c = claude(stack)
    bare = c.messages.count_tokens(model="m", messages=user("hi")).input_tokens
    seen = bare
    for i in range(1, len(CLIENT_TOOLS) + 1):  # each tool adds its schema to the prompt
        tokens = c.messages.count_tokens(model="m", messages=user("hi"), tools=CLIENT_TOOLS[:i]).input_tokens
        assert tokens > seen + 20, CLIENT_TOOLS[i - 1]["type"]
        seen = tokens


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_client_tool_calls_come_back_as_tool_use(stack: Served, stream: bool) -> None:
    c = claude(stack)
    kwargs: dict[str, Any] = {"model": "m", "max_tokens": 500, "tools": CLIENT_TOOLS}
    if stream:
        with c.messages.stream(messages=user("USEBASH now"), **kwargs) as s:
            message = s.get_final_message()
    else:
        message = c.messages.create(messages=user("USEBASH now"), **kwargs)
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert (call.name, call.input) == ("bash", {"command": "ls"})
    assert message.stop_reason == "tool_use"
    editor = c.messages.create(messages=user("USEEDITOR"), **kwargs)
    (call,) = [b for b in editor.content if b.type == "tool_use"]
    assert call.name == "str_replace_based_edit_tool" and call.input == {"command": "view", "path": "/a.py"}


def test_anthropic_a_forced_server_tool_is_a_400(stack: Served) -> None:
    with pytest.raises(anthropic.BadRequestError, match="server tool"):
        claude(stack).messages.create(
            model="m",
            max_tokens=50,
            messages=user("hi"),
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
            tool_choice={"type": "tool", "name": "web_search"},
        )


def _tool_turn(is_error: bool) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "CALLREAD"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "no such file",
                    "is_error": is_error,
                }
            ],
        },
    ]


def test_anthropic_is_error_reaches_the_prompt(stack: Served) -> None:
    c = claude(stack)

    def count(is_error: bool) -> int:
        messages = _tool_turn(is_error)
        return c.messages.count_tokens(model="m", messages=messages, tools=[READ]).input_tokens

    assert count(True) > count(False)  # the result opens with the error marker


def test_anthropic_documents_and_search_results_reach_the_prompt(stack: Served) -> None:
    c = claude(stack)
    source = {"type": "text", "media_type": "text/plain", "data": "The sky is blue."}

    def count(block: dict[str, Any]) -> int:
        content = [block, {"type": "text", "text": "what colour?"}]
        return c.messages.count_tokens(
            model="m", messages=[{"role": "user", "content": content}]
        ).input_tokens

    plain = count({"type": "document", "source": source})
    titled = count({"type": "document", "source": source, "title": "Weather notes", "context": "from 2026"})
    assert titled > plain
    result = {
        "type": "search_result",
        "source": "https://x.test/sky",
        "title": "Sky",
        "content": [{"type": "text", "text": "The sky is blue."}],
    }
    assert count(result) > count({"type": "text", "text": "-"})
    with pytest.raises(anthropic.BadRequestError, match="citations"):
        c.messages.create(
            model="m",
            max_tokens=20,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "document", "source": source, "citations": {"enabled": True}}],
                }
            ],
        )


def prompt(usage: Any) -> int:
    """The whole prompt: Anthropic's `input_tokens` counts only what the cache did not hold."""
    return int(
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    )


def _long_tool_history(uses: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "read them all"}]
    for i in range(uses):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"reading file {i}", "signature": ""},
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "Read", "input": {"path": f"f{i}.py"}},
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "line of code\n" * 40}
                ],
            }
        )
    return messages


def test_anthropic_context_edits_are_applied_and_reported(stack: Served) -> None:
    c = claude(stack)
    messages = _long_tool_history(5)
    kwargs: dict[str, Any] = {"model": "m", "max_tokens": 50, "messages": messages, "tools": [READ]}
    plain = c.beta.messages.create(**kwargs)
    edits = [
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 200},
            "keep": {"type": "tool_uses", "value": 2},
            "exclude_tools": ["Nothing"],
        },
    ]
    edited = c.beta.messages.create(
        **kwargs, context_management={"edits": edits}, betas=["context-management-2025-06-27"]
    )
    assert edited.context_management is not None
    thinking, tools = edited.context_management.applied_edits
    assert thinking.type == "clear_thinking_20251015" and thinking.cleared_thinking_turns == 4
    assert tools.type == "clear_tool_uses_20250919" and tools.cleared_tool_uses == 3
    cleared = thinking.cleared_input_tokens + tools.cleared_input_tokens
    assert cleared > 0
    assert prompt(edited.usage) == prompt(plain.usage) - cleared
    # Below the trigger nothing is cleared, and the (empty) report is still there.
    calm = dict(edits[1], trigger={"type": "input_tokens", "value": 100_000})
    quiet = c.beta.messages.create(**kwargs, context_management={"edits": [calm]})
    assert quiet.context_management is not None and quiet.context_management.applied_edits == []
    assert prompt(quiet.usage) == prompt(plain.usage)
    # Streaming: `applied_edits` on message_delta.
    with c.beta.messages.stream(**kwargs, context_management={"edits": edits}) as s:
        deltas = [e for e in s if e.type == "message_delta"]
    (delta,) = deltas
    assert delta.context_management is not None and len(delta.context_management.applied_edits) == 2
    # An edit type that is not implemented is a 400 naming it.
    with pytest.raises(anthropic.BadRequestError, match="compact_20260112"):
        c.beta.messages.create(**kwargs, context_management={"edits": [{"type": "compact_20260112"}]})


# -- Chat Completions -----------------------------------------------------------------------------

CUSTOM_TOOL = {"type": "custom", "custom": {"name": "grep_tool", "description": "Search the code."}}


@pytest.mark.parametrize("stream", [False, True])
def test_chat_custom_tool_calls_come_back_as_custom(stack: Served, stream: bool) -> None:
    c = oai(stack)
    args: dict[str, Any] = {"model": "m", "messages": user("CUSTOMME"), "tools": [CUSTOM_TOOL]}
    if stream:
        calls: list[Any] = []
        for chunk in c.chat.completions.create(**args, stream=True):
            if chunk.choices and chunk.choices[0].delta.tool_calls:
                calls += chunk.choices[0].delta.tool_calls
        (call,) = calls
        assert call.type == "custom" and call.model_extra is not None
        assert call.model_extra["custom"] == {"name": "grep_tool", "input": "foo bar"}
        return
    message = c.chat.completions.create(**args).choices[0].message
    (call,) = message.tool_calls or []
    assert call.type == "custom" and (call.custom.name, call.custom.input) == ("grep_tool", "foo bar")
    # The call goes back as history and the result is accepted.
    history = [
        *user("CUSTOMME"),
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.py:1"},
    ]
    after = c.chat.completions.create(model="m", messages=history, tools=[CUSTOM_TOOL])
    assert after.choices[0].message.content == "All done."


def test_chat_custom_tools_are_shown_to_the_model(stack: Served) -> None:
    s = stack
    body = {"model": "m", "messages": user("hi")}
    without = oai(s).chat.completions.create(**body).usage
    with_tool = oai(s).chat.completions.create(**body, tools=[CUSTOM_TOOL]).usage
    assert without is not None and with_tool is not None
    assert with_tool.prompt_tokens > without.prompt_tokens + 10


def token_id(s: Served, raw: bytes) -> int:
    """The served tokenizer's id of one token (by its bytes, as the logprobs report them)."""
    (token,) = s.frontend.constrainer.engine.tokenizer().tokenize_bytes(raw)
    return int(token)


def check_logprobs(entries: Sequence[Any], text: str, top: int) -> None:
    """The answer's tokens: their bytes spell the answer, each a log-probability with `top`
    alternatives, most likely first, the sampled token (the sim's greedy choice) leading them."""
    assert entries, "no log-probabilities"
    assert b"".join(bytes(e.bytes) for e in entries).decode() == text
    for e in entries:
        assert e.token == bytes(e.bytes).decode("utf-8", errors="backslashreplace")
        assert -30.0 < e.logprob <= 0.0
        assert len(e.top_logprobs) == top
        if top:
            assert (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)
            values = [t.logprob for t in e.top_logprobs]
            assert values == sorted(values, reverse=True)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_cover_the_answer(stack: Served, stream: bool) -> None:
    c = oai(stack)
    args: dict[str, Any] = {"model": "m", "messages": user("hi"), "logprobs": True, "top_logprobs": 3}
    if not stream:
        choice = c.chat.completions.create(**args).choices[0]
        assert choice.message.content == "All done." and choice.logprobs is not None
        entries = choice.logprobs.content or []
    else:
        chunks = list(c.chat.completions.create(**args, stream=True))
        entries = [
            e
            for ch in chunks
            for choice in ch.choices
            if choice.logprobs
            for e in choice.logprobs.content or []
        ]
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "All done."
    check_logprobs(entries, "All done.", 3)  # not the reasoning's tokens nor the markers'
    plain = c.chat.completions.create(model="m", messages=user("hi"), logprobs=True)
    assert plain.choices[0].logprobs is not None
    check_logprobs(plain.choices[0].logprobs.content or [], "All done.", 0)
    assert c.chat.completions.create(model="m", messages=user("hi")).choices[0].logprobs is None


def test_chat_logit_bias_changes_the_distribution_and_the_choice(stack: Served) -> None:
    c = oai(stack)
    base = c.chat.completions.create(model="m", messages=user("hi"), logprobs=True, top_logprobs=2)
    assert base.choices[0].logprobs is not None
    first = (base.choices[0].logprobs.content or [])[0]
    done = token_id(stack, b"Z")
    # A small bias moves a token up the ranking without changing the choice.
    nudged = c.chat.completions.create(
        model="m", messages=user("hi"), logprobs=True, top_logprobs=2, logit_bias={str(done): 5}
    )
    assert nudged.choices[0].message.content == "All done." and nudged.choices[0].logprobs is not None
    second = [
        (e.top_logprobs[1].token, e.top_logprobs[1].logprob) for e in nudged.choices[0].logprobs.content or []
    ]
    assert {token for token, _ in second} == {"Z"}
    assert all(lp > first.top_logprobs[1].logprob + 4 for _, lp in second)
    # -100 bans the answer's first token: the sim takes another one there.
    banned = c.chat.completions.create(
        model="m",
        messages=user("hi"),
        logprobs=True,
        logit_bias={str(token_id(stack, bytes(first.bytes))): -100},
    )
    assert banned.choices[0].message.content != "All done."
    assert first.token not in [e.token for e in banned.choices[0].logprobs.content or []][:1]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 150}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),  # not a token of the model
    ],
)
def test_chat_bad_logprobs_and_logit_bias_are_400s(stack: Served, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai(stack).chat.completions.create(model="m", messages=user("hi"), **fields)
    assert caught.value.body["param"] == param


def test_chat_a_hosted_tool_type_is_refused(stack: Served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai(stack).chat.completions.create(model="m", messages=user("hi"), tools=[{"type": "web_search"}])
    assert caught.value.body["param"] == "tools[0].type"


# -- Responses ------------------------------------------------------------------------------------

RESPONSES_CLIENT_TOOLS = [{"type": "local_shell"}, {"type": "shell"}, {"type": "apply_patch"}]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_client_tool_calls_come_back_in_their_own_items(stack: Served, stream: bool) -> None:
    c = oai(stack)

    def output(prompt: str) -> Any:
        args: dict[str, Any] = {"model": "m", "input": prompt, "tools": RESPONSES_CLIENT_TOOLS}
        if not stream:
            return c.responses.create(**args).output
        events = c.responses.create(**args, stream=True)
        return [e.item for e in events if e.type == "response.output_item.done"]

    (local,) = output("LOCALSHELL")
    assert local.type == "local_shell_call" and local.action.command == ["ls", "-la"]
    assert local.action.type == "exec" and local.status == "completed"
    (shell,) = output("SHELLTOOL")
    assert shell.type == "shell_call" and shell.action.commands == ["ls", "pwd"]
    (patch,) = output("PATCHME")
    assert patch.type == "apply_patch_call"
    assert (patch.operation.type, patch.operation.path, patch.operation.diff) == (
        "create_file",
        "a.txt",
        "+hi\n",
    )


def test_responses_client_tool_history_round_trips(stack: Served) -> None:
    c = oai(stack)
    first = c.responses.create(model="m", input="LOCALSHELL", tools=RESPONSES_CLIENT_TOOLS, store=False)
    (call,) = first.output
    patch = c.responses.create(model="m", input="PATCHME", tools=RESPONSES_CLIENT_TOOLS, store=False)
    (patch_call,) = patch.output
    history = [
        {"role": "user", "content": "LOCALSHELL"},
        call.model_dump(exclude_none=True),
        {"type": "local_shell_call_output", "id": call.call_id, "output": "a.py\nb.py"},
        {"role": "user", "content": "PATCHME"},
        patch_call.model_dump(exclude_none=True),
        {
            "type": "apply_patch_call_output",
            "call_id": patch_call.call_id,
            "status": "failed",
            "output": "a.txt exists",
        },
    ]
    after = c.responses.create(model="m", input=history, tools=RESPONSES_CLIENT_TOOLS)
    assert after.output_text == "All done."
    # the history reached the prompt: both calls and their outputs, the failed patch marked
    ok = dict(history[5], status="completed")
    succeeded = c.responses.create(model="m", input=[*history[:5], ok], tools=RESPONSES_CLIENT_TOOLS)
    assert after.usage is not None and succeeded.usage is not None
    assert after.usage.input_tokens > succeeded.usage.input_tokens  # the error marker


def test_responses_a_forced_hosted_tool_is_a_400(stack: Served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai(stack).responses.create(
            model="m", input="hi", tools=[{"type": "web_search"}], tool_choice={"type": "web_search"}
        )
    assert caught.value.body["param"] == "tool_choice"


@pytest.mark.parametrize("stream", [False, True])
def test_responses_logprobs_in_output_text(stack: Served, stream: bool) -> None:
    c = oai(stack)
    args: dict[str, Any] = {
        "model": "m",
        "input": "hi",
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
    }
    if not stream:
        response = c.responses.create(**args)
    else:
        events = list(c.responses.create(**args, stream=True))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        check_logprobs([lp for d in deltas for lp in d.logprobs or []], "All done.", 2)
        (done,) = [e for e in events if e.type == "response.output_text.done"]
        check_logprobs(done.logprobs or [], "All done.", 2)
        response = next(e for e in events if e.type == "response.completed").response
    assert response.output_text == "All done." and response.top_logprobs == 2
    (message,) = [item for item in response.output if item.type == "message"]
    part = message.content[0]
    assert part.type == "output_text"
    check_logprobs(part.logprobs or [], "All done.", 2)
    asked = c.responses.create(model="m", input="hi", include=["message.output_text.logprobs"])
    (message,) = [item for item in asked.output if item.type == "message"]
    assert message.content[0].type == "output_text"
    check_logprobs(message.content[0].logprobs or [], "All done.", 0)
    unasked = c.responses.create(model="m", input="hi")
    (message,) = [item for item in unasked.output if item.type == "message"]
    assert message.content[0].type == "output_text" and message.content[0].logprobs == []


def test_responses_bad_top_logprobs_is_a_400(stack: Served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai(stack).responses.create(model="m", input="hi", top_logprobs=21)
    assert caught.value.body["param"] == "top_logprobs"


def test_responses_echo_only_the_tools_offered(stack: Served) -> None:
    tools: list[Any] = [
        {"type": "web_search"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "function", "name": "Read", "parameters": {"type": "object", "properties": {}}},
        {"type": "local_shell"},
    ]
    response = oai(stack).responses.create(model="m", input="hi", tools=tools)
    assert [t.type for t in response.tools] == ["function", "local_shell"]


def test_responses_truncation_auto_drops_the_oldest_items(stack: Served) -> None:
    c = oai(stack)
    items: list[dict[str, Any]] = []
    for i in range(30):  # far past the 2048-token window
        items += [
            {"role": "user", "content": f"question {i}: " + "tell me more " * 20},
            {"role": "assistant", "content": f"answer {i}: " + "here is more " * 20},
        ]
    items.append({"role": "user", "content": "last question"})
    with pytest.raises(openai.BadRequestError) as caught:
        c.responses.create(model="m", input=items)
    assert caught.value.code == "context_length_exceeded"
    response = c.responses.create(model="m", input=items, truncation="auto")
    assert response.output_text == "All done." and response.truncation == "auto"
    assert response.usage is not None and 1024 < response.usage.input_tokens < 2048


# -- speculative prefill ------------------------------------------------------------------------------


def test_speculative_prefill_warms_the_next_turns_prefix(stack: Served) -> None:
    backend = stack.frontend.backend
    sent: list[GenerateRequest] = []
    warmed: list[tuple[Sequence[int], RouteRequest]] = []
    generate, prefill = backend.generate, backend.speculative_prefill

    async def recording_generate(request: GenerateRequest, route: RouteRequest) -> Any:
        sent.append(request)
        return await generate(request, route)

    def recording_prefill(
        ids: Sequence[int], route: RouteRequest, retention: Retention | None = None
    ) -> bool:
        warmed.append((ids, route))
        return prefill(ids, route, retention)

    backend.generate = recording_generate
    backend.speculative_prefill = recording_prefill
    try:
        c = oai(stack)
        tools = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]
        first_messages = [{"role": "user", "content": "CALLREAD spec"}]
        hint = {
            "nvext": {"agent_hints": {"speculative_prefill": True}, "agent_context": {"session_id": "spec-1"}}
        }
        first = c.chat.completions.create(model="m", messages=first_messages, tools=tools, extra_body=hint)
        assert len(warmed) == 1  # started once the turn was done
        message = first.choices[0].message
        (call,) = message.tool_calls or []
        second_messages = [
            *first_messages,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"ok": True})},
        ]
        c.chat.completions.create(model="m", messages=second_messages, tools=tools, extra_body=hint)
        turn1, turn2 = (r for r in sent if not r.request_id.startswith("warm-"))
        predicted, route = warmed[0]
        assert route.session_id == "spec-1"
        # The prediction is the next prompt's start: turn 1's prompt, its output, the template's tail.
        assert tuple(turn2.prompt_token_ids[: len(predicted)]) == tuple(predicted)
        assert len(predicted) > len(turn1.prompt_token_ids)
        # Without the hint, nothing is warmed.
        c.chat.completions.create(model="m", messages=first_messages, tools=tools)
        assert len(warmed) == 2  # the second hinted turn warmed too; the unhinted one did not
    finally:
        del backend.generate, backend.speculative_prefill


def test_anthropic_count_tokens_counts_after_the_edits(stack: Served) -> None:
    c = claude(stack)
    messages = _long_tool_history(5)
    edits = [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 200}}]
    plain = c.messages.count_tokens(model="m", messages=messages, tools=[READ]).input_tokens
    counted = c.beta.messages.count_tokens(
        model="m", messages=messages, tools=[READ], context_management={"edits": edits}
    )
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == plain
    assert counted.input_tokens < plain


def test_an_applied_context_edit_is_not_prefix_drift(stack: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="agentserve.frontend")
    c = claude(stack)
    edits = [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 200},
            "keep": {"type": "tool_uses", "value": 1},
        }
    ]

    def two_turns(session: str, *, edit: bool) -> None:
        headers = {"x-session-id": session}
        history = _long_tool_history(3)
        first = c.messages.create(
            model="m", max_tokens=50, messages=history, tools=[READ], extra_headers=headers
        )
        history += [{"role": "assistant", "content": [b.model_dump() for b in first.content]}]
        history += [{"role": "user", "content": "and now?"}]
        if edit:
            c.beta.messages.create(
                model="m",
                max_tokens=50,
                messages=history,
                tools=[READ],
                context_management={"edits": edits},
                extra_headers=headers,
            )
            return
        for message in history[2:5:2]:  # the client itself rewrites the two older results
            message["content"][0]["content"] = "[tool result cleared to save context]"
        c.messages.create(model="m", max_tokens=50, messages=history, tools=[READ], extra_headers=headers)

    two_turns("edited-session", edit=True)
    two_turns("rewritten-session", edit=False)
    assert "prefix drift in session rewritten-session" in caplog.text  # the control: drift is seen
    assert "prefix drift in session edited-session" not in caplog.text  # an edit is intended
