"""Provider-defined client tools (`api/client_tools.py`) and tool errors, as the model sees them."""

from __future__ import annotations

import pytest

from agentserve.api.anthropic.decode import decode_messages
from agentserve.api.client_tools import anthropic_client_tool, responses_client_tool
from agentserve.api.errors import InvalidRequestError
from agentserve.api.responses.decode import decode_responses
from agentserve.api.signing import Signer
from agentserve.conversation import Conversation, Message, Text, ToolCall, ToolResult
from agentserve.prompt.messages import TOOL_ERROR_MARKER
from agentserve.prompt.pipeline import PromptPipeline, render_prompt

QWEN3 = PromptPipeline.for_family("qwen3")
BASH = {"name": "Bash", "description": "run", "input_schema": {"type": "object"}}


def commands(kind: str, **tool: object) -> list[str]:
    spec = anthropic_client_tool(kind, dict(tool), "t", False)
    assert spec is not None
    key = "action" if kind.startswith("computer") else "command"
    return list(spec.parameters["properties"][key]["enum"])


def test_versions_follow_anthropics_documentation() -> None:
    assert "undo_edit" in commands("text_editor_20250124")
    assert "undo_edit" not in commands("text_editor_20250728")  # dropped from 2025-04-29 on
    assert commands("memory_20250818") == ["view", "create", "str_replace", "insert", "delete", "rename"]
    assert "triple_click" not in commands("computer_20241022")
    assert "scroll" in commands("computer_20250124") and "zoom" not in commands("computer_20250124")
    assert "zoom" in commands("computer_20251124", enable_zoom=True)
    assert anthropic_client_tool("web_search_20250305", {}, "web_search", False) is None
    bash = anthropic_client_tool("bash_20250124", {}, "bash", True)
    assert bash is not None and bash.strict and set(bash.parameters["properties"]) == {"command", "restart"}


def test_client_tool_options_reach_the_description() -> None:
    editor = anthropic_client_tool("text_editor_20250728", {"max_characters": 5000}, "e", False)
    screen = anthropic_client_tool(
        "computer_20250124",
        {"display_width_px": 1280, "display_height_px": 800, "display_number": 1},
        "c",
        False,
    )
    assert editor is not None and "5000 characters" in editor.description
    assert screen is not None and "1280x800" in screen.description and ":1" in screen.description


def test_anthropic_client_tools_are_rendered_with_their_schema() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"type": "bash_20250124", "name": "bash"},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
    }
    request = decode_messages(body)
    assert [t.name for t in request.conversation.tools] == ["bash"]  # the server tool is not offered
    assert request.ignored == ("tools[1]",)
    text = render_prompt(request.conversation, QWEN3).text
    assert '"name": "bash"' in text and '"restart"' in text


def test_responses_client_tools_are_named_by_their_type() -> None:
    request = decode_responses(
        {"model": "m", "input": "hi", "tools": [{"type": "local_shell"}, {"type": "apply_patch"}]},
        signer=Signer(b"k" * 32),
    )
    assert [t.name for t in request.conversation.tools] == ["local_shell", "apply_patch"]
    assert request.tool_kinds["local_shell"].kind == "local_shell"
    assert responses_client_tool("shell").parameters["required"] == ["commands"]
    assert "diff" in responses_client_tool("apply_patch").parameters["properties"]


def test_a_failed_call_is_marked_in_the_prompt() -> None:
    def rendered(is_error: bool) -> str:
        messages = (
            Message("user", (Text("read it"),)),
            Message("assistant", (ToolCall("c1", "Read", "{}"),)),
            Message("tool", (ToolResult("c1", (Text("no such file"),), is_error, "Read"),)),
        )
        return render_prompt(Conversation((), messages), QWEN3).text

    assert TOOL_ERROR_MARKER + "no such file" in rendered(True)
    assert TOOL_ERROR_MARKER not in rendered(False)


def test_a_failed_patch_is_a_tool_error() -> None:
    call = {"type": "apply_patch_call", "call_id": "p1", "operation": {"type": "delete_file", "path": "a"}}
    out = {"type": "apply_patch_call_output", "call_id": "p1", "status": "failed", "output": "gone"}
    request = decode_responses({"model": "m", "input": [call, out]}, signer=Signer(b"k" * 32))
    (result,) = request.conversation.messages[-1].parts
    assert isinstance(result, ToolResult) and result.is_error and result.text == "gone"
    (made,) = request.conversation.messages[0].parts
    assert isinstance(made, ToolCall) and made.name == "apply_patch"


def test_allowed_tools_name_client_tools_by_type() -> None:
    request = decode_responses(
        {
            "model": "m",
            "input": "hi",
            "tools": [{"type": "shell"}, {"type": "function", "name": "f"}],
            "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "shell"}]},
        },
        signer=Signer(b"k" * 32),
    )
    assert request.options.tool_choice.allowed == ("shell",)


def test_a_client_tool_needs_its_name() -> None:
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidRequestError) as caught:
        decode_messages(body | {"tools": [{"type": "bash_20250124"}]})
    assert caught.value.param == "tools[0].name"
    with pytest.raises(InvalidRequestError, match="unique"):
        decode_messages(
            body | {"tools": [{"type": "bash_20250124", "name": "bash"}, {**BASH, "name": "bash"}]}
        )


def test_a_local_shell_output_may_name_its_call_by_item_id() -> None:
    call = {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "call_1",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
    }
    for ref in ("lsh_1", "call_1"):
        out = {"type": "local_shell_call_output", "id": ref, "output": "a.py"}
        request = decode_responses({"model": "m", "input": [call, out]}, signer=Signer(b"k" * 32))
        made, result = request.conversation.messages[0].parts[0], request.conversation.messages[1].parts[0]
        assert isinstance(made, ToolCall) and made.arguments == '{"command": ["ls"], "env": {}}'
        assert isinstance(result, ToolResult) and result.call_id == "call_1" and result.text == "a.py"
