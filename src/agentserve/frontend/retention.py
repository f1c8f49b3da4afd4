"""The KV retention policy: how long a request's KV blocks should outlive it (pure).

An agent turn usually ends in tool calls; the tool runs for seconds to minutes and the session
comes back with a prompt that extends this one. Under plain LRU those blocks are evicted during
the gap, exactly when they are certain to be needed again. The frontend knows what the engine
does not, and turns it into a `Retention` (TensorRT-LLM's 0..100 scale, default 35):

- the deployment's shared prefix (system prompt + tool definitions, identical across sessions)
  is pinned longest: `prefix_priority`, no expiry (`prefix_duration_s` None);
- the rest of an agent session's prompt and its generated tokens are kept at `session_priority`
  for `session_duration_s`: an agent (the request declares tools, or continues after a tool
  result) will be back within a tool call's duration;
- a conversation without tools gets `idle_priority` for `idle_duration_s`, and nothing beyond the
  shared prefix once it came back after a long idle time (over `session_duration_s`: paced by a
  person who may not return soon); an agent session back from a long pause keeps the session class
  (its next gaps are tool calls again: on bench/kv_memory.py's trace demoting it lost hits);
- `agent_hints.priority` shifts the session priorities by `hint_step` per unit (clamped to
  0..`max_priority`, which stays below the pinned prefix);
- mode `off`: no retention (the engine's plain LRU).

Subagent trees (`tree_aware`, docs/subagents.md). A parent whose turn spawned subagents waits longer
than any tool gap and is certain to come back, so it must outrank the burst of new prefixes its
children bring; under one session class it is the oldest and goes first. Three retentions:

- `parent_hold`: once a parent's turn ends in spawning calls, its prompt and output are re-released
  at `parent_priority` (above the session class, below the shared prefix) for `session_duration_s`,
  re-armed while a child still runs (the frontend's `SubagentTree` knows when);
- a child's turn (`subagent`): its private blocks at `child_priority` for `child_duration_s`; the
  prefix it shares with its siblings (one subagent type's system prompt and tools) at
  `prefix_priority` like the deployment's prefix, but for `child_duration_s` after the last sibling
  turn rather than forever;
- `child_release`: once a child answered (a turn without tool calls: its result goes to the parent),
  its private blocks drop to the lowest class at once; the type's prefix stays for its siblings.

Hold and release reach the engine as a one-token request over blocks already cached: the last
release of a block decides its class (the sim's pool; TensorRT-LLM takes a request's
`KvCacheRetentionConfig` for the blocks it stores, `worker/engines/trtllm_retention.py`).

Past its duration a block falls back to the default class, so retention can never pin memory
forever except for the shared prefix, whose size the deployment bounds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from agentserve.config import RetentionMode, RetentionSettings
from agentserve.prompt.session_memory import SessionMemory
from agentserve.worker.engine import (
    RETENTION_PRIORITY_DEFAULT,
    RETENTION_PRIORITY_MAX,
    RETENTION_PRIORITY_MIN,
    Retention,
    TokenRangeRetention,
)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    mode: RetentionMode = "agent"
    prefix_priority: int = 90
    prefix_duration_s: float | None = None
    session_priority: int = 80
    session_duration_s: float = 600.0
    idle_priority: int = 50
    idle_duration_s: float = 120.0
    hint_step: int = 5  # priority added per unit of agent_hints.priority
    max_priority: int = 85  # session blocks never outrank the shared prefix
    tree_aware: bool = True  # a parent waiting on subagents outranks them and other sessions' gaps
    parent_priority: int = 85  # a parent in a subagent gap (capped at max_priority)
    child_priority: int = 80  # a running child's own blocks (capped below parent_priority)
    child_duration_s: float = 120.0

    @classmethod
    def from_settings(cls, settings: RetentionSettings) -> RetentionPolicy:
        """The policy a deployment's retention settings ask for. A session's blocks stay below the
        shared prefix (hints can raise them to 85 at most); a parent waiting on subagents takes the
        highest class below the prefix, its running children stay in the session class
        (`decide_retention` keeps them below the parent)."""
        below_prefix = min(settings.prefix_priority, max(settings.session_priority, 85))
        return cls(
            mode=settings.mode,
            prefix_priority=settings.prefix_priority,
            session_priority=settings.session_priority,
            session_duration_s=settings.session_seconds,
            idle_duration_s=settings.idle_seconds,
            max_priority=below_prefix,
            tree_aware=settings.subagent_trees,
            parent_priority=below_prefix,
            child_priority=settings.session_priority,
        )

    def __post_init__(self) -> None:
        for name in (
            "prefix_priority",
            "session_priority",
            "idle_priority",
            "max_priority",
            "parent_priority",
            "child_priority",
        ):
            value = getattr(self, name)
            if not RETENTION_PRIORITY_MIN <= value <= RETENTION_PRIORITY_MAX:
                raise ValueError(f"{name} must be within 0..100, got {value}")
        if self.session_duration_s <= 0 or self.idle_duration_s <= 0 or self.child_duration_s <= 0:
            raise ValueError("retention durations must be positive")
        if self.prefix_duration_s is not None and self.prefix_duration_s <= 0:
            raise ValueError("prefix_duration_s must be positive (or None: no expiry)")


@dataclass(frozen=True, slots=True)
class RetentionInputs:
    """What the frontend knows about one request."""

    prompt_tokens: int
    shared_prefix_tokens: int = 0  # leading tokens identical across sessions (system + tools)
    has_tools: bool = False  # the request declares tools: the turn may end in tool calls
    after_tool_result: bool = False  # the last message is a tool result: an agent loop in flight
    hint_priority: int | None = None  # agent_hints.priority
    idle_s: float | None = None  # time since the session's previous turn finished (None: first)
    subagent: bool = False  # a subagent's turn: a child in a tree whose parent waits on it


OFF = RetentionPolicy(mode="off")
AGENT = RetentionPolicy()


def decide_retention(policy: RetentionPolicy, inputs: RetentionInputs) -> Retention | None:
    """The retention of one request under `policy` (None: default LRU, nothing to keep)."""
    if policy.mode == "off" or inputs.prompt_tokens <= 0:
        return None
    prefix = max(0, min(inputs.shared_prefix_tokens, inputs.prompt_tokens))
    if policy.tree_aware and inputs.subagent:
        return _child_retention(policy, inputs, prefix)
    agent = inputs.has_tools or inputs.after_tool_result
    came_back_late = inputs.idle_s is not None and inputs.idle_s > policy.session_duration_s
    if agent:
        priority, duration = policy.session_priority, policy.session_duration_s
    elif came_back_late:
        priority, duration = RETENTION_PRIORITY_DEFAULT, policy.idle_duration_s
    else:
        priority, duration = policy.idle_priority, policy.idle_duration_s
    if inputs.hint_priority and priority != RETENTION_PRIORITY_DEFAULT:
        priority += inputs.hint_priority * policy.hint_step
    priority = max(RETENTION_PRIORITY_MIN, min(priority, policy.max_priority))
    ranges: list[TokenRangeRetention] = []
    if prefix:
        ranges.append(TokenRangeRetention(0, prefix, policy.prefix_priority, policy.prefix_duration_s))
    if prefix < inputs.prompt_tokens and priority != RETENTION_PRIORITY_DEFAULT:
        ranges.append(TokenRangeRetention(prefix, None, priority, duration))
    if priority == RETENTION_PRIORITY_DEFAULT:
        return Retention(tuple(ranges)) if ranges else None
    return Retention(tuple(ranges), decode_priority=priority, decode_duration_s=duration)


def _child_retention(policy: RetentionPolicy, inputs: RetentionInputs, prefix: int) -> Retention:
    """A subagent's turn: its type's shared prefix like the deployment's, its own blocks below the
    parent's session class; both only while the tree runs (`child_duration_s` after this turn)."""
    priority = policy.child_priority
    if inputs.hint_priority:
        priority += inputs.hint_priority * policy.hint_step
    # Never at or above the held parent's class: the parent waiting on it must outrank every child.
    priority = max(RETENTION_PRIORITY_MIN, min(priority, _parent_class(policy) - 1))
    duration = policy.child_duration_s
    ranges: list[TokenRangeRetention] = []
    if prefix:
        ranges.append(TokenRangeRetention(0, prefix, policy.prefix_priority, duration))
    if prefix < inputs.prompt_tokens:
        ranges.append(TokenRangeRetention(prefix, None, priority, duration))
    return Retention(tuple(ranges), decode_priority=priority, decode_duration_s=duration)


def _parent_class(policy: RetentionPolicy) -> int:
    return min(policy.parent_priority, policy.max_priority)


def parent_hold(policy: RetentionPolicy, tokens: int, shared_prefix_tokens: int) -> Retention | None:
    """The retention that re-releases a parent's prompt and output (`tokens` of them) while it waits on
    its subagents (None: retention off or not tree-aware)."""
    if policy.mode == "off" or not policy.tree_aware or tokens <= 0:
        return None
    prefix = max(0, min(shared_prefix_tokens, tokens))
    priority, duration = _parent_class(policy), policy.session_duration_s
    ranges: list[TokenRangeRetention] = []
    if prefix:
        ranges.append(TokenRangeRetention(0, prefix, policy.prefix_priority, policy.prefix_duration_s))
    if prefix < tokens:
        ranges.append(TokenRangeRetention(prefix, None, priority, duration))
    return Retention(tuple(ranges), decode_priority=priority, decode_duration_s=duration)


def child_release(policy: RetentionPolicy, tokens: int, shared_prefix_tokens: int) -> Retention | None:
    """The retention that re-releases an answered child's prompt and output: its own blocks to the
    lowest class, its type's prefix kept for siblings (None: retention off or not tree-aware)."""
    if policy.mode == "off" or not policy.tree_aware or tokens <= 0:
        return None
    prefix = max(0, min(shared_prefix_tokens, tokens))
    ranges: list[TokenRangeRetention] = []
    if prefix:
        ranges.append(TokenRangeRetention(0, prefix, policy.prefix_priority, policy.child_duration_s))
    if prefix < tokens:
        ranges.append(TokenRangeRetention(prefix, None, RETENTION_PRIORITY_MIN, None))
    return Retention(tuple(ranges), decode_priority=RETENTION_PRIORITY_MIN)


class SharedPrefixTracker:
    """What the policy needs that no single request says: the deployment's shared prefix (the
    longest common block-hash prefix between prompts of different sessions that start alike). A
    bounded LRU map by first block; each session's idle time is the session memory's
    (`prompt.session_memory`)."""

    def __init__(self, block_size: int, max_entries: int = 4096) -> None:
        self.block_size = block_size
        self.max_entries = max_entries
        # first block hash -> (session of the last prompt seen, its hashes, shared blocks known)
        self._prefixes: OrderedDict[int, tuple[str | None, tuple[int, ...], int]] = OrderedDict()

    def rename(self, old: str, new: str, first_block: int | None) -> None:
        """`old` is now called `new` (a header-less conversation's key once turn 1's reply anchors it,
        `prompt.session.key_after`): its prompt entry moves along, so its turn 2 is not "another
        conversation" sharing the whole of turn 1."""
        entry = None if first_block is None else self._prefixes.get(first_block)
        if first_block is not None and entry is not None and entry[0] == old:
            self._prefixes[first_block] = (new, entry[1], entry[2])

    def observe(self, block_hashes: tuple[int, ...], session: str | None) -> int:
        """The shared prefix in tokens, as known with this request's prompt."""
        if not block_hashes:
            return 0
        key = block_hashes[0]
        entry = self._prefixes.pop(key, None)
        shared = 0
        if entry is not None:
            other, hashes, shared = entry
            if other != session or session is None:
                n = 0
                for a, b in zip(hashes, block_hashes, strict=False):
                    if a != b:
                        break
                    n += 1
                # Another conversation sharing n blocks: the deployment's prefix is what all share.
                if n:
                    shared = n if shared == 0 else min(shared, n)
        self._prefixes[key] = (session, block_hashes, shared)
        if len(self._prefixes) > self.max_entries:
            self._prefixes.popitem(last=False)
        return min(shared, len(block_hashes)) * self.block_size


class RetentionTracker:
    """The shared prefix and the sessions' idle clock observed together, as the frontend does (its
    session memory keeps the clock): a view for callers that keep no session memory of their own."""

    def __init__(self, block_size: int, max_entries: int = 4096) -> None:
        self.prefix = SharedPrefixTracker(block_size, max_entries)
        self.sessions = SessionMemory(lambda ids: "", max_sessions=max_entries)

    def rename(self, old: str, new: str, first_block: int | None) -> None:
        self.sessions.rename(old, new)
        self.prefix.rename(old, new, first_block)

    def observe(
        self, block_hashes: tuple[int, ...], session: str | None, now: float
    ) -> tuple[int, float | None]:
        """(shared prefix tokens, idle seconds of the session or None) for a new request."""
        idle = None if session is None else self.sessions.arrived(session, now)
        return self.prefix.observe(block_hashes, session), idle
