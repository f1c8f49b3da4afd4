from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.api.anthropic import decode_messages
from agentserve.api.errors import InvalidRequestError
from agentserve.api.identity import AgentIdentity, BodyIdentity, resolve_identity, session_from_user_id
from agentserve.api.nvext import MAX_ID_LENGTH, AgentContext, AgentHints, is_valid_id, parse_nvext
from agentserve.api.responses import decode_responses
from agentserve.api.signing import Signer

from .harness_bodies import (
    CLAUDE_CODE_HEADERS,
    CLAUDE_SESSION,
    CLAUDE_USER_ID,
    CODEX_HEADERS,
    CODEX_THREAD,
    claude_code_turn1,
    codex_turn1,
)


def test_claude_code_root_session() -> None:
    ident = resolve_identity(CLAUDE_CODE_HEADERS)
    assert ident == AgentIdentity(CLAUDE_SESSION, None, CLAUDE_SESSION, "header:x-claude-code-session-id")


def test_claude_code_subagent() -> None:
    headers = CLAUDE_CODE_HEADERS | {
        "x-claude-code-agent-id": "agent-7",
        "x-claude-code-parent-agent-id": "agent-1",
    }
    assert resolve_identity(headers) == AgentIdentity(
        "agent-7",
        "agent-1",
        CLAUDE_SESSION,
        "header:x-claude-code-agent-id",
        parent_source="header:x-claude-code-parent-agent-id",
    )
    no_parent = CLAUDE_CODE_HEADERS | {"X-Claude-Code-Agent-Id": "agent-7"}
    assert resolve_identity(no_parent).parent_session_id == CLAUDE_SESSION


def test_codex_and_opencode_headers() -> None:
    assert resolve_identity(CODEX_HEADERS).session_id == CODEX_THREAD
    assert resolve_identity({"thread-id": "t1"}).session_id == "t1"
    assert resolve_identity({"session_id": "s_1"}).session_id == "s_1"
    child = resolve_identity(
        {"session-id": "c", "x-codex-parent-thread-id": "p", "x-openai-subagent": "collab_spawn"}
    )
    assert (child.session_id, child.parent_session_id, child.subagent_kind) == ("c", "p", "collab_spawn")
    assert child.parent_source == "header:x-codex-parent-thread-id"
    oc = resolve_identity({"x-session-id": "ses_1", "x-parent-session-id": "ses_0"})
    assert (oc.session_id, oc.parent_session_id) == ("ses_1", "ses_0")


def test_canonical_wins_over_everything() -> None:
    headers = CLAUDE_CODE_HEADERS | {
        "X-Dynamo-Session-ID": "dyn",
        "x-agentserve-session-id": "ours",
        "x-agentserve-trajectory-id": "traj",
        "X-Dynamo-Parent-Session-ID": "dyn-parent",
    }
    ident = resolve_identity(
        headers, AgentContext("ctx", "ctx-parent", "ctx-traj"), BodyIdentity("body", "metadata.user_id")
    )
    assert ident == AgentIdentity(
        "ours", "dyn-parent", "traj", "header:x-agentserve-session-id", "header:x-dynamo-parent-session-id"
    )
    dynamo = resolve_identity({"x-dynamo-session-id": "dyn"}, AgentContext("ctx"))
    assert dynamo.session_id == "dyn"
    ctx = resolve_identity(CODEX_HEADERS, AgentContext("ctx", None, "t"))
    assert (ctx.session_id, ctx.trajectory_id, ctx.source) == ("ctx", "t", "nvext.agent_context")


def test_body_is_the_last_resort() -> None:
    ident = resolve_identity({}, None, BodyIdentity("from-body", "prompt_cache_key"))
    assert (ident.session_id, ident.source) == ("from-body", "prompt_cache_key")
    assert resolve_identity({}) == AgentIdentity()


def test_user_id_forms() -> None:
    assert session_from_user_id(CLAUDE_USER_ID) == CLAUDE_SESSION
    legacy = "user_" + "ab" * 32 + "_account_1234_session_0b7c1d2e-aaaa-bbbb-cccc-000000000000"
    assert session_from_user_id(legacy) == "0b7c1d2e-aaaa-bbbb-cccc-000000000000"
    for bad in (
        "plain-user",
        '{"session_id": 5}',
        '{"session_id": "has space"}',
        "{not json",
        "[]",
        "x_session_",
    ):
        assert session_from_user_id(bad) is None


def test_untrusted_ids_are_bounded() -> None:
    too_long = "a" * (MAX_ID_LENGTH + 1)
    # Harness headers that do not fit are skipped, not trusted and not an error.
    assert resolve_identity({"x-claude-code-session-id": too_long, "session-id": "ok"}).session_id == "ok"
    assert resolve_identity({"session-id": "bad value\n"}).session_id is None
    # Our own headers are the caller's contract: a bad one is a 400.
    for name in ("x-agentserve-session-id", "X-Dynamo-Session-ID", "x-agentserve-trajectory-id"):
        with pytest.raises(InvalidRequestError) as err:
            resolve_identity({name: too_long})
        assert err.value.param == name.lower()


@given(st.text(max_size=200))
def test_valid_ids_are_printable_and_bounded(value: str) -> None:
    if is_valid_id(value):
        assert 1 <= len(value) <= MAX_ID_LENGTH
        assert value.isascii() and value.isprintable() and not any(c in value for c in " \"'\\<>\n")


def test_nvext() -> None:
    nv = parse_nvext(
        {
            "agent_hints": {
                "priority": 5,
                "osl": 512,
                "speculative_prefill": True,
                "latency_sensitivity": 1.0,
            },
            "agent_context": {"session_id": "s", "trajectory_id": "t", "workflow_id": "w"},
            "cache_salt": "salt",
            "backend_instance_id": 3,
        }
    )
    assert nv.agent_hints == AgentHints(5, 512, True)
    assert nv.agent_context == AgentContext("s", None, "t")
    assert nv.cache_salt == "salt"
    assert nv.ignored == (
        "nvext.backend_instance_id",
        "nvext.agent_hints.latency_sensitivity",
        "nvext.agent_context.workflow_id",
    )
    assert parse_nvext(None) == parse_nvext({})


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ([], "nvext"),
        ({"agent_hints": []}, "nvext.agent_hints"),
        ({"agent_hints": {"priority": 2**31}}, "nvext.agent_hints.priority"),
        ({"agent_hints": {"priority": True}}, "nvext.agent_hints.priority"),
        ({"agent_hints": {"osl": -1}}, "nvext.agent_hints.osl"),
        ({"agent_hints": {"speculative_prefill": "yes"}}, "nvext.agent_hints.speculative_prefill"),
        ({"agent_context": {"session_id": ""}}, "nvext.agent_context.session_id"),
        ({"agent_context": {"trajectory_id": 7}}, "nvext.agent_context.trajectory_id"),
        ({"cache_salt": "x" * 300}, "nvext.cache_salt"),
    ],
)
def test_nvext_errors(value: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse_nvext(value)
    assert err.value.param == param


def test_decoded_requests_resolve_their_identity() -> None:
    claude = decode_messages(claude_code_turn1())
    assert claude.agent_identity({}).session_id == CLAUDE_SESSION  # from metadata.user_id alone
    assert claude.agent_identity({}).source == "metadata.user_id"
    assert claude.agent_identity(CLAUDE_CODE_HEADERS).source == "header:x-claude-code-session-id"
    codex = decode_responses(
        codex_turn1() | {"nvext": {"agent_context": {"session_id": "explicit"}}}, signer=Signer.random()
    )
    assert codex.agent_identity(CODEX_HEADERS).session_id == "explicit"
    assert codex.agent_identity({"x-agentserve-session-id": "mine"}).session_id == "mine"
