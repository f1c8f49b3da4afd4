"""A conversation's identity when no header or metadata names a session (pi, OpenClaw).

Every turn of an agent conversation resends its beginning unchanged: the system prompt, the tools, the
first user message, and the model's first reply. Those four identify it:

    key = "conv-" + blake2b(system, tools, first user message, anchor)[:16 bytes hex]

- Volatile spans are stripped first (the deployment's strip rules, then dates, times and weekdays),
  so a harness that re-renders "Current date: …" into its system prompt keeps its key across midnight.
- The *anchor* is the first assistant turn: its first tool call — id (letters and digits only, so ids
  a client rewrote still match), name and arguments (as parsed JSON, so re-serialised arguments still
  match) — or, for a text reply, its text with whitespace collapsed. Call ids are
  random (`call_<24 hex>`), so two conversations that start with the same prompt (two pi sessions in
  one project) get different keys from their second turn on and never merge. Before the model has
  replied there is no anchor: turn 1 of such conversations shares a key, which is harmless (their
  prompts are identical, so is their cache) and nothing is remembered under it (`key_after`); the
  frontend relabels turn 1's trace record and retention state with the anchored key once the reply
  is known (docs/prompt.md, "A conversation's identity without a header").

Pure functions; the frontend uses the key for traces, drift detection, session affinity, KV
retention and the call memory's scope when the request names no session.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from agentserve.conversation import Conversation, Message, Text
from agentserve.prompt.strip import StripRules, strip_billing_line

PREFIX = "conv-"
SOURCE = "conversation"  # AgentIdentity.source when the session id is this key
_ANCHOR_CHARS = 4096
_NOT_ALNUM = re.compile(r"[^0-9A-Za-z]+")
# Spans that change while a conversation goes on: dates, clock times, weekday names.
_VOLATILE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\b"
)


def conversation_key(conversation: Conversation, rules: StripRules | None = None) -> str | None:
    """The conversation's key as this request shows it; None without a user message."""
    messages = conversation.messages
    first_user = next((m for m in messages if m.role == "user"), None)
    if first_user is None:
        return None
    first_reply = next((m for m in messages if m.role == "assistant"), None)
    return _key(conversation, first_user, anchor(first_reply) if first_reply else "", rules)


def key_after(conversation: Conversation, reply: Message, rules: StripRules | None = None) -> str | None:
    """The key the *next* request of this conversation will show, once `reply` is in its history:
    the same key if the request already had an assistant turn, else the key anchored on `reply`."""
    messages = conversation.messages
    if any(m.role == "assistant" for m in messages):
        return conversation_key(conversation, rules)
    first_user = next((m for m in messages if m.role == "user"), None)
    if first_user is None:
        return None
    return _key(conversation, first_user, anchor(reply), rules)


def anchor(reply: Message) -> str:
    """What makes a conversation's first assistant turn its own: its first call (id, name and
    arguments), else its text. The arguments matter for native ids that repeat across conversations
    (Kimi's `functions.NAME:IDX`): two conversations that open alike but whose first calls differ
    stay apart. They are compared as parsed JSON, so a client's re-serialisation keeps the key."""
    calls = reply.tool_calls
    if calls:
        call = calls[0]
        return f"call:{_NOT_ALNUM.sub('', call.id)}:{call.name}:{_canonical(call.arguments)}"
    return "text:" + " ".join(reply.text.split())[:_ANCHOR_CHARS]


def _canonical(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return " ".join(arguments.split())[:_ANCHOR_CHARS]
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)[:_ANCHOR_CHARS]


def _key(conversation: Conversation, first_user: Message, anchor_: str, rules: StripRules | None) -> str:
    rules = rules or StripRules()
    system = conversation.system
    if rules.billing:
        system, _ = strip_billing_line(system)
    h = hashlib.blake2b(digest_size=16)
    for text in _texts(system):
        _feed(h, "s", _clean(text, rules))
    for tool in conversation.tools:
        spec = json.dumps([tool.name, tool.description, tool.parameters], sort_keys=True, default=str)
        _feed(h, "t", spec)
    for text in _texts(first_user.parts):
        _feed(h, "u", _clean(text, rules))
    _feed(h, "a", anchor_)
    return PREFIX + h.hexdigest()


def _texts(parts: Iterable[object]) -> Iterable[str]:
    return (p.text for p in parts if isinstance(p, Text))


def _clean(text: str, rules: StripRules) -> str:
    for rule in rules.patterns:
        text = rule.pattern.sub("", text)
    return _VOLATILE.sub("", text)


def _feed(h: hashlib.blake2b, tag: str, text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    h.update(tag.encode() + len(data).to_bytes(8, "little") + data)
