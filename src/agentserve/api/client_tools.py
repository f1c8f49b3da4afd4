"""Tools the provider defines and the client runs: what the model is shown for each.

Anthropic's `bash_*`, `text_editor_*`, `memory_*`, `computer_*` and OpenAI Responses' `local_shell`,
`shell`, `apply_patch` arrive without a schema: the provider trains its model on one. An open model
needs it written out, so each becomes an ordinary `ToolSpec` with the input schema the provider
documents (the field names and types of the SDKs' input models: anthropic-sdk-python
`types/beta/beta_memory_tool_20250818_*_command.py`, `types/computer_*_input.py`; openai-python
`responses/response_output_item.py::LocalShellCallAction`, `response_function_shell_tool_call.py::Action`,
`response_apply_patch_tool_call.py::Operation*`; the text-editor and bash commands from
platform.claude.com's tool pages). The descriptions are our own short wording.
"""

from __future__ import annotations

import re
from typing import Any

from agentserve.conversation import ToolSpec

_STR = {"type": "string"}
_INT = {"type": "integer"}
_POINT = {"type": "array", "items": _INT, "minItems": 2, "maxItems": 2}

ANTHROPIC_CLIENT_TOOL = re.compile(r"^(bash|text_editor|memory|computer)_(\d{8})$")


def _obj(properties: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


def _command(values: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def _bash() -> tuple[str, dict[str, Any]]:
    return (
        "Run a command in a persistent bash shell. Set restart to true to restart the shell.",
        _obj({"command": {**_STR, "description": "the command to run"}, "restart": {"type": "boolean"}}, ()),
    )


def _text_editor(version: str, tool: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    # The 2025-04-29 and later editors dropped `undo_edit` (platform.claude.com, text editor tool).
    commands: tuple[str, ...] = ("view", "create", "str_replace", "insert")
    if version < "20250429":
        commands = (*commands, "undo_edit")
    description = (
        "View, create and edit text files. view: a file (with line numbers) or a directory; "
        "create: write file_text to path; str_replace: replace old_str (must match exactly once) with "
        "new_str; insert: insert new_str after line insert_line (0: at the start)."
    )
    limit = tool.get("max_characters")
    if type(limit) is int:
        description += f" Viewed files are cut at {limit} characters."
    return description, _obj(
        {
            "command": _command(commands),
            "path": {**_STR, "description": "absolute path of the file or directory"},
            "file_text": _STR,
            "old_str": _STR,
            "new_str": _STR,
            "insert_line": _INT,
            "view_range": {"type": "array", "items": _INT, "minItems": 2, "maxItems": 2},
        },
        ("command", "path"),
    )


def _memory() -> tuple[str, dict[str, Any]]:
    return (
        "A persistent memory directory (/memories) kept across conversations: view, create, "
        "str_replace, insert, delete and rename files in it.",
        _obj(
            {
                "command": _command(("view", "create", "str_replace", "insert", "delete", "rename")),
                "path": _STR,
                "view_range": {"type": "array", "items": _INT},
                "file_text": _STR,
                "old_str": _STR,
                "new_str": _STR,
                "insert_line": _INT,
                "insert_text": _STR,
                "old_path": _STR,
                "new_path": _STR,
            },
            ("command",),
        ),
    )


_COMPUTER_ACTIONS_2024 = (
    "key", "type", "mouse_move", "left_click", "left_click_drag", "right_click", "middle_click",
    "double_click", "screenshot", "cursor_position",
)  # fmt: skip
_COMPUTER_ACTIONS_2025 = (
    *_COMPUTER_ACTIONS_2024, "triple_click", "left_mouse_down", "left_mouse_up", "scroll", "hold_key", "wait",
)  # fmt: skip


def _computer(version: str, tool: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    actions = _COMPUTER_ACTIONS_2024 if version < "20250124" else _COMPUTER_ACTIONS_2025
    if version >= "20251124" and tool.get("enable_zoom") is True:
        actions = (*actions, "zoom")
    screen = [f"{tool[k]}" for k in ("display_width_px", "display_height_px") if type(tool.get(k)) is int]
    description = "Control the computer's screen, mouse and keyboard."
    if len(screen) == 2:
        description += f" The screen is {screen[0]}x{screen[1]} pixels."
    if type(tool.get("display_number")) is int:
        description += f" X11 display :{tool['display_number']}."
    return description, _obj(
        {
            "action": _command(actions),
            "coordinate": _POINT,
            "start_coordinate": _POINT,
            "text": _STR,
            "scroll_direction": _command(("up", "down", "left", "right")),
            "scroll_amount": _INT,
            "duration": _INT,
            "region": {"type": "array", "items": _INT, "minItems": 4, "maxItems": 4},
        },
        ("action",),
    )


def anthropic_client_tool(kind: str, tool: dict[str, Any], name: str, strict: bool) -> ToolSpec | None:
    """The ToolSpec shown for an Anthropic client tool of type `kind` (None: not a client tool)."""
    match = ANTHROPIC_CLIENT_TOOL.match(kind)
    if match is None:
        return None
    family, version = match.groups()
    if family == "bash":
        description, schema = _bash()
    elif family == "text_editor":
        description, schema = _text_editor(version, tool)
    elif family == "memory":
        description, schema = _memory()
    else:
        description, schema = _computer(version, tool)
    return ToolSpec(name, description, schema, strict)


# -- OpenAI Responses -----------------------------------------------------------------------------

RESPONSES_CLIENT_TOOLS = ("local_shell", "shell", "apply_patch")


def responses_client_tool(kind: str) -> ToolSpec:
    """The ToolSpec shown for a Responses client tool; its name is its type (as OpenAI's calls say)."""
    if kind == "local_shell":
        return ToolSpec(
            "local_shell",
            "Run a command on the user's machine; command is the argv list.",
            _obj(
                {
                    "command": {"type": "array", "items": _STR},
                    "env": {"type": "object", "additionalProperties": _STR},
                    "working_directory": _STR,
                    "timeout_ms": _INT,
                    "user": _STR,
                },
                ("command",),
            ),
        )
    if kind == "shell":
        return ToolSpec(
            "shell",
            "Run shell commands on the user's machine, in order.",
            _obj(
                {
                    "commands": {"type": "array", "items": _STR},
                    "timeout_ms": _INT,
                    "max_output_length": _INT,
                },
                ("commands",),
            ),
        )
    return ToolSpec(
        "apply_patch",
        "Create, update or delete one file. diff is a V4A diff (create_file: the new file's lines, "
        "each prefixed with +; update_file: @@ hunks).",
        _obj(
            {
                "type": _command(("create_file", "update_file", "delete_file")),
                "path": _STR,
                "diff": _STR,
            },
            ("type", "path"),
        ),
    )
