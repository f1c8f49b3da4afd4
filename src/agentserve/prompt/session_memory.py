"""What the frontend remembers of each session between its turns, kept in one place.

A session (the client's session id, or the conversation's own key: `prompt.session`) sends its
whole history every turn. To keep that history's KV cache, and to say why it was lost, the frontend
remembers per session:

- the turns it served (`Produced`): exact replay splices the next prompt onto the last one as sent
  (`prompt.splice`); a session id can carry a few conversations (Claude Code's title request
  shares the main agent's), so the last turn of each, most recent first;
- its answers (assistant turns without calls), to put back the reasoning a Chat client dropped;
- its last prompt + output as token ids: the next prompt should start with them (prefix drift,
  `prompt.drift`), and a parent waiting on subagents is held by them (retention);
- its last prompt's length (a drift's cause, in the trace);
- when its last request arrived (retention's idle clock).

One record per session in one LRU, bounded by sessions, by stored prompt+output tokens and by the
replayed turns' size: a session is forgotten whole, its least recently used first.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentserve.conversation import Conversation, Message
from agentserve.prompt.drift import Decode, DriftReport, compare
from agentserve.prompt.splice import Produced, answer_key, restore_answers


@dataclass(slots=True)
class SessionRecord:
    """One session's memories (each empty until a turn gives it one)."""

    turns: list[Produced] = field(default_factory=list)  # most recent first, one per conversation
    answers: OrderedDict[str, Message] = field(default_factory=OrderedDict)  # by `answer_key`
    context: array[int] | None = None  # the last prompt + output
    prompt_tokens: int | None = None  # the last prompt's length
    arrived: float | None = None  # when its last request arrived (monotonic seconds)

    @property
    def replay_size(self) -> int:
        return sum(t.size for t in self.turns) + sum(len(m.text) for m in self.answers.values())

    @property
    def context_tokens(self) -> int:
        return 0 if self.context is None else len(self.context)


class SessionMemory:
    """The sessions' records: an LRU over sessions, capped by count, by stored prompt + output tokens
    (`max_context_tokens`, 4 bytes each) and by the replayed turns' characters + tokens
    (`max_replay_size`: token ids are kept as the prompts' own tuples, so a few hundred MB at most
    at the default). Whatever alone exceeds its whole budget is not kept."""

    def __init__(
        self,
        decode: Decode,
        *,
        max_sessions: int = 4096,
        max_context_tokens: int = 64 * 1024 * 1024,
        max_replay_size: int = 8 * 1024 * 1024,
        turns_per_session: int = 4,
        answers_per_session: int = 64,
    ) -> None:
        if min(max_sessions, max_context_tokens, max_replay_size, turns_per_session, answers_per_session) < 1:
            raise ValueError("session memory bounds must be positive")
        self._decode = decode
        self._max_sessions = max_sessions
        self._max_context_tokens = max_context_tokens
        self._max_replay_size = max_replay_size
        self._turns_per_session = turns_per_session
        self._answers_per_session = answers_per_session
        self._records: OrderedDict[str, SessionRecord] = OrderedDict()
        self._context_tokens = 0
        self._replay_size = 0

    def __len__(self) -> int:
        return len(self._records)

    @property
    def stored_tokens(self) -> int:
        """Prompt + output tokens kept for drift, all sessions together."""
        return self._context_tokens

    # -- reading (a read is a use: the session moves to the recent end) ---------------------------

    def _used(self, session: str) -> SessionRecord | None:
        record = self._records.get(session)
        if record is not None:
            self._records.move_to_end(session)
        return record

    def turns(self, session: str) -> list[Produced]:
        """The session's remembered turns, most recent first."""
        record = self._used(session)
        return [] if record is None else list(record.turns)

    def restore_answers(self, session: str, conversation: Conversation) -> Conversation:
        """`conversation` with each of this session's answers whose reasoning the client dropped put
        back as produced (`prompt.splice.restore_answers`); never another session's."""
        record = self._used(session)
        if record is None or not record.answers:
            return conversation
        return restore_answers(record.answers, conversation)

    def drift(self, session: str, prompt: Sequence[int]) -> DriftReport | None:
        """Compare `prompt` with the session's previous prompt + output (None: not known)."""
        record = self._used(session)
        if record is None or record.context is None:
            return None
        return compare(record.context, prompt, self._decode)

    def context(self, session: str) -> Sequence[int] | None:
        """The session's last prompt + output as remembered (None: not, or no longer, known)."""
        record = self._records.get(session)
        return None if record is None else record.context

    def prompt_tokens(self, session: str) -> int | None:
        record = self._records.get(session)
        return None if record is None else record.prompt_tokens

    # -- writing ------------------------------------------------------------------------------------

    def arrived(self, session: str, now: float) -> float | None:
        """A request of `session` arrived at `now`: the seconds since its previous one (None: first)."""
        record = self._record(session)
        idle = None if record.arrived is None else max(0.0, now - record.arrived)
        record.arrived = now
        self._evict()
        return idle

    def remember_context(self, session: str, prompt: Sequence[int], generated: Sequence[int] = ()) -> None:
        """This turn's prompt and output, for the session's next prompt (drift) and its length."""
        tokens = array("I", prompt)
        tokens.extend(generated)
        record = self._record(session)
        self._context_tokens -= record.context_tokens
        record.prompt_tokens = len(prompt)
        # Larger than the whole budget: not worth evicting everything else for.
        record.context = tokens if len(tokens) <= self._max_context_tokens else None
        self._context_tokens += record.context_tokens
        self._evict()

    def remember_turn(self, session: str, produced: Produced, replaces: Produced | None = None) -> None:
        """Record `produced`, in place of the turn it extended (`replaces`), else as a new conversation."""
        record = self._records.get(session)
        if record is None and produced.size > self._max_replay_size:
            return
        record = self._record(session)
        kept = [t for t in record.turns if t is not replaces][: self._turns_per_session - 1]
        if produced.size <= self._max_replay_size:
            kept.insert(0, produced)
        before = record.replay_size
        record.turns = kept
        self._replay_size += record.replay_size - before
        self._evict()

    def remember_answer(self, session: str, message: Message) -> None:
        """An answer as produced (no calls, some text), to restore its reasoning later."""
        if message.tool_calls or not message.text.strip():
            return
        record = self._record(session)
        key = answer_key(message)
        answers = record.answers
        before = record.replay_size
        answers[key] = message
        answers.move_to_end(key)
        while len(answers) > self._answers_per_session:
            answers.popitem(last=False)
        self._replay_size += record.replay_size - before
        self._evict()

    def rename(self, old: str, new: str) -> None:
        """`old` is now called `new` (a header-less conversation's key once turn 1's reply anchors it,
        `prompt.session.key_after`): its record moves along; where `new` has one already, only the
        idle clock does (the rest of `new`'s record is the newer)."""
        record = None if old == new else self._records.pop(old, None)
        if record is None:
            return
        target = self._records.get(new)
        if target is None:
            self._records[new] = record
            return
        target.arrived = record.arrived
        self._forget(record)
        self._records.move_to_end(new)

    # -- the bounds ---------------------------------------------------------------------------------

    def _record(self, session: str) -> SessionRecord:
        record = self._used(session)
        if record is None:
            record = self._records[session] = SessionRecord()
        return record

    def _forget(self, record: SessionRecord) -> None:
        self._context_tokens -= record.context_tokens
        self._replay_size -= record.replay_size

    def _over(self) -> bool:
        return (
            len(self._records) > self._max_sessions
            or self._context_tokens > self._max_context_tokens
            or self._replay_size > self._max_replay_size
        )

    def _evict(self) -> None:
        """Forget the least recently used sessions until every bound holds (the session just written
        is the most recent, and no part of it exceeds a budget alone: it stays)."""
        while len(self._records) > 1 and self._over():
            _, record = self._records.popitem(last=False)
            self._forget(record)


# -- one kind of memory alone ---------------------------------------------------------------------
# Views of a session memory of their own for callers that keep one kind only (tools, tests, the
# standalone API these replaced): the same store, bounds and eviction; nothing more.


class DriftDetector:
    """Each session's last prompt + output (`SessionMemory.remember_context` / `drift`)."""

    def __init__(self, decode: Decode, max_sessions: int = 1024, max_tokens: int = 64 * 1024 * 1024) -> None:
        self.memory = SessionMemory(decode, max_sessions=max_sessions, max_context_tokens=max_tokens)

    def __len__(self) -> int:
        return len(self.memory)

    @property
    def stored_tokens(self) -> int:
        return self.memory.stored_tokens

    def check(self, session: str, prompt: Sequence[int]) -> DriftReport | None:
        return self.memory.drift(session, prompt)

    def last(self, session: str) -> Sequence[int] | None:
        return self.memory.context(session)

    def remember(self, session: str, prompt: Sequence[int], generated: Sequence[int] = ()) -> None:
        self.memory.remember_context(session, prompt, generated)


def _no_text(ids: Sequence[int]) -> str:
    return ""


class ReplayMemory:
    """Each session's served turns (`SessionMemory.remember_turn` / `turns`)."""

    def __init__(
        self, max_sessions: int = 1024, max_size: int = 8 * 1024 * 1024, per_session: int = 4
    ) -> None:
        self.memory = SessionMemory(
            _no_text, max_sessions=max_sessions, max_replay_size=max_size, turns_per_session=per_session
        )

    def __len__(self) -> int:
        return len(self.memory)

    def get(self, session: str) -> list[Produced]:
        return self.memory.turns(session)

    def remember(self, session: str, produced: Produced, replaces: Produced | None = None) -> None:
        self.memory.remember_turn(session, produced, replaces)


class AnswerMemory:
    """Each session's answers (`SessionMemory.remember_answer` / `restore_answers`)."""

    def __init__(self, max_answers: int = 4096) -> None:
        self.memory = SessionMemory(_no_text, answers_per_session=max_answers)

    def remember(self, session: str, message: Message) -> None:
        self.memory.remember_answer(session, message)

    def restore(self, session: str, conversation: Conversation) -> Conversation:
        return self.memory.restore_answers(session, conversation)
