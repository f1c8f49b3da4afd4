"""The `nvext` request extension (Dynamo's name, kept for users coming from Dynamo).

`nvext.agent_hints` carry serving intent to the router: `priority` (higher first), `osl` (expected
output tokens) and `speculative_prefill` (warm the next turn's prefix after this one).
`nvext.agent_context` names the session explicitly (headers are preferred: see `identity`).
`nvext.session_control` is Dynamo's experimental subagent control (`{session_id, action:
"open"|"bind"|"close", timeout}`, plus `parent_session_id` as Dynamo PR #11347 proposes): its ids
complete `agent_context`, and `close` says the session is done after this turn, so its own KV can be
released at once (docs/subagents.md). `timeout` is accepted and has no effect here (our retention
durations apply); `open`/`bind` change nothing beyond the session id (our router keeps affinity).
Unknown nvext fields are accepted and reported in `ignored`, so newer clients keep working.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from agentserve.api._check import at, expect_dict, opt_bool, opt_int, opt_str
from agentserve.api.errors import InvalidRequestError

MAX_ID_LENGTH = 128
# Session ids are untrusted: printable, no whitespace, quotes or backslashes, bounded.
_ID = re.compile(rf"[A-Za-z0-9._:@/+=#~-]{{1,{MAX_ID_LENGTH}}}\Z")

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
MAX_OSL = 1 << 24


def is_valid_id(value: str) -> bool:
    return _ID.match(value) is not None


def checked_id(d: dict[str, Any], key: str, path: str) -> str | None:
    value = opt_str(d, key, path)
    if value is not None and not is_valid_id(value):
        raise InvalidRequestError(
            f"must be 1-{MAX_ID_LENGTH} characters of letters, digits and ._:@/+=#~-", param=at(path, key)
        )
    return value


@dataclass(frozen=True, slots=True)
class AgentHints:
    priority: int | None = None
    osl: int | None = None
    speculative_prefill: bool = False


@dataclass(frozen=True, slots=True)
class AgentContext:
    session_id: str | None = None
    parent_session_id: str | None = None
    trajectory_id: str | None = None


SessionAction = Literal["open", "bind", "close"]
MAX_SESSION_TIMEOUT_S = 2**32 - 1


@dataclass(frozen=True, slots=True)
class SessionControl:
    session_id: str | None = None
    parent_session_id: str | None = None
    action: SessionAction | None = None
    timeout_s: int | None = None


@dataclass(frozen=True, slots=True)
class NvExt:
    agent_hints: AgentHints = AgentHints()
    agent_context: AgentContext | None = None
    cache_salt: str | None = None
    ignored: tuple[str, ...] = field(default=())
    session_control: SessionControl | None = None


_HINT_KEYS = frozenset({"priority", "osl", "speculative_prefill"})
_CONTEXT_KEYS = frozenset({"session_id", "parent_session_id", "trajectory_id"})
_CONTROL_KEYS = frozenset({"session_id", "parent_session_id", "action", "timeout"})
_ACTIONS: tuple[SessionAction, ...] = ("open", "bind", "close")
_NVEXT_KEYS = ("agent_hints", "agent_context", "cache_salt", "session_control")


def _section(
    nv: dict[str, Any], key: str, path: str, known: frozenset[str], ignored: list[str]
) -> tuple[dict[str, Any], str] | None:
    """The optional object under `key`, with its path; the keys it holds that are not `known` are
    added to `ignored` (reported, not refused)."""
    raw = nv.get(key)
    if raw is None:
        return None
    spath = at(path, key)
    obj = expect_dict(raw, spath)
    ignored += [at(spath, k) for k in obj if k not in known]
    return obj, spath


def parse_nvext(value: Any, path: str = "nvext") -> NvExt:
    if value is None:
        return NvExt()
    nv = expect_dict(value, path)
    ignored = [at(path, k) for k in nv if k not in _NVEXT_KEYS]

    hints = AgentHints()
    section = _section(nv, "agent_hints", path, _HINT_KEYS, ignored)
    if section is not None:
        h, hpath = section
        hints = AgentHints(
            priority=opt_int(h, "priority", hpath, minimum=I32_MIN, maximum=I32_MAX),
            osl=opt_int(h, "osl", hpath, minimum=0, maximum=MAX_OSL),
            speculative_prefill=bool(opt_bool(h, "speculative_prefill", hpath)),
        )

    context = None
    section = _section(nv, "agent_context", path, _CONTEXT_KEYS, ignored)
    if section is not None:
        c, cpath = section
        context = AgentContext(
            session_id=checked_id(c, "session_id", cpath),
            parent_session_id=checked_id(c, "parent_session_id", cpath),
            trajectory_id=checked_id(c, "trajectory_id", cpath),
        )

    control = None
    section = _section(nv, "session_control", path, _CONTROL_KEYS, ignored)
    if section is not None:
        sc, spath = section
        action = opt_str(sc, "action", spath)
        if action is not None and action not in _ACTIONS:
            raise InvalidRequestError("must be one of open, bind, close", param=at(spath, "action"))
        control = SessionControl(
            session_id=checked_id(sc, "session_id", spath),
            parent_session_id=checked_id(sc, "parent_session_id", spath),
            action=action,
            timeout_s=opt_int(sc, "timeout", spath, minimum=0, maximum=MAX_SESSION_TIMEOUT_S),
        )
        # Its ids name the session as agent_context does (agent_context's own values win).
        base = context or AgentContext()
        context = AgentContext(
            session_id=base.session_id or control.session_id,
            parent_session_id=base.parent_session_id or control.parent_session_id,
            trajectory_id=base.trajectory_id,
        )

    salt = opt_str(nv, "cache_salt", path)
    if salt is not None and len(salt) > 256:
        raise InvalidRequestError("must be at most 256 characters", param=at(path, "cache_salt"))
    return NvExt(hints, context, salt, tuple(ignored), control)
