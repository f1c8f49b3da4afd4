"""The llguidance edge: tokenizers, the bounded compile cache, schema checks and masked steering.

- `GrammarEngine`: one per tokenizer (shared by the frontend and an in-process sim worker through
  `engine_for`). `check(grammar)` compiles once and remembers the compiled matcher (or the error) in a
  bounded LRU keyed by (grammar source, end-of-turn ids); `matcher(grammar)` hands out a copy of it
  (`LLMatcher.deep_copy`, microseconds), so nothing is compiled on the per-token path.
- `schema_error(schema)`: llguidance's verdict on one JSON schema (invalid, or a feature it cannot
  enforce), cached by the schema's canonical JSON: the frontend's 400 names the field before any
  engine work.
- `steer(...)`: what the sim engine emits under a constraint: its scripted tokens while the grammar
  allows them, else a token from the grammar's mask (see its docstring). It computes masks the way
  a production engine's fast paths let it: runs of scripted tokens are validated and consumed a
  chunk per call (`validate_tokens`, `consume_tokens`), what the grammar forces comes from its
  forced tokens and bytes (`compute_ff_tokens`, `compute_ff_bytes`), and where the scripted token is
  refused and a replacement must be chosen, its candidates are checked one by one
  (`validate_tokens`); a full vocabulary mask is computed only when too many are asked or a random
  draw needs it.
"""

from __future__ import annotations

import functools
import json
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash
from llguidance import LLMatcher, LLTokenizer

from agentserve.constraints import states
from agentserve.constraints.lark_texts import lark_texts
from agentserve.constraints.states import StateMemo, Tracked

DEFAULT_CACHE_SIZE = 256
RESYNC_WINDOW = 256  # scripted tokens looked ahead for one the grammar allows again
REPEATS = 8  # a preferred token chosen this many times in a row is in free text: write a closer
RESCAN_AFTER = 16  # tokens emitted before the script is searched again after a search found nothing
NARROW = 512  # a mask with at most this many bytes set: a random choice enumerates its tokens
FIRST_CHUNK = 8  # scripted tokens validated before the whole rest is (a refusal is usually at once)
# A run of at least this many scripted tokens that ends the script with the grammar still open is
# not consumed (llguidance's commit, ~0.25 µs a token, 3× its validation): the steering goes on as
# from the state before the run (inside a string, the same state), and the whole output is
# validated from there at the end; where it is not valid, the request is steered again with every
# run consumed (`_steer`).
SPECULATE_MIN = 48
# Candidate tokens checked one by one (`validate_tokens`, ~0.4 µs each) at a step where a token must
# be chosen, before the vocabulary mask is computed instead (~5–60 µs here, more over a 150k vocab).
PROBES = 24
WHOLE_TRIED = 64  # literals validated whole at one step, at most (`_allowed_whole`)
STUCK_AFTER = 16  # every this many random draws, a token that lets a closer follow is looked for
CLOSING_TRIED = 512  # allowed tokens tried at such a step, at most (`_closing_step`)
# Preferred when the script gives no allowed token: closing markers (`</tool_call>`, `<|end|>`),
# then what closes strings, objects and arrays, so a forced answer completes in few tokens
# (any allowed token is valid; these are merely short). Whitespace is never preferred: JSON allows
# it without end.
_CLOSERS = ('"', "}", "]", ")", ",", "0", "1")
_FILLERS = ("null", ":")
# Where no preferred token is allowed, before a seeded random draw: what opens the structure the
# grammar expects (a JSON object or array; the grammar's own opening markers such as `<tool_call>`,
# `GrammarEngine.openers`), so a forced call or value is written the same way whatever the seed and
# the plan stays shareable (a draw keys it by the seed).
_OPENERS = ("{", "[")
_REASONING = re.compile(r"^reasoning: (\S+) thought", re.MULTILINE)  # `constraints.build`'s rule


_TOKEN_REF = re.compile(r"<\[([^\]]*)\]>")  # a token by id in llguidance's Lark: `<[151645]>`
_SET_BYTE = re.compile(rb"[^\x00]")  # a mask byte with an allowed token: found at C speed


class GrammarError(ValueError):
    """A grammar llguidance refuses (the message is llguidance's)."""


@dataclass(frozen=True, slots=True)
class Steered:
    token_ids: list[int]
    complete: bool  # the output ended, and the grammar accepts it (False: the token budget cut it)
    diverged: int  # tokens chosen from the mask instead of the script
    random_choices: int = 0  # of those, drawn from the seeded generator (0: the seed did not matter)
    # The runs copied from the script, as (output position, script position, length): the sim
    # reuses the script's streamed pieces for them (the other tokens are the grammar's).
    copied: tuple[tuple[int, int, int], ...] = ()
    masks: int = 0  # full vocabulary masks computed (the benchmark and tests count them)


@dataclass(frozen=True, slots=True)
class _Aids:
    """One grammar's steering aids (`GrammarEngine._aids`)."""

    preferred: tuple[int, ...]  # the preferred tokens the grammar can allow (`referenced`)
    closers: tuple[tuple[int, ...], ...]  # its stop strings, then its closing literals (`closers`)
    stop_strings: tuple[tuple[int, ...], ...]  # its stop strings (`stop_strings`)
    literals: tuple[tuple[int, ...], ...]  # its other literals (`literals`)
    bulk: bool
    openers: tuple[int, ...]
    states: StateMemo = field(default_factory=StateMemo)  # what llguidance said of its states


class GrammarEngine:
    """llguidance over one tokenizer (`tokenizer_json`: a HF tokenizer.json's text; None: bytes)."""

    def __init__(self, tokenizer_json: str | None, *, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._source = tokenizer_json if tokenizer_json is not None else "byte"
        self.cache_size = cache_size
        self._tokenizers: dict[tuple[int, ...], LLTokenizer] = {}
        self._compiled: OrderedDict[tuple[str, tuple[int, ...]], LLMatcher | str] = OrderedDict()
        self._preferred: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._closing: dict[tuple[int, ...], frozenset[int]] = {}
        self._prefixes: dict[int, tuple[int, ...]] = {}
        self._blank: frozenset[int] | None = None
        self._quote: int | None = None
        self._special: tuple[tuple[int, str], ...] | None = None
        self._spelt: dict[int, bytes] = {}
        self._steering: OrderedDict[tuple[str, tuple[int, ...]], _Aids] = OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0  # grammars compiled (cache misses), for tests and the benchmark

    # -- tokenizer ---------------------------------------------------------------------------------

    def tokenizer(self, eos: tuple[int, ...] = ()) -> LLTokenizer:
        tok = self._tokenizers.get(eos)
        if tok is None:
            tok = LLTokenizer(self._source, eos_token=list(eos) if eos else None)
            self._tokenizers[eos] = tok
        return tok

    def specials(self, markers: Iterable[str]) -> dict[str, int]:
        """The markers this tokenizer holds as one special token, with their ids (a grammar
        references those as tokens; the others as text)."""
        tok = self.tokenizer()
        found: dict[str, int] = {}
        for marker in markers:
            ids = tok.tokenize_bytes(marker.encode(), parse_special=True) if marker else []
            if len(ids) == 1 and tok.is_special_token(ids[0]):
                found[marker] = ids[0]
        return found

    # -- compile cache -----------------------------------------------------------------------------

    def check(self, grammar: str, eos: tuple[int, ...] = ()) -> str | None:
        """llguidance's error for `grammar` (None: it compiles); compiled at most once per key."""
        compiled = self._compiled_for(grammar, eos)
        return compiled if isinstance(compiled, str) else None

    def matcher(self, grammar: str, eos: tuple[int, ...] = ()) -> LLMatcher:
        """A fresh matcher for `grammar` at its start. Raises GrammarError."""
        compiled = self._compiled_for(grammar, eos)
        if isinstance(compiled, str):
            raise GrammarError(compiled)
        return compiled.deep_copy()

    def _compiled_for(self, grammar: str, eos: tuple[int, ...]) -> LLMatcher | str:
        key = (grammar, eos)
        with self._lock:
            hit = self._compiled.get(key)
            if hit is not None:
                self._compiled.move_to_end(key)
                return hit
        matcher = LLMatcher(self.tokenizer(eos), LLMatcher.grammar_from_lark(grammar), log_level=0)
        compiled: LLMatcher | str = matcher.get_error() if matcher.is_error() else matcher
        with self._lock:
            self.compiles += 1
            self._compiled[key] = compiled
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        return compiled

    def preferred(self, eos: tuple[int, ...]) -> tuple[int, ...]:
        """Token ids tried first when the sim must choose from the mask (see `_CLOSERS`)."""
        hit = self._preferred.get(eos)
        if hit is None:
            tok = self.tokenizer(eos)
            ids: list[int] = list(eos)
            # Closing special tokens first: never allowed inside a JSON lexeme, so they only ever
            # close a free-text block (a thought, a harmony message), which would else run on.
            markers: list[int] = []
            for token in range(tok.vocab_size):
                if tok.is_special_token(token) and token not in eos:
                    text = tok.decode_str([token]).lower()
                    if text.startswith(("</", "[/")) or "end" in text:
                        markers.append(token)
            ids += markers
            self._closing[eos] = frozenset(markers)
            for text in (*_CLOSERS, *_FILLERS):
                found = tok.tokenize_str(text)
                if len(found) == 1:
                    ids.append(found[0])
            hit = tuple(dict.fromkeys(ids))
            self._preferred[eos] = hit
        return hit

    def special_tokens(self) -> tuple[tuple[int, str], ...]:
        """The tokenizer's special tokens with their text (scanned once)."""
        if self._special is None:
            tok = self.tokenizer()
            ids = [t for t in range(tok.vocab_size) if tok.is_special_token(t)]
            self._special = tuple((t, tok.decode_str([t])) for t in ids)
        return self._special

    def literals(self, grammar: str) -> tuple[tuple[int, ...], ...]:
        """The other string literals of `grammar`'s rules (`<function=Bash>`, `<parameter=`,
        `Bash(`), as tokens, in the order the grammar names them: what a step writes where the
        structure goes on as text and no token is preferred, instead of a random draw."""
        texts = [text for text in lark_texts(grammar).literals if not text.startswith("</")]
        # whitespace alone is no step forward (JSON takes it without end), as `blank` for a draw
        return tuple(t for t in self._tokenized(texts) if any(self.spell(token).strip() for token in t))

    def quote(self) -> int:
        """The token of `"` alone (-1: none): where three in a row are allowed, a step is writing
        free text (a raw XML value), not closing a JSON string (`steer`'s `quote`)."""
        if self._quote is None:
            found = self.tokenizer().tokenize_str('"')
            self._quote = found[0] if len(found) == 1 else -1
        return self._quote

    def blank(self) -> frozenset[int]:
        """The tokens that spell whitespace alone (a random choice avoids them: `_any_allowed`)."""
        if self._blank is None:
            tok = self.tokenizer()
            found = set()
            for token in range(tok.vocab_size):
                if not tok.is_special_token(token):
                    raw = tok.decode_bytes([token])
                    if raw and not raw.strip():
                        found.add(token)
            self._blank = frozenset(found)
        return self._blank

    def spell(self, token: int) -> bytes:
        """A token's bytes (cached: steering asks for the same script tokens again and again)."""
        hit = self._spelt.get(token)
        if hit is None:
            hit = self.tokenizer().decode_bytes([token])
            if len(self._spelt) < 1 << 20:
                self._spelt[token] = hit
        return hit

    def prefixes(self, token: int) -> tuple[int, ...]:
        """Single tokens spelling a strict prefix of `token`'s bytes, longest first (a scripted
        `"),` whose comma is forbidden can still give its `")`)."""
        hit = self._prefixes.get(token)
        if hit is None:
            tok = self.tokenizer()
            # a special token is one symbol (`<|im_end|>`): no part of its spelling is its meaning
            raw = b"" if tok.is_special_token(token) else tok.decode_bytes([token])
            found: list[int] = []
            for end in range(len(raw) - 1, 0, -1):
                if not raw[:end].strip():
                    break  # whitespace alone is no part of the token's meaning: never healed to it
                ids = tok.tokenize_bytes(raw[:end])
                if len(ids) == 1 and ids[0] != token:
                    found.append(ids[0])
            hit = tuple(found)
            if len(self._prefixes) < 1 << 20:
                self._prefixes[token] = hit
        return hit

    def stop_strings(self, grammar: str) -> tuple[tuple[int, ...], ...]:
        """The `stop="…"` strings of `grammar` (a raw XML value ends at its closing tag), as tokens."""
        return self._tokenized(lark_texts(grammar).stops)

    def closers(self, grammar: str) -> tuple[tuple[int, ...], ...]:
        """What closes a structure of `grammar` written as text, as tokens: its `stop="…"` strings
        and the literal closers its lazy lexemes hold (a raw XML value's `</parameter>`), then its
        literals shaped `</…>` (the XML families' `</function>`, `</invoke>`), in the order the
        grammar names them."""
        texts = lark_texts(grammar)
        closing = [text for text in texts.literals if text.startswith("</")]
        return self._tokenized([*texts.stops, *texts.lazy_closers, *closing])

    def _tokenized(self, texts: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """Texts as tokens, in order, once each."""
        tok = self.tokenizer()
        return tuple(dict.fromkeys(tuple(tok.tokenize_str(text)) for text in texts if text))

    def steer(
        self,
        matcher: LLMatcher,
        grammar: str,
        script: Sequence[int],
        *,
        eos: tuple[int, ...],
        max_tokens: int,
        rng: random.Random | int,
        stop_ids: Sequence[int] = (),
        at_start: bool = False,
    ) -> Steered:
        """`steer` under `grammar` (the source of `matcher`) with all this tokenizer's aids: what
        the sim emits. `at_start`: `matcher` is at the grammar's start (a fresh `matcher()`), so
        what llguidance says of its states is remembered for every request under `grammar`
        (`constraints.states`)."""
        aids = self._aids(grammar, eos)
        return steer(
            matcher,
            script,
            max_tokens=max_tokens,
            rng=rng,
            preferred=aids.preferred,
            closing=self.closing(eos),
            stop_ids=stop_ids,
            ends=eos,
            prefixes=self.prefixes,
            closers=aids.closers,
            stop_strings=aids.stop_strings,
            literals=aids.literals,
            quote=self.quote(),
            blank=self.blank(),
            tokenize=self.tokenizer(eos).tokenize_bytes,
            spell=self.spell,
            bulk=aids.bulk,
            openers=aids.openers,
            memo=aids.states if at_start and states.MEMO_STATES else None,
        )

    def _aids(self, grammar: str, eos: tuple[int, ...]) -> _Aids:
        """What `steer` needs from the grammar's source, read once per (grammar, eos): scanning a
        grammar of kilobytes per request cost more than the steering it informs."""
        key = (grammar, eos)
        hit = self._steering.get(key)
        if hit is None:
            hit = _Aids(
                self.referenced(grammar, eos),
                self.closers(grammar),
                self.stop_strings(grammar),
                self.literals(grammar),
                bulk_safe(grammar),
                self.openers(grammar, eos),
            )
            with self._lock:
                self._steering[key] = hit
                while len(self._steering) > self.cache_size:
                    self._steering.popitem(last=False)
        return hit

    def openers(self, grammar: str, eos: tuple[int, ...]) -> tuple[int, ...]:
        """What a step takes before a random draw (`_OPENERS`): `{`, `[`, then the special tokens
        `grammar` names that open a block (neither closing nor end-of-turn), in the order the
        grammar names them, less the reasoning block's opener (`reasoning: <think> thought …`):
        a forced call is written at once rather than after a thought."""
        tok = self.tokenizer(eos)
        named: list[tuple[int, int]] = []
        reasoning = set(_REASONING.findall(grammar))
        closing = self.closing(eos)
        for token, text in self.special_tokens():
            if token in eos or token in closing:
                continue
            names = [text, f"<[{token}]>"] if text.startswith("<") else [f"<[{token}]>"]
            at = min((k for k in (grammar.find(name) for name in names) if k >= 0), default=-1)
            if at >= 0 and not reasoning.intersection(names):
                named.append((at, token))
        ids = [found[0] for found in map(tok.tokenize_str, _OPENERS) if len(found) == 1]
        return tuple(dict.fromkeys([*ids, *(token for _, token in sorted(named))]))

    def referenced(self, grammar: str, eos: tuple[int, ...]) -> tuple[int, ...]:
        """`preferred(eos)` for `grammar`: its end-of-turn ids and closing markers, then the special
        tokens it names that open a block (`openers`), then the rest, less the special tokens
        `grammar` cannot allow anywhere. llguidance
        allows a special token only where the grammar names it (`<name>`, `<[id]>`; never inside a
        string, a regex or JSON), so the others need no check at a step (each costs a
        `validate_tokens`); an id range or any other `<[…]>` form keeps them all. The end-of-turn
        ids too: a step is taken only where the grammar does not accept, where llguidance allows
        them only if the grammar names them."""
        tok = self.tokenizer(eos)
        preferred = self.preferred(eos)
        refs = _TOKEN_REF.findall(grammar)
        if all(ref.isdigit() for ref in refs):
            ids = {int(ref) for ref in refs}

            def named(token: int) -> bool:  # `<tool_call>` by name, `[/INST]` only by id
                text = tok.decode_str([token])
                return token in ids or (text.startswith("<") and text in grammar)

            preferred = tuple(t for t in preferred if not tok.is_special_token(t) or named(t))
        # The grammar's own opening markers right after the closing ones: where one is allowed
        # with punctuation or digits (Kimi's `functions.Bash:0` then `<|tool_call_argument_begin|>`)
        # the marker goes on with the structure, where a digit would run on.
        specials = [t for t in preferred if tok.is_special_token(t)]
        marks = [t for t in self.openers(grammar, eos) if tok.is_special_token(t)]
        return tuple(dict.fromkeys([*specials, *marks, *preferred]))

    def closing(self, eos: tuple[int, ...]) -> frozenset[int]:
        """The special tokens that close a block (`</think>`, `</tool_call>`): when the sim has to
        choose one, its script resumes after its own copy of it."""
        self.preferred(eos)
        return self._closing[eos]


_ENGINES: dict[str, GrammarEngine] = {}
_ENGINES_LOCK = threading.Lock()


def engine_for(tokenizer_json: str | None, *, cache_size: int = DEFAULT_CACHE_SIZE) -> GrammarEngine:
    """The process's engine for a tokenizer (the frontend's checks warm an in-process worker's cache)."""
    key = "byte" if tokenizer_json is None else xxhash.xxh3_64_hexdigest(tokenizer_json.encode())
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = GrammarEngine(tokenizer_json, cache_size=cache_size)
            _ENGINES[key] = engine
        else:
            engine.cache_size = max(engine.cache_size, cache_size)
        return engine


# --------------------------------------------------------------------------------------------------
# JSON schemas


class _Verdicts:
    """llguidance's verdicts on grammars (None: it compiles; else why not), a bounded LRU by source:
    clients send the same schemas and grammars with every request."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._verdicts: OrderedDict[str, str | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, grammar: Callable[[str], str]) -> str | None:
        with self._lock:
            if key in self._verdicts:
                self._verdicts.move_to_end(key)
                return self._verdicts[key]
        try:
            error: str | None = LLMatcher.validate_grammar(grammar(key)) or None
        except ValueError as exc:
            error = str(exc)
        with self._lock:
            self._verdicts[key] = error
            while len(self._verdicts) > self._size:
                self._verdicts.popitem(last=False)
        return error


_schemas = _Verdicts(1024)
_larks = _Verdicts(256)


def schema_error(schema: Mapping[str, Any]) -> str | None:
    """Why llguidance cannot enforce `schema` (invalid JSON Schema, an unsupported feature), or None."""
    key = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    return _schemas.get(key, LLMatcher.grammar_from_json_schema)


def lark_error(source: str) -> str | None:
    """llguidance's verdict on a Lark grammar of its own (a custom tool's format): None when it
    compiles. Cached by source (Codex sends the same grammar with every request)."""
    return _larks.get(source, LLMatcher.grammar_from_lark)


# --------------------------------------------------------------------------------------------------
# Steering


def _allowed(mask: bytes, token: int) -> bool:
    byte = token >> 3
    return byte < len(mask) and (mask[byte] >> (token & 7)) & 1 == 1


class _Probe:
    """Which tokens the grammar allows at one step, asked token by token: the first `budget`
    questions are answered by `validate_tokens` (the same verdict as the mask's bit), the rest from
    the vocabulary mask, computed once when the budget is spent or a random choice needs it. Most
    steps are decided by a handful of candidates (the script's next token, a closer), so most cost
    no mask."""

    __slots__ = ("_left", "_matcher", "computed", "fresh")

    def __init__(self, matcher: Tracked, budget: int) -> None:
        self._matcher = matcher
        self._left = budget
        self.computed: bytes | None = None  # the mask, once asked for
        self.fresh = False  # the mask was computed at this step (not remembered of the state)

    def allowed(self, token: int) -> bool:
        mask = self.computed
        if mask is None:
            if self._left:
                self._left -= 1
                return self._matcher.allows(token)
            mask = self.mask()
        byte = token >> 3
        return byte < len(mask) and (mask[byte] >> (token & 7)) & 1 == 1

    def first(self, tokens: Iterable[int]) -> int | None:
        """The first allowed token of `tokens` (ids ≥ 0), in their order; a tuple of them (the
        grammar's preferred tokens, its openers) remembered per state."""
        if isinstance(tokens, tuple):
            known = self._matcher.recall_first(tokens)
            if known != -1:
                return known
            found = self._first(tokens)
            self._matcher.remember_first(tokens, found)
            return found
        return self._first(tokens)

    def _first(self, tokens: Iterable[int]) -> int | None:
        rest = iter(tokens)
        if self.computed is None:
            allows = self._matcher.allows
            for token in rest:
                if not self._left:
                    if _allowed(self.mask(), token):
                        return token
                    break
                self._left -= 1
                if allows(token):
                    return token
            else:
                return None
        mask = self.mask()
        size = len(mask)
        # `_allowed` inlined: this runs over the rest of the candidates (tens of them) at C speed
        return next((t for t in rest if t >> 3 < size and (mask[t >> 3] >> (t & 7)) & 1), None)

    def few(self) -> frozenset[int] | None:
        """The tokens the state allows, where known and few (`Tracked.few_allowed`)."""
        return self._matcher.few_allowed()

    def mask(self) -> bytes:
        """The vocabulary mask: the state's remembered one, else computed. Asked for only where a
        fresh step would compute it, so a remembered mask changes no answer: llguidance's mask and
        `validate_tokens` can disagree (a special token spelling the grammar's text: the mask
        allows it, consuming refuses it), and the first `PROBES` questions go to the matcher."""
        if self.computed is None:
            self.computed = self._matcher.known_mask()
            if self.computed is None:
                self.computed = self._matcher.compute_bitmask()
                self.fresh = True
        return self.computed


def _any_allowed(
    mask: bytes, rng: random.Random, blank: Container[int] = frozenset()
) -> tuple[int | None, bool]:
    """A seeded allowed token, not a `blank` one (whitespace alone) where another is allowed (JSON
    and the gaps between calls take whitespace without end: a blank token leaves the output where it
    was and costs another mask), and whether the seed chose it (False: it was the only candidate).
    Random probes where the mask is wide (many bytes set: they hit at once), else a choice among the
    allowed tokens themselves."""
    size = len(mask) * 8
    if len(mask) - mask.count(0) > len(mask) >> 4:
        for _ in range(32):
            token = rng.randrange(size)
            if _allowed(mask, token) and token not in blank:
                return token, True
    nonzero = [m.start() for m in _SET_BYTE.finditer(mask)]
    if not nonzero:
        return None, False
    if len(nonzero) <= NARROW:
        tokens = [byte * 8 + bit for byte in nonzero for bit in range(8) if (mask[byte] >> bit) & 1]
        pool = [t for t in tokens if t not in blank] or tokens
        if len(pool) == 1:
            return pool[0], False
        return pool[rng.randrange(len(pool))], True
    byte = nonzero[rng.randrange(len(nonzero))]  # wide, and the probes found only blanks
    bits = [bit for bit in range(8) if (mask[byte] >> bit) & 1]
    return byte * 8 + bits[rng.randrange(len(bits))], True


def _verified(
    anchor: tuple[Tracked, int, int],
    out: list[int],
    verdict: bool,
    end: int,
    ends: Container[int],
    stops: Sequence[Sequence[int]],
) -> bool:
    """Whether the output from a speculated run on is what the grammar allows from the run's exact
    state, accepting where `verdict` says (the end token is allowed exactly where it accepts).
    llguidance's validation stops right after a lazy lexeme ends at its stop string (a raw XML
    value at `</parameter>`), whatever follows: there a copy of the exact matcher consumes what
    was validated (~0.2 µs a token; validating is ~0.05) and the validation goes on from it."""
    exact, at, _ = anchor
    tail = out[at:]
    ended = bool(tail) and tail[-1] in ends
    checked, need = tail if ended else [*tail, end], len(tail) + (not ended and verdict)
    done, copy = 0, None
    while True:
        valid = (exact.validate_tokens if copy is None else copy.validate_tokens)(checked[done:])
        if done + valid == need:
            return True
        reached = done + valid
        if not valid or not any(
            len(s) <= reached and checked[reached - len(s) : reached] == list(s) for s in stops
        ):
            return False
        if copy is None:
            copy = exact.deep_copy()
        if not copy.consume_tokens(checked[done:reached]):
            return False
        done = reached


def _looping(out: Sequence[int], since: int, longest: int = 16, times: int = 3) -> bool:
    """Whether `out` ends with a run of at most `longest` tokens written `times` times running,
    all after position `since` (the steering's own choices, not a script that repeats itself)."""
    for period in range(1, min(longest, (len(out) - since) // times) + 1):
        tail = out[-period:]
        if all(out[-(k + 1) * period : len(out) - k * period] == tail for k in range(1, times)):
            return True
    return False


def _ends_twice(out: Sequence[int], text: Sequence[int]) -> bool:
    """Whether `out` ends with `text` twice running."""
    k = len(text)
    return len(out) >= 2 * k and list(out[-2 * k :]) == [*text, *text]


def _closing_step(
    matcher: Tracked, mask: bytes, closers: Sequence[tuple[int, ...]], blank: Container[int]
) -> tuple[int, ...] | None:
    """An allowed token (lowest ids first: single characters) after which one of the first
    closers is allowed whole, with that closer: the grammar's way out of a lexeme a script cannot
    finish. At most `CLOSING_TRIED` tokens are tried."""
    tried = 0
    for found in _SET_BYTE.finditer(mask):
        byte = found.start()
        for bit in range(8):
            token = byte * 8 + bit
            if not (mask[byte] >> bit) & 1 or token in blank:
                continue
            tried += 1
            if tried > CLOSING_TRIED:
                return None
            for closer in closers[:4]:
                step = (token, *closer)
                if matcher.validate_tokens(list(step)) == len(step):
                    return step
    return None


def _allowed_whole(
    matcher: Tracked,
    probe: _Probe,
    texts: Sequence[tuple[int, ...]],
    written: Container[tuple[int, ...]] = frozenset(),
) -> tuple[int, ...] | None:
    """The first of `texts` (a literal's tokens) the grammar allows whole here, one not `written`
    yet before one that was. A text whose first token is refused costs the probe's question (a
    bit of the mask once it is computed), and at most `WHOLE_TRIED` texts are validated whole: a
    grammar of hundreds of tools has thousands of literals."""
    again: tuple[int, ...] | None = None
    tried = 0
    for text in texts:
        if not text or not probe.allowed(text[0]):
            continue
        if tried == WHOLE_TRIED:
            break
        tried += 1
        if len(text) == 1 or matcher.validate_tokens(list(text)) == len(text):
            if text not in written:
                return text
            again = again or text
    return again


def _resync(
    probe: _Probe, script: Sequence[int], i: int, tokens: Callable[[], frozenset[int]]
) -> tuple[int | None, int]:
    """The script's next allowed token after position i (within `RESYNC_WINDOW`) and the position
    after it; (None, i) when there is none. Each distinct token is looked up once, in the order of
    first occurrence (`_window`): prose repeats its tokens. Where the state is known to allow few
    tokens, none of which the script has (`tokens`: its token set, built once), no window is read:
    the call's opening refuses every word of prose."""
    few = probe.few()
    if few is not None and few.isdisjoint(tokens()):
        return None, i
    token = probe.first(_window(script, i))
    if token is None:
        return None, i
    return token, script.index(token, i + 1) + 1


def _window(script: Sequence[int], i: int) -> Iterable[int]:
    """The distinct tokens of the script after position i within `RESYNC_WINDOW`, in the order of
    their first occurrence (the first one a test accepts is the one at the smallest position)."""
    return dict.fromkeys(script[i + 1 : i + RESYNC_WINDOW])


def _spelled(
    matcher: Tracked, script: Sequence[int], i: int, raw: bytes, spell: Callable[[int], bytes]
) -> int | None:
    """The first script position after i (within `RESYNC_WINDOW`) whose token the grammar allows
    while it forces the bytes `raw`, found without a mask: only a token whose bytes agree with `raw`
    can be allowed, and `validate_tokens` confirms it. It is the token `_resync` would find."""
    for token in _window(script, i):
        spelt = spell(token)
        if spelt and (raw.startswith(spelt) or spelt.startswith(raw)) and matcher.allows(token):
            return script.index(token, i + 1)
    return None


def _forced_text(matcher: Tracked, raw: bytes, tokenize: Callable[[bytes], list[int]]) -> list[int]:
    """The bytes the grammar forces next (a key's rest, `":`), tokenized and validated: llguidance's
    own forced tokens hold back the bytes whose tokenization is not yet certain, which would cost a
    mask per token there."""
    ids = tokenize(raw)
    return ids[: matcher.validate_tokens(ids)]


def bulk_safe(grammar: str) -> bool:
    """Whether `steer` may validate a run of tokens in one call under `grammar`: llguidance's
    `validate_tokens` does not count a `max_tokens` limit past the run's first token."""
    return "max_tokens" not in grammar


def _follow(matcher: Tracked, script: Sequence[int], i: int, room: int, bulk: bool) -> tuple[int, Tracked]:
    """Consume the longest allowed run of `script` from position i (at most `room` tokens); how many
    tokens that is, no mask, and the matcher to go on with. In growing chunks (8, 32, 128, …): after
    a refusal the next token is usually refused too, and handing llguidance the whole rest each time
    cost more than its check. `bulk` (a grammar without token limits, `bulk_safe`): the first chunk
    is one `validate_tokens` (no state change) then one `consume_tokens`, the same tokens as
    `try_consume_tokens` for ~25 % less CPU; once a chunk went through whole, the next is consumed
    at once (`consume_tokens` checks each token itself: the validation was a second pass over
    them) on a matcher whose copy (`deep_copy`, ~2 µs) is kept in case it is refused, the copy then
    going on as above (a refused `consume_tokens` leaves its matcher in error)."""
    taken, size, end = 0, 8, min(len(script), i + room)
    while i + taken < end:
        run = list(script[i + taken : min(end, i + taken + size)])
        if bulk and taken:
            backup = Tracked(matcher.deep_copy())
            if matcher.consume_run(run):
                n = len(run)
            else:
                matcher = backup
                n = _validated(matcher, run)
        elif bulk:
            n = _validated(matcher, run)
        else:
            n = matcher.try_consume_tokens(run)
        taken += n
        if n < len(run):
            break
        size *= 4
    return taken, matcher


def _validated(matcher: Tracked, run: list[int]) -> int:
    """Consume the allowed prefix of `run`, checked first by `validate_tokens`; its length."""
    n = matcher.validate_tokens(run)
    if n and not matcher.consume_run(run[:n]):
        raise RuntimeError(f"llguidance refused tokens it had validated: {matcher.get_error()}")
    return n


def _after_closer(script: Sequence[int], i: int, forced: Sequence[int], closing: frozenset[int]) -> int:
    """Where the script goes on after forced tokens: past its own copy of the first closing token
    among them (a block closed early) and of the forced tokens that follow it there; else `i`."""
    for k, token in enumerate(forced):
        if token in closing and token in script[i:]:
            j = script.index(token, i) + 1
            for rest in forced[k + 1 :]:
                if j >= len(script) or script[j] != rest:
                    break
                j += 1
            return j
    return i


def _run(
    matcher: Tracked, script: Sequence[int], i: int, room: int, end: int, ends: Container[int]
) -> tuple[int, bool]:
    """How many tokens of `script` from position i (at most `room`) the grammar allows in a row, and
    whether it accepts after them (its end-of-turn token `end` is allowed there, or the run ends
    with one): validated only, nothing consumed. The first `FIRST_CHUNK` tokens alone first (a
    refused script is usually refused at once), then the whole rest with `end` after it."""
    if not matcher.allows(script[i]):
        return 0, False  # the usual refusal: one question (remembered per state)
    stop = min(len(script), i + room)
    first = list(script[i : min(stop, i + FIRST_CHUNK)])
    k = matcher.validate_tokens(first)
    if k < len(first):
        return k, bool(k) and first[k - 1] in ends
    rest = [*script[i:stop], end]
    k = matcher.validate_tokens(rest)
    if k == len(rest):
        return k - 1, True
    return k, bool(k) and rest[k - 1] in ends  # a run that takes a scripted end-of-turn token


def _commit(matcher: Tracked, run: Sequence[int]) -> None:
    """Consume `run`, which `validate_tokens` allowed."""
    if not matcher.consume_run(list(run)):
        raise RuntimeError(f"llguidance refused tokens it had validated: {matcher.get_error()}")


def steer(
    matcher: LLMatcher,
    script: Sequence[int],
    *,
    max_tokens: int,
    rng: random.Random | int,
    preferred: Sequence[int] = (),
    closing: frozenset[int] = frozenset(),
    stop_ids: Sequence[int] = (),
    ends: Sequence[int] = (),
    prefixes: Callable[[int], Sequence[int]] | None = None,
    closers: Sequence[tuple[int, ...]] = (),
    stop_strings: Sequence[Sequence[int]] = (),
    literals: Sequence[tuple[int, ...]] = (),
    quote: int = -1,
    openers: Sequence[int] = (),
    blank: Container[int] = frozenset(),
    tokenize: Callable[[bytes], list[int]] | None = None,
    spell: Callable[[int], bytes] | None = None,
    bulk: bool = False,
    memo: StateMemo | None = None,
) -> Steered:
    """The output under `matcher`'s grammar: the script while its next token is allowed; when it is
    not, the end of the turn if the grammar may end here, else the tokens the grammar forces
    (`compute_ff_tokens`, else the script's next token spelling its forced bytes (`spell`: a token's
    bytes), else those bytes as `tokenize` spells them), else the longest allowed token spelling a
    prefix of the scripted one (`prefixes`: `")` of a `"),` whose comma is forbidden), else the
    script's next allowed token within `RESYNC_WINDOW` (a forced call skips the prose before it),
    else a preferred allowed token (`preferred`: end and closing markers, the grammar's opening
    markers, then punctuation), else the first of `closers` the grammar allows whole (its `stop`
    strings such as `</parameter>`, then its `</…>` literals such as `</function>`), else an opener
    (`openers`: `{`, `[`, the grammar's own opening markers), else the first of `literals` the
    grammar allows whole (its other literals: `<function=Bash>`, `<parameter=`), else a seeded
    random allowed token (not a `blank` one where another is allowed). A closer also replaces the
    preferred token where that would be `"` (`quote`) and three in a row are allowed (free text, a
    raw XML value: it would close nothing), or where one preferred token keeps being chosen. A
    chosen token in `closing` (a block closed early, as a spent thinking budget closes `</think>`)
    resumes the script after the script's own copy of it. Where the grammar accepts and the script
    goes on with a token it refuses, the turn ends with `stop_ids[0]` (when given): the steering
    cut the script short, as a mask allowing only the end token does. A script that runs to its
    end ends there, without one, as it does unconstrained.
    Every emitted token passed the matcher: the output never holds a token the grammar forbids.
    Cost: where the script is allowed its tokens are validated in bulk (`bulk`: a grammar without
    token limits, `bulk_safe`) and consumed only where the steering goes on after them (`_run`: a
    script the grammar accepts whole costs one validation), forced text costs no mask, a step's
    candidates are checked one by one (`_Probe`: `validate_tokens`, the mask's verdict) and a
    vocabulary mask is computed only where more than `PROBES` of them are asked or a random draw
    needs it (`Steered.masks` counts them). `rng`: the seeded generator, or its seed (built only
    for a random draw: most plans make none). `memo`: `matcher` is at its grammar's start, and what
    llguidance says of the states the steering's own tokens reach is remembered there."""
    go = functools.partial(
        _steer, script=script, max_tokens=max_tokens, rng=rng, preferred=preferred, closing=closing,
        stop_ids=stop_ids, ends=ends or stop_ids, prefixes=prefixes, closers=closers,
        stop_strings=stop_strings, literals=literals, quote=quote,
        openers=openers, blank=blank, tokenize=tokenize, spell=spell,
    )  # fmt: skip
    if bulk and (ends or stop_ids):
        start = matcher.deep_copy()
        steered = go(Tracked(matcher, memo), fast=True)
        if steered is not None:
            return steered
        matcher = start  # a speculated run did not verify: steer again, consuming every run
    steered = go(Tracked(matcher, memo), fast=False, bulk=bulk)
    assert steered is not None
    return steered


def _steer(
    matcher: Tracked,
    script: Sequence[int],
    *,
    max_tokens: int,
    rng: random.Random | int,
    preferred: Sequence[int],
    closing: frozenset[int],
    stop_ids: Sequence[int],
    ends: Sequence[int],
    prefixes: Callable[[int], Sequence[int]] | None,
    closers: Sequence[tuple[int, ...]],
    stop_strings: Sequence[Sequence[int]],
    literals: Sequence[tuple[int, ...]],
    quote: int,
    openers: Sequence[int],
    blank: Container[int],
    tokenize: Callable[[bytes], list[int]] | None,
    spell: Callable[[int], bytes] | None,
    fast: bool,
    bulk: bool = True,
) -> Steered | None:
    """`steer`'s loop. `fast`: runs are validated with the end token after them (`_run`), a run the
    grammar accepts after ends the turn unconsumed, and a long run that exhausts the script is
    speculated (`SPECULATE_MIN`); None when that speculation does not verify."""
    out: list[int] = []
    copied: list[tuple[int, int, int]] = []

    def copy(at: int, length: int) -> None:  # out[len(out):+length] is script[at:+length]
        start = len(out)
        if copied and copied[-1][0] + copied[-1][2] == start and copied[-1][1] + copied[-1][2] == at:
            start, at, length = copied[-1][0], copied[-1][1], copied.pop()[2] + length
        copied.append((start, at, length))

    wanted = tuple(t for t in preferred if t >= 0)
    i, n = 0, len(script)
    diverged = masks = 0
    stops = set(stop_ids)
    end_set = set(ends)
    end = ends[0] if ends else -1
    pending: list[int] = []  # the rest of a text closer being written
    drawn = 0
    next_scan = 0  # output length from which the script may be searched again
    verdict: bool | None = None  # whether the grammar accepts the output, where a run decided it
    # a speculated run's exact state, where it starts in the output, its length
    anchor: tuple[Tracked, int, int] | None = None
    distinct: list[frozenset[int]] = []  # the script's token set, once a resync asks for it
    written: set[tuple[int, ...]] = set()  # the literals written

    def script_tokens() -> frozenset[int]:
        if not distinct:
            distinct.append(frozenset(script))
        return distinct[0]

    while len(out) < max_tokens and matcher.running():
        room = max_tokens - len(out)
        if i < n:
            if fast:
                taken, accepts = _run(matcher, script, i, room, end, end_set)
                if taken:
                    run = script[i : i + taken]
                    copy(i, taken)
                    out.extend(run)
                    i += taken
                    if (i == n and accepts) or len(out) >= max_tokens:
                        # the script ends the turn here (or the budget does): the run need not be
                        # consumed, and it ends as the script does (no end token of the grammar's)
                        verdict = accepts
                        break
                    if i == n and taken >= SPECULATE_MIN and anchor is None:
                        # the run ends the script inside an open lexeme (prose in an argument):
                        # the steering goes on as from the state before it, remembered states and
                        # all, and the output is validated from there at the end
                        anchor, matcher = (matcher, len(out) - taken, taken), matcher.branch()
                        continue
                    _commit(matcher, run)
                    continue
            else:
                taken, matcher = _follow(matcher, script, i, room, bulk)
                if taken:
                    copy(i, taken)
                    out.extend(script[i : i + taken])
                    i += taken
                    continue
        if matcher.is_accepting():
            # The grammar may end here and the script has nothing it takes: the turn ends, with the
            # end token where the script goes on (cut short, as a mask allowing only the end token
            # cuts a model short), as the script itself ends where it has nothing more. Validated,
            # not consumed: consuming it cost ~30 µs, a tenth of a whole request's steering.
            if i < n and script[i] not in stops and stop_ids and matcher.allows(stop_ids[0]):
                out.append(stop_ids[0])
            break
        here = matcher.here()
        # The script is not searched at this step (`next_scan`) and nothing is pending: a step this
        # state took before without looking at its script is taken again where this script does
        # not change it either (its token's allowed prefix would: `prefixes`).
        free = not pending and len(out) < next_scan
        if free:  # the steps remembered from here, while memory answers the questions above
            before = len(out)
            i = matcher.replay(script, i, out, min(max_tokens, next_scan), max_tokens, prefixes, REPEATS)
            if len(out) > before:
                diverged += len(out) - before
                continue
        remembered = matcher.step() if free else None
        if remembered is not None:
            by_grammar, tokens = remembered
            if by_grammar and len(tokens) <= room:
                if not matcher.consume_tokens(list(tokens)):
                    break
                out.extend(tokens)
                diverged += len(tokens)
                continue
            token = tokens[0]
            shorter = prefixes(script[i]) if i < n and prefixes is not None else ()
            repeated = len(out) >= REPEATS and out[-REPEATS:] == [token] * REPEATS
            if not by_grammar and not repeated and not (shorter and matcher.allows(shorter[-1])):
                i += i < n  # the forbidden scripted token is replaced by the chosen one
                if not matcher.consume_token(token):
                    break
                out.append(token)
                diverged += 1
                continue
        if not pending:
            # What the grammar allows alone: no mask needed. Its forced tokens spell forced bytes (a
            # forced special token too), so where no byte is forced (most steps: whitespace is
            # allowed) the tokens are not asked for.
            raw = matcher.compute_ff_bytes()
            forced = matcher.compute_ff_tokens() if raw else []
            if forced:  # they can spell forced text with a special token the grammar refuses there
                forced = forced[: matcher.validate_tokens(forced)]
            if raw and not forced and tokenize is not None and spell is not None:
                # the script's own copy of the forced text first (it goes on after it)
                at = _spelled(matcher, script, i, raw, spell) if len(out) >= next_scan else None
                if at is not None:
                    i = at
                    continue
                forced = _forced_text(matcher, raw, tokenize)
            if forced:
                whole = len(forced) <= room
                forced = forced[:room]
                if not matcher.consume_tokens(forced):
                    break
                if free and whole and not closing.intersection(forced):
                    matcher.remember_step(here, True, tuple(forced))
                out.extend(forced)
                diverged += len(forced)
                i = _after_closer(script, i, forced, closing)
                continue
        probe = _Probe(matcher, PROBES)
        chosen: int | None = None
        source = -1  # the script position of the chosen token, if it is the script's
        if pending and probe.allowed(pending[0]):
            chosen = pending.pop(0)
        else:
            pending.clear()
        if chosen is None and i < n and prefixes is not None:  # the allowed part of a token that overshoots
            shorter = prefixes(script[i])
            # a token is allowed only if its bytes are, so the shortest prefix refused refuses them all
            if shorter and probe.allowed(shorter[-1]):
                free = False
                chosen = next((t for t in shorter if probe.allowed(t)), None)
            if chosen is not None:
                i += 1
        if chosen is None and len(out) >= next_scan:
            chosen, i = _resync(probe, script, i, script_tokens)
            if chosen is None:
                next_scan = len(out) + RESCAN_AFTER  # the script is far off: look again later
            else:
                source = i - 1
        if chosen is None:
            chosen = probe.first(wanted)
            repeated = chosen is not None and len(out) >= REPEATS and out[-REPEATS:] == [chosen] * REPEATS
            # `"` where three in a row are allowed writes text (a raw value), closing no string:
            # JSON allows two at a key or a value (an empty string), never three
            in_text = chosen == quote and bool(closers) and matcher.validate_tokens([quote] * 3) == 3
            if repeated or in_text:
                chosen = None  # free text takes the preferred token forever: close it instead
            # the fixed choices below went round in a circle (free text holds them all): a draw
            looping = chosen is None and _looping(out, copied[-1][0] + copied[-1][2] if copied else 0)
            repeated = repeated or looping
            if chosen is None and not looping:
                closer = _allowed_whole(matcher, probe, closers)
                # a closer written twice running closed nothing (free text holds it): not again
                if closer is not None and not _ends_twice(out, closer):
                    chosen, pending = closer[0], list(closer[1:])
                    free = False
            if chosen is None and not repeated:
                chosen = probe.first(openers)
                if chosen is not None and len(out) >= REPEATS and out[-REPEATS:] == [chosen] * REPEATS:
                    chosen = None  # an opener free text keeps taking: it opens nothing
            if (
                chosen is None
                and closers
                and (looping or (drawn >= STUCK_AFTER and drawn % STUCK_AFTER == 0))
            ):
                # many draws and no way out yet: a token after which a closer fits (the character a
                # pattern wants last before `</parameter>`), as a model ends a value
                step = _closing_step(matcher, probe.mask(), closers, blank)
                if step is not None:
                    chosen, pending = step[0], list(step[1:])
                    drawn += 1  # not this step again at once
                    free = False
            if chosen is None and not repeated:
                # one not written yet first: the structure goes on (harmony's `commentary` after
                # an `analysis` message) rather than round a loop the grammar allows
                literal = _allowed_whole(matcher, probe, literals, written)
                if literal is not None and not _ends_twice(out, literal):
                    chosen, pending = literal[0], list(literal[1:])
                    written.add(literal)
                    free = False
            if chosen is None:
                if isinstance(rng, int):  # a seed: the generator is built at the first draw (~5 µs)
                    rng = random.Random(rng)
                chosen, seeded = _any_allowed(probe.mask(), rng, blank)
                drawn += seeded
                free = False
            if chosen is not None and chosen in closing and chosen in script[i:]:
                i = script.index(chosen, i) + 1  # a block closed early: the script goes on after it
            elif chosen is not None and i < n:
                i += 1  # the forbidden scripted token is replaced by the chosen one
            if free and chosen is not None and chosen not in closing and not probe.fresh:
                matcher.remember_step(here, False, (chosen,))
        masks += probe.fresh
        if chosen is None or not matcher.consume_token(chosen):
            break
        if source >= 0:
            copy(source, 1)
        out.append(chosen)
        diverged += 1
    if verdict is None:
        verdict = not matcher.is_error() and (matcher.is_accepting() or matcher.is_stopped())
    if anchor is not None and not _verified(anchor, out, verdict, end, end_set, stop_strings):
        return None
    # The budget cut the output unless it ended there anyway: an end token, a stopped grammar, or
    # the script's own last token (a script that ends there, as it ends unconstrained).
    ended = (
        len(out) < max_tokens
        or (bool(out) and out[-1] in end_set)
        or matcher.is_stopped()
        or (i >= n and bool(copied) and copied[-1][0] + copied[-1][2] == len(out) == max_tokens
            and copied[-1][1] + copied[-1][2] == n)
    )  # fmt: skip
    return Steered(out, verdict and ended, diverged, drawn, tuple(copied), masks)
