"""The fixed texts of a Lark grammar (llguidance's Lark-like syntax), read once per grammar (pure).

The sim's steering writes the structure a grammar expects where its script says nothing: the
literals of its rules (`<function=Bash>`, `</function>`), the `stop="…"` strings that end a lazy
lexeme, and the closing text a lazy lexeme's regex ends with (`pvalue[lazy]: /(.|\\n)*<\\/parameter>/`).
A scan, not a regex over the source: a `%json{…}` schema (its strings are data), a `/…/` regex, an
attribute's value and a comment hold quotes that are no literal of the grammar.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
    (?P<comment>(?://|\#)[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[a-z]*)
  | (?P<json>%json\s*(?=\{))
  | (?P<stop>\[stop\s*=\s*)
  | (?P<lazy>\[lazy\]\s*:\s*)
  | (?P<other>[^"/#%\[]+|.)
    """,
    re.VERBOSE | re.DOTALL,
)
# A lazy lexeme's regex that runs to a closing text: any text, then the text (escaped punctuation)
_ANY_THEN = re.compile(r"\(\.\|\\n\)\*((?:[^\\\[\](){}|.*+?^$/]|\\[^a-zA-Z0-9])+)")


@dataclass(frozen=True, slots=True)
class LarkTexts:
    literals: tuple[str, ...]  # the rules' string literals, in order, once each
    stops: tuple[str, ...]  # the `stop="…"` strings
    lazy_closers: tuple[str, ...]  # the texts lazy lexemes' regexes end with (any text before)


@functools.lru_cache(maxsize=64)  # asked three times per grammar (its closers, stops, literals)
def lark_texts(grammar: str) -> LarkTexts:
    """The fixed texts of `grammar` (a text that cannot be read is left out: the steering draws)."""
    literals: list[str] = []
    stops: list[str] = []
    closers: list[str] = []
    at = 0
    while at < len(grammar):
        kind, text, at = _next(grammar, at)
        if kind == "json":
            at = _past_json(grammar, at)
        elif kind == "string" and (value := _string(text)):
            literals.append(value)
        elif kind == "stop":  # `[stop="…"]`: the attribute's string, no literal of the rules
            kind, text, at = _next(grammar, at)
            if kind == "string" and (value := _string(text)):
                stops.append(value)
        elif kind == "lazy":  # `[lazy]: /…/`: a regex that runs to a closing text?
            kind, text, at = _next(grammar, at)
            tail = _ANY_THEN.fullmatch(text[1 : text.rindex("/")]) if kind == "regex" else None
            if tail is not None:
                closers.append(re.sub(r"\\(.)", r"\1", tail.group(1)))
    return LarkTexts(_once(literals), _once(stops), _once(closers))


def _once(texts: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(texts))


def _next(source: str, at: int) -> tuple[str, str, int]:
    """The next token from `at` that is not blank: its kind, its text, the position past it."""
    while True:
        m = _TOKEN.match(source, at)
        if m is None:  # past the end (`other` takes any one character)
            return "", "", len(source)
        if m.lastgroup != "other" or m.group().strip():
            return m.lastgroup or "", m.group(), m.end()
        at = m.end()


def _string(token: str) -> str | None:
    """A Lark string literal's text (its escapes are JSON's), or None where it is none."""
    body = token[:-1] if token.endswith("i") else token
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _past_json(source: str, at: int) -> int:
    """The position past the JSON object that starts at `at` (its strings may hold braces)."""
    depth, i, n = 0, at, len(source)
    while i < n:
        ch = source[i]
        if ch == '"':
            i += 1
            while i < n and source[i] != '"':
                i += 2 if source[i] == "\\" else 1
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n
