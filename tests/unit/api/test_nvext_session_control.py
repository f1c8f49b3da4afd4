"""`nvext.session_control` (Dynamo's experimental subagent control): parsed, validated, its ids
completing `agent_context`."""

from __future__ import annotations

from typing import Any

import pytest

from agentserve.api.errors import InvalidRequestError
from agentserve.api.identity import resolve_identity
from agentserve.api.nvext import AgentContext, SessionControl, parse_nvext


def test_session_control_names_the_session_and_its_parent() -> None:
    nv = parse_nvext(
        {"session_control": {"session_id": "child-1", "parent_session_id": "lead", "action": "open"}}
    )
    assert nv.session_control == SessionControl("child-1", "lead", "open", None)
    assert nv.agent_context == AgentContext("child-1", "lead", None)
    ident = resolve_identity({}, nv.agent_context)
    assert (ident.session_id, ident.parent_session_id) == ("child-1", "lead")


def test_agent_context_wins_and_middle_turns_send_only_the_id() -> None:
    nv = parse_nvext(
        {
            "agent_context": {"session_id": "ctx", "trajectory_id": "t"},
            "session_control": {"session_id": "sc", "parent_session_id": "p", "timeout": 300},
        }
    )
    assert nv.agent_context == AgentContext("ctx", "p", "t")
    assert nv.session_control is not None and nv.session_control.timeout_s == 300
    assert parse_nvext({"session_control": {"session_id": "s"}}).session_control == SessionControl("s")


def test_unknown_session_control_fields_are_reported_not_refused() -> None:
    nv = parse_nvext({"session_control": {"session_id": "s", "action": "close", "ttl": 5}})
    assert nv.ignored == ("nvext.session_control.ttl",)
    assert nv.session_control is not None and nv.session_control.action == "close"


@pytest.mark.parametrize(
    ("control", "param"),
    [
        ({"action": "destroy"}, "nvext.session_control.action"),
        ({"action": 1}, "nvext.session_control.action"),
        ({"session_id": "has space"}, "nvext.session_control.session_id"),
        ({"parent_session_id": "x" * 200}, "nvext.session_control.parent_session_id"),
        ({"timeout": -1}, "nvext.session_control.timeout"),
        ({"timeout": 2**40}, "nvext.session_control.timeout"),
        ({"timeout": "300"}, "nvext.session_control.timeout"),
        ("open", "nvext.session_control"),
    ],
)
def test_bad_session_control_is_a_400_naming_the_field(control: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_nvext({"session_control": control})
    assert info.value.param == param
