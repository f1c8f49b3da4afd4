"""Who is asking: session, parent session and trajectory ids for routing affinity and traces.

Sources, strongest first (the first valid value wins, per field):
1. our canonical headers `x-agentserve-session-id` / `-parent-session-id` / `-trajectory-id`;
2. Dynamo's `X-Dynamo-Session-ID` / `X-Dynamo-Parent-Session-ID` / `X-Dynamo-Trajectory-ID`;
3. `nvext.agent_context` in the body;
4. the harnesses' own headers: Claude Code `X-Claude-Code-Session-Id` (the root conversation) and,
   in sub-agents, `x-claude-code-agent-id` / `x-claude-code-parent-agent-id`; Codex `session-id`,
   `thread-id`, `session_id` (parent: `x-codex-parent-thread-id`); OpenCode `x-session-id` /
   `x-parent-session-id`;
5. the body: Claude Code's `metadata.user_id` (a JSON string with `session_id`, or the legacy
   `user_…_session_<uuid>` form) and Responses' `prompt_cache_key`.

Ids are untrusted: bounded length and charset (`nvext.is_valid_id`). An invalid id in a header we
define (1, 2) is the caller's mistake and answers 400; a harness header that does not fit is skipped.
Never use these ids as metric labels.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from agentserve.api.errors import InvalidRequestError
from agentserve.api.nvext import MAX_ID_LENGTH, AgentContext, is_valid_id

_CANONICAL = "x-agentserve-"
_DYNAMO = "x-dynamo-"


@dataclass(frozen=True, slots=True)
class BodyIdentity:
    """What a decoder found in the body (weakest source)."""

    session_id: str | None = None
    source: str | None = None  # "metadata.user_id" | "prompt_cache_key"


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    session_id: str | None = None
    parent_session_id: str | None = None
    trajectory_id: str | None = None
    source: str | None = None  # where the session id came from (for traces, never a metric label)
    parent_source: str | None = None  # where the parent session id came from
    # Codex's `x-openai-subagent` (`collab_spawn`, `review`, `compact`, …): what kind of child thread
    # this is; only a spawned one is an agent child (`frontend.subagents`).
    subagent_kind: str | None = None
    # Codex's `thread-id`: a spawned child (Codex 0.169, captured) keeps the root's `session-id` and has
    # a thread of its own; the subagent tree keys the child by it (`Frontend._place_in_tree`).
    thread_id: str | None = None


def session_from_user_id(user_id: str) -> str | None:
    """The session id inside Claude Code's `metadata.user_id`, if any and valid."""
    if user_id.startswith("{"):
        try:
            parsed = json.loads(user_id)
        except ValueError:
            return None
        candidate = parsed.get("session_id") if isinstance(parsed, dict) else None
        return candidate if isinstance(candidate, str) and is_valid_id(candidate) else None
    _, sep, tail = user_id.rpartition("_session_")
    return tail if sep and is_valid_id(tail) else None


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _strict(h: dict[str, str], name: str) -> str | None:
    value = h.get(name)
    if value is None:
        return None
    value = value.strip()
    if not is_valid_id(value):
        raise InvalidRequestError(
            f"header {name} must be 1-{MAX_ID_LENGTH} characters of letters, digits and ._:@/+=#~-",
            param=name,
        )
    return value


def _lenient(h: dict[str, str], *names: str) -> tuple[str | None, str | None]:
    for name in names:
        value = h.get(name)
        if value is not None:
            value = value.strip()
            if is_valid_id(value):
                return value, name
    return None, None


def resolve_identity(
    headers: Mapping[str, str],
    context: AgentContext | None = None,
    body: BodyIdentity | None = None,
) -> AgentIdentity:
    h = _lower(headers)
    ctx = context or AgentContext()

    def pick(
        kind: str, harness: tuple[str | None, str | None], body_value: tuple[str | None, str | None]
    ) -> tuple[str | None, str | None]:
        for prefix in (_CANONICAL, _DYNAMO):
            name = prefix + kind
            value = _strict(h, name)
            if value is not None:
                return value, "header:" + name
        from_ctx = getattr(ctx, kind.replace("-", "_"))
        if from_ctx is not None:
            return from_ctx, "nvext.agent_context"
        if harness[0] is not None:
            return harness[0], "header:" + (harness[1] or "")
        return body_value

    claude_root, _ = _lenient(h, "x-claude-code-session-id")
    claude_agent, _ = _lenient(h, "x-claude-code-agent-id")
    if claude_agent is not None:
        # A Claude Code sub-agent: its own id, under its parent agent (or the root session).
        harness_session: tuple[str | None, str | None] = (claude_agent, "x-claude-code-agent-id")
        harness_parent = _lenient(h, "x-claude-code-parent-agent-id")
        if harness_parent[0] is None and claude_root is not None:
            harness_parent = (claude_root, "x-claude-code-session-id")
    else:
        harness_session = _lenient(
            h, "x-claude-code-session-id", "session-id", "thread-id", "session_id", "x-session-id"
        )
        harness_parent = _lenient(h, "x-codex-parent-thread-id", "x-parent-session-id")
    harness_trajectory: tuple[str | None, str | None] = (
        (claude_root, "x-claude-code-session-id") if claude_root is not None else (None, None)
    )

    body = body or BodyIdentity()
    body_session = (body.session_id, body.source) if body.session_id else (None, None)
    session, source = pick("session-id", harness_session, body_session)
    parent, parent_source = pick("parent-session-id", harness_parent, (None, None))
    trajectory, _ = pick("trajectory-id", harness_trajectory, (None, None))
    kind, _ = _lenient(h, "x-openai-subagent")
    thread, _ = _lenient(h, "thread-id")
    return AgentIdentity(session, parent, trajectory, source, parent_source if parent else None, kind, thread)
