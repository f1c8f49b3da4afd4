"""Subagent trees: which conversation is whose child, and which children are still running (pure).

A harness delegates by ending a parent turn in a call that spawns subagents (Claude Code's
`Task`/`Agent` tool, Codex's `spawn_agent`, OpenClaw's `sessions_spawn`); each child is a
conversation of its own that runs for seconds to minutes, then the parent resumes with the results.
Retention and placement read the tree (docs/subagents.md); nothing here changes what a client
receives, so a wrong link costs at most some cache.

Where a link comes from, strongest first (`link_of`):

1. an explicit parent: our `x-agentserve-parent-session-id`, Dynamo's `X-Dynamo-Parent-Session-ID`,
   `nvext.agent_context.parent_session_id`, and the harness headers `api.identity` already reads
   (Claude Code's `x-claude-code-agent-id` under `x-claude-code-parent-agent-id` or the root session;
   Codex's `x-codex-parent-thread-id`; OpenCode's `x-parent-session-id`). Codex also sends
   `x-codex-parent-thread-id` on `review`, `compact` and `memory_consolidation` requests
   (`x-openai-subagent`); only a spawned thread (`collab_spawn`, or a custom label) is an agent child;
2. Claude Code's billing line `cc_is_subagent=true` with no agent id (versions before ~2.1.234 keep
   the parent's `X-Claude-Code-Session-Id` and add nothing else): the child is its own conversation
   under the parent's session (`Frontend.identify` keys it by its conversation);
3. inference: a new conversation (no assistant turn yet) whose first user message is exactly the
   prompt argument of a spawning call that a parent of the same API key made and has not resumed
   from (`SubagentTree.infer_parent`). One spawn call matches one child.

`SubagentTree` keeps the live state, bounded, with the caller's clock: spawns not yet claimed, each
child's parent, type (its first block hash: the system prompt and tools one subagent type shares) and
whether it is still running (its last turn ended in tool calls, or it has not answered yet).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agentserve.conversation import Conversation, Message, Text

# Tools that spawn a subagent, by name (lowercase; a namespaced name `ns.spawn_agent` or
# `ns__spawn_agent` counts by its last segment) → the arguments that carry the child's first prompt.
SPAWN_TOOLS: dict[str, tuple[str, ...]] = {
    "task": ("prompt",),  # Claude Code before the rename
    "agent": ("prompt",),  # Claude Code: {description, prompt, subagent_type, ...}
    "spawn_agent": ("message", "prompt", "task", "input", "items"),  # Codex multi_agent_v1
    "sessions_spawn": ("task", "message", "prompt"),  # OpenClaw
}

# `x-openai-subagent` values that ride on a thread's own work, not a spawned agent.
CODEX_NOT_CHILD = frozenset({"review", "compact", "memory_consolidation"})

BILLING_HEADER = "x-anthropic-billing-header:"


@dataclass(frozen=True, slots=True)
class TreeLink:
    """A child's parent session and where the link came from (for traces, never a metric label)."""

    parent: str
    source: str


def is_claude_subagent(system: Sequence[Text]) -> bool:
    """Claude Code's billing line (the first system block or line) says `cc_is_subagent=true`."""
    if not system:
        return False
    first = system[0].text.lstrip()
    if not first.startswith(BILLING_HEADER):
        return False
    line = first.split("\n", 1)[0]
    fields = (f.strip() for f in line[len(BILLING_HEADER) :].split(";"))
    return "cc_is_subagent=true" in fields


def explicit_link(
    parent: str | None, parent_source: str | None, subagent_kind: str | None
) -> TreeLink | None:
    """The link named by a header or `nvext` (None: no parent named, or a Codex request that rides on
    its own thread's work rather than being a spawned child)."""
    if parent is None:
        return None
    if subagent_kind is not None and subagent_kind in CODEX_NOT_CHILD:
        return None
    return TreeLink(parent, parent_source or "explicit")


def spawn_name(tool_name: str) -> str | None:
    """The spawning tool a call names (its last namespace segment, lowercased), or None."""
    name = tool_name.replace("__", ".").rsplit(".", 1)[-1].lower()
    return name if name in SPAWN_TOOLS else None


def spawn_prompt(tool_name: str, arguments: str) -> str | None:
    """The first prompt a spawning call hands its child (None: not a spawning call, or no prompt)."""
    name = spawn_name(tool_name)
    if name is None:
        return None
    try:
        args = json.loads(arguments)
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    for key in SPAWN_TOOLS[name]:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list):  # Codex `items`: [{type: "text", text}]
            text = "".join(
                i.get("text", "") for i in value if isinstance(i, dict) and isinstance(i.get("text"), str)
            )
            if text.strip():
                return text
    return None


def opening_prompts(conversation: Conversation) -> tuple[str, ...]:
    """What a new conversation's first user message says: its whole text, then each text block
    (Claude Code puts `<system-reminder>` blocks before the Agent call's prompt in the same message).
    Empty: the conversation already has an assistant turn (not a child starting) or no user text."""
    first: Message | None = None
    for m in conversation.messages:
        if m.role == "assistant":
            return ()
        if first is None and m.role == "user":
            first = m
    if first is None:
        return ()
    texts = [first.text, *(p.text for p in first.parts if isinstance(p, Text))]
    return tuple(dict.fromkeys(t.strip() for t in texts if t.strip()))


@dataclass(slots=True)
class _Spawn:
    scope: str
    parent: str
    prompt: str
    tool: str
    at: float


@dataclass(slots=True)
class _Child:
    parent: str
    kind: int | None  # the child's first block hash: its subagent type (system prompt + tools)
    running: bool
    seen: float
    source: str


@dataclass(frozen=True, slots=True)
class TreeState:
    """What retention and placement need to know about one request's place in a tree."""

    parent: str | None = None  # set: the request is a child's turn
    live_siblings: int = 0  # other running children of the same parent and type
    live_children: int = 0  # running children of this request's own session (a parent in a gap)


@dataclass(slots=True)
class SubagentTree:
    """The live tree: spawns not yet claimed, children and whether they still run. Bounded; every
    entry ages out after `ttl_s` without news (a child that never answers stops holding its parent)."""

    ttl_s: float = 1800.0
    max_entries: int = 4096
    _spawns: OrderedDict[int, _Spawn] = field(default_factory=OrderedDict)
    _children: OrderedDict[str, _Child] = field(default_factory=OrderedDict)
    # Parents held above the session class (`retention.parent_hold`): until when, and their shared
    # prefix (tokens), so a child that outlives the hold can have it re-armed.
    _holds: OrderedDict[str, tuple[float, int]] = field(default_factory=OrderedDict)
    _next: int = 0

    # -- events ------------------------------------------------------------------------------------

    def note_spawns(self, scope: str, parent: str, calls: Iterable[tuple[str, str]], now: float) -> int:
        """A parent turn ended with these (tool name, arguments) calls: remember the spawning ones
        for inference. Returns how many spawned."""
        n = 0
        for name, arguments in calls:
            prompt = spawn_prompt(name, arguments)
            if prompt is None:
                continue
            self._next += 1
            self._spawns[self._next] = _Spawn(scope, parent, prompt, spawn_name(name) or name, now)
            n += 1
        self._bound(now)
        return n

    def infer_parent(
        self, scope: str, conversation: Conversation, now: float, *, parent: str | None = None
    ) -> TreeLink | None:
        """The parent whose unclaimed spawn call handed this new conversation its first prompt, same
        API key scope; the spawn is claimed (one call, one child). `parent`: only that parent's spawns
        (a child its headers already link claims the call it answers, so no other conversation with
        the same prompt is taken for it later)."""
        self._bound(now)
        if not self._spawns:
            return None
        # Harnesses may wrap or trim the prompt: whitespace at the ends is not meaning.
        opening = opening_prompts(conversation)
        if not opening:
            return None
        for key, spawn in self._spawns.items():
            if spawn.scope == scope and spawn.prompt.strip() in opening and parent in (None, spawn.parent):
                del self._spawns[key]
                return TreeLink(spawn.parent, "inferred:" + spawn.tool)
        return None

    def child_turn(self, child: str, link: TreeLink, kind: int | None, now: float) -> None:
        """A child's turn starts (it runs until a turn of it ends without tool calls)."""
        entry = self._children.pop(child, None)
        if entry is None or entry.parent != link.parent:
            entry = _Child(link.parent, kind, True, now, link.source)
        entry.running, entry.seen = True, now
        if kind is not None:
            entry.kind = kind
        self._children[child] = entry
        self._bound(now)

    def turn_ended(self, session: str, *, tool_calls: bool, now: float) -> None:
        """A turn of `session` ended; a child whose turn ended without tool calls has answered."""
        entry = self._children.get(session)
        if entry is not None:
            entry.running, entry.seen = tool_calls, now
            self._children.move_to_end(session)  # the map stays ordered by last news

    def rename(self, old: str, new: str) -> None:
        """A header-less child's key moves from its turn-1 key to the anchored one (`prompt.session`)."""
        entry = self._children.pop(old, None)
        if entry is not None:
            self._children[new] = entry
        for spawn in self._spawns.values():
            if spawn.parent == old:
                spawn.parent = new
        for child in self._children.values():
            if child.parent == old:
                child.parent = new
        hold = self._holds.pop(old, None)
        if hold is not None:
            self._holds[new] = hold

    def held(self, parent: str, until: float, shared_prefix_tokens: int) -> None:
        """The parent's KV is held above the session class until `until`."""
        self._holds.pop(parent, None)
        self._holds[parent] = (until, shared_prefix_tokens)
        while len(self._holds) > self.max_entries:
            self._holds.popitem(last=False)

    def resumed(self, session: str) -> None:
        """A turn of `session` starts: a hold it had is over (the turn re-releases its blocks)."""
        self._holds.pop(session, None)

    def hold_due(self, parent: str, now: float, margin_s: float) -> int | None:
        """The parent's shared prefix (tokens) if its hold runs out within `margin_s` while it still
        waits on children (None: no hold, or it lasts, or nothing to wait for)."""
        entry = self._holds.get(parent)
        if entry is None or entry[0] > now + margin_s:
            return None
        if not self.waiting_on_children(parent, now):
            del self._holds[parent]
            return None
        return entry[1]

    # -- queries -----------------------------------------------------------------------------------

    def state(self, session: str | None, now: float) -> TreeState:
        if session is None:
            return TreeState()
        self._bound(now)
        entry = self._children.get(session)
        live_children = sum(1 for c in self._children.values() if c.parent == session and c.running)
        if entry is None:
            return TreeState(live_children=live_children)
        siblings = sum(
            1
            for name, c in self._children.items()
            if name != session and c.parent == entry.parent and c.running and c.kind == entry.kind
        )
        return TreeState(entry.parent, siblings, live_children)

    def parent_of(self, session: str) -> str | None:
        entry = self._children.get(session)
        return None if entry is None else entry.parent

    def waiting_on_children(self, parent: str, now: float) -> bool:
        """The parent spawned children that have not all answered (or unclaimed spawns remain)."""
        self._bound(now)
        if any(s.parent == parent for s in self._spawns.values()):
            return True
        return any(c.parent == parent and c.running for c in self._children.values())

    # -- internals ---------------------------------------------------------------------------------

    def _bound(self, now: float) -> None:
        horizon = now - self.ttl_s
        while self._spawns and (
            len(self._spawns) > self.max_entries or next(iter(self._spawns.values())).at < horizon
        ):
            self._spawns.popitem(last=False)
        while self._children and (
            len(self._children) > self.max_entries or next(iter(self._children.values())).seen < horizon
        ):
            self._children.popitem(last=False)
