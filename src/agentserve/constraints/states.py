"""What llguidance said of a grammar's states, remembered across requests (the sim's steering).

A grammar state is the token sequence consumed from the grammar's start, so what llguidance answers
there (is a token allowed, are these tokens, are bytes forced, does it accept) is a pure function of
(grammar, end-of-turn ids, tokens). `StateMemo` keeps those answers in a trie over the tokens the
steering itself chose (the call's opening `<tool_call>{"name": "…", "arguments": {"` written token
by token where whitespace leaves nothing forced): every request under the same grammar opens the
same way, whatever its script, and a remembered step costs dictionary lookups instead of ~10
`validate_tokens`. `Tracked` is the matcher the steering talks to: it answers from the trie while
the state is in it, and consumes the tokens it owes the real matcher only when asked something new.
Runs copied from a script follow the trie where it has them but never grow it (a script's own
tokens are its own); the trie is bounded by `MEMO_STATES` and `MEMO_DEPTH`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from llguidance import LLMatcher

MEMO_STATES = 256  # states remembered per (grammar, end-of-turn ids); 0: none (every request asks anew)
MEMO_DEPTH = 64  # tokens from the grammar's start: the opening of an answer, where requests agree
RUN_KEY = 16  # token lists of at most this many are remembered whole (a forced key's tokens)
# Answers kept per state: the tokens asked about are the script's (its next token, a resync
# window's), so a state many scripts pass would otherwise collect the whole vocabulary.
ANSWERS = 1024
# Vocabulary masks kept per grammar, at the first states where the steering needed one (a resync
# scan at the answer's start, where the script's prose is refused): 19 KB each over a 150k
# vocabulary, so at most ~20 MB over the engine's 256 grammars.
MEMO_MASKS = 4
FEW = 256  # a remembered mask allowing at most this many tokens keeps them as a set too
# Matchers kept per grammar at the first states where the steering needed the real one after at
# least `KEEP_AFTER` tokens it owed it (the call's opening, ~20 tokens): a copy (~2 µs) instead of
# consuming them again.
MEMO_MATCHERS = 4
KEEP_AFTER = 8

T = TypeVar("T")


class _State:
    __slots__ = (
        "accepting", "allowed", "few", "ff_bytes", "ff_tokens", "firsts", "mask", "matcher", "next",
        "runs", "step", "stopped",
    )  # fmt: skip

    def __init__(self) -> None:
        self.allowed: dict[int, bool] = {}
        self.runs: dict[tuple[int, ...], int] = {}  # validate_tokens of a short list
        self.firsts: dict[tuple[int, ...], int | None] = {}  # the first allowed of candidates
        self.accepting: bool | None = None
        self.stopped: bool | None = None
        self.ff_bytes: bytes | None = None
        self.ff_tokens: tuple[int, ...] | None = None
        self.mask: bytes | None = None
        self.few: frozenset[int] | None = None  # the tokens `mask` allows, where few (`FEW`)
        self.matcher: LLMatcher | None = None  # a real matcher at this state (`MEMO_MATCHERS`)
        self.next: dict[int, _State] = {}
        # The step taken here without looking at the script: (forced, tokens) (`Tracked.step`).
        self.step: tuple[bool, tuple[int, ...]] | None = None


class StateMemo:
    """One grammar's remembered states, from its start."""

    def __init__(self) -> None:
        self.root = _State()
        self.states = 1
        self.masks = 0
        self.matchers = 0


class Tracked:
    """A matcher whose questions are answered from `memo` where it knows the state (the LLMatcher
    calls the steering makes; the answers are the same either way). `memo` only for a matcher at
    its grammar's start; None: every question goes to the matcher."""

    __slots__ = ("_debt", "_depth", "_matcher", "_memo", "_source", "_state")

    def __init__(self, matcher: LLMatcher, memo: StateMemo | None = None) -> None:
        self._matcher: LLMatcher | None = matcher
        self._source: Tracked | None = None  # a branch's: its matcher is copied from it when needed
        self._memo = memo
        self._state: _State | None = memo.root if memo is not None else None
        self._depth = 0
        self._debt: list[int] = []  # consumed here, not yet by the matcher

    def _synced(self) -> LLMatcher:
        """The real matcher at this state: the one handed in (or a branch's copy of its source's)
        with the tokens owed to it consumed, or a copy of the one the state keeps."""
        matcher = self._matcher
        if matcher is not None and not self._debt:
            return matcher
        state, memo = self._state, self._memo
        if state is not None and state.matcher is not None:
            self._debt = []
            matcher = self._matcher = state.matcher.deep_copy()
            return matcher
        if matcher is None:
            assert self._source is not None
            matcher = self._matcher = self._source._synced().deep_copy()
        if self._debt:
            if not matcher.consume_tokens(self._debt):
                raise RuntimeError(f"llguidance refused tokens it had allowed: {matcher.get_error()}")
            owed, self._debt = len(self._debt), []
            room = memo is not None and memo.matchers < MEMO_MATCHERS
            if state is not None and memo is not None and room and owed >= KEEP_AFTER:
                state.matcher = matcher.deep_copy()
                memo.matchers += 1
        return matcher

    def branch(self) -> Tracked:
        """A matcher at this state that goes on apart from this one (the real matcher is copied only
        when it is first asked something the memo does not know)."""
        other = Tracked.__new__(Tracked)
        other._matcher, other._source, other._memo = None, self, self._memo
        other._state, other._depth, other._debt = self._state, self._depth, []
        return other

    def _walk(self, tokens: list[int], grow: bool) -> None:
        state, depth, memo = self._state, self._depth, self._memo
        for token in tokens:
            if state is None:
                break
            child = state.next.get(token)
            room = memo is not None and depth < MEMO_DEPTH and memo.states < MEMO_STATES
            if child is None and grow and room:
                assert memo is not None
                child = state.next[token] = _State()
                memo.states += 1
            state, depth = child, depth + 1
        self._state, self._depth = state, depth

    # -- questions ---------------------------------------------------------------------------------

    def allows(self, token: int) -> bool:
        """Whether the grammar allows `token` here (`validate_tokens([token]) == 1`)."""
        state = self._state
        if state is None:
            return self._synced().validate_tokens([token]) == 1
        hit = state.allowed.get(token)
        if hit is None:
            hit = self._synced().validate_tokens([token]) == 1
            if len(state.allowed) < ANSWERS:
                state.allowed[token] = hit
        return hit

    def running(self) -> bool:
        """Neither stopped nor in error (the steering's loop condition)."""
        state = self._state
        if state is not None and state.stopped is False:
            return True
        return not self.is_stopped() and not self.is_error()

    def validate_tokens(self, tokens: list[int]) -> int:
        state = self._state
        if state is None or not tokens:
            return self._synced().validate_tokens(tokens)
        first = state.allowed.get(tokens[0])
        if len(tokens) == 1:
            return int(self.allows(tokens[0]) if first is None else first)
        if first is False:
            return 0
        key = tuple(tokens) if len(tokens) <= RUN_KEY else None
        if key is not None and key in state.runs:
            return state.runs[key]
        n = self._synced().validate_tokens(tokens)
        if len(state.allowed) < ANSWERS:
            state.allowed[tokens[0]] = n > 0
        if key is not None and len(state.runs) < ANSWERS:
            state.runs[key] = n
        return n

    def recall_first(self, candidates: tuple[int, ...]) -> int | None:
        """The first allowed token of `candidates` (None: none is) where this state has been asked
        (-1: not asked)."""
        state = self._state
        return -1 if state is None else state.firsts.get(candidates, -1)

    def remember_first(self, candidates: tuple[int, ...], token: int | None) -> None:
        if self._state is not None:
            self._state.firsts[candidates] = token

    def step(self) -> tuple[bool, tuple[int, ...]] | None:
        """The step the steering took at this state without looking at its script: the grammar's
        forced tokens (True) or one token chosen from its preferred tokens or openers (False)."""
        return self._state.step if self._state is not None else None

    def here(self) -> _State | None:
        """This state, to remember the step taken from it (`remember_step`)."""
        return self._state

    @staticmethod
    def remember_step(state: _State | None, forced: bool, tokens: tuple[int, ...]) -> None:
        if state is not None:
            state.step = (forced, tokens)

    def replay(
        self,
        script: Sequence[int],
        i: int,
        out: list[int],
        limit: int,
        budget: int,
        prefixes: Callable[[int], Sequence[int]] | None,
        repeats: int,
    ) -> int:
        """The steps remembered at the states from here (`step`), taken in a row while memory
        alone answers every question `steer`'s loop asks before taking one: running, not
        accepting, the script's token at `i` refused, a chosen token's allowed prefix refused,
        the same token not chosen `repeats` times in a row, the step's tokens allowed and their
        states known. The call's opening then costs dictionary lookups, not a loop turn of method
        calls per token; where memory falls short the loop takes the step itself. Appends to
        `out` while it is shorter than `limit` (forced tokens must fit in `budget`); returns the
        script position after the steps."""
        n, state, depth = len(script), self._state, self._depth
        while state is not None and len(out) < limit:
            step = state.step
            if step is None or state.stopped is not False or state.accepting is not False:
                break
            if i < n and state.allowed.get(script[i]) is not False:
                break
            forced, tokens = step
            if forced:
                if len(tokens) > budget - len(out) or not self._known(state, tokens):
                    break
                after: _State | None = state
                for token in tokens:
                    after = after.next.get(token) if after is not None else None
            else:
                token = tokens[0]
                shorter = prefixes(script[i]) if i < n and prefixes is not None else ()
                if shorter and state.allowed.get(shorter[-1]) is not False:
                    break
                if len(out) >= repeats and out[-repeats:] == [token] * repeats:
                    break
                after = state.next.get(token) if state.allowed.get(token) is True else None
            if after is None:
                break
            i += not forced and i < n  # a chosen token replaces the refused scripted one
            self._debt += tokens
            out += tokens
            state, depth = after, depth + len(tokens)
        self._state, self._depth = state, depth
        return i

    def _answer(self, fact: str, ask: Callable[[LLMatcher], T]) -> T:
        """`ask` of the matcher, remembered as the state's `fact` where the state is known."""
        state = self._state
        if state is None:
            return ask(self._synced())
        value = getattr(state, fact)
        if value is None:
            value = ask(self._synced())
            setattr(state, fact, value)
        return cast(T, value)

    def is_accepting(self) -> bool:
        return self._answer("accepting", LLMatcher.is_accepting)

    def is_stopped(self) -> bool:
        return self._answer("stopped", LLMatcher.is_stopped)

    def is_error(self) -> bool:
        # a remembered state was reached by allowed tokens only
        return False if self._state is not None else self._synced().is_error()

    def compute_ff_bytes(self) -> bytes:
        return self._answer("ff_bytes", lambda m: bytes(m.compute_ff_bytes()))

    def compute_ff_tokens(self) -> list[int]:
        """llguidance's forced tokens (not always allowed: see `steer`)."""
        state = self._state
        if state is None:
            return self._synced().compute_ff_tokens()
        if state.ff_tokens is None:
            state.ff_tokens = tuple(self._synced().compute_ff_tokens())
        return list(state.ff_tokens)

    def known_mask(self) -> bytes | None:
        """This state's vocabulary mask, where one was computed here before."""
        return self._state.mask if self._state is not None else None

    def few_allowed(self) -> frozenset[int] | None:
        """The tokens this state allows, where its mask is remembered and allows few (`FEW`): a
        script none of whose tokens is among them has nothing to resync to here."""
        return self._state.few if self._state is not None else None

    def compute_bitmask(self) -> bytes:
        mask = self._synced().compute_bitmask()
        state, memo = self._state, self._memo
        if state is not None and memo is not None and memo.masks < MEMO_MASKS:
            state.mask = mask
            memo.masks += 1
            if int.from_bytes(mask, "little").bit_count() <= FEW:
                bits = ((at, byte) for at, byte in enumerate(mask) if byte)
                state.few = frozenset(at * 8 + k for at, byte in bits for k in range(8) if byte >> k & 1)
        return mask

    # -- moves -------------------------------------------------------------------------------------

    def consume_tokens(self, tokens: list[int]) -> bool:
        """Consume the steering's own tokens (forced, or chosen from the allowed ones): owed to the
        matcher where the state says they are allowed, and remembered as states of their own."""
        state = self._state
        if state is not None and self._known(state, tokens):
            self._debt += tokens
            self._walk(tokens, grow=True)
            return True
        ok = self._synced().consume_tokens(tokens)
        if ok:
            self._walk(tokens, grow=True)
        else:
            self._state = None
        return ok

    def consume_token(self, token: int) -> bool:
        state = self._state
        if state is not None and state.allowed.get(token) is True:  # the usual step, inline
            child = state.next.get(token)
            if child is not None:
                self._debt.append(token)
                self._state, self._depth = child, self._depth + 1
                return True
        return self.consume_tokens([token])

    def consume_run(self, tokens: list[int]) -> bool:
        """Consume a run copied from the script (validated): followed in the trie where it already
        is, never added to it."""
        ok = self._synced().consume_tokens(tokens)
        if ok:
            self._walk(tokens, grow=False)
        else:
            self._state = None
        return ok

    def try_consume_tokens(self, tokens: list[int]) -> int:
        n = self._synced().try_consume_tokens(tokens)
        self._walk(tokens[:n], grow=False)
        return n

    def deep_copy(self) -> LLMatcher:
        """The real matcher's copy, at this state."""
        return self._synced().deep_copy()

    def get_error(self) -> str:
        return self._synced().get_error()

    @staticmethod
    def _known(state: _State, tokens: Sequence[int]) -> bool:
        if len(tokens) == 1:
            return state.allowed.get(tokens[0]) is True
        return state.runs.get(tuple(tokens)) == len(tokens) if len(tokens) <= RUN_KEY else False
