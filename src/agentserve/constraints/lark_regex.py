"""A Lark grammar (llguidance's Lark-like syntax) flattened into one regular expression (pure).

A Responses custom tool's `format: {type: grammar, syntax: lark, definition}` constrains the tool's
input. Every family writes that input as a string argument inside its call syntax (a JSON string
for most), and a string is constrained by a pattern, which llguidance quotes and escapes itself. So a
grammar whose rules do not recurse — OpenAI's and Codex's custom-tool grammars (apply_patch, SQL
subsets, …) are of that kind — becomes the regex its start rule denotes: references inlined,
literals escaped, regex terminals kept (they are Rust `regex` syntax, as the pattern is).

What cannot be flattened is refused with a `LarkRegexError` (the API's 400): recursive rules,
`%ignore` (whitespace allowed anywhere), special tokens, inline `%json`/`%regex`/`%lark`, unknown
`%import`s, or a result beyond `MAX_REGEX_CHARS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_REGEX_CHARS = 200_000


class LarkRegexError(ValueError):
    """Why a grammar cannot be flattened into a regex."""


_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t]+)
  | (?P<comment>(?://|\#)[^\n]*)
  | (?P<nl>\r?\n)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[a-z]*)
  | (?P<directive>%[a-z_]+[^\n]*)
  | (?P<arrow>->[ \t]*[?!]?[_a-zA-Z][_a-zA-Z0-9\-]*)
  | (?P<dots>\.\.)
  | (?P<name>[_a-zA-Z][_a-zA-Z0-9\-]*(?:\.-?\d+)?)
  | (?P<number>\d+)
  | (?P<special><[^<>\s]+>)
  | (?P<op>[:|()\[\]?*+~{},!])
    """,
    re.VERBOSE,
)

# llguidance's built-in `%import common.*` terminals the grammars use, as Rust regexes.
COMMON: Mapping[str, str] = {
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(?:\r?\n)+",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "DECIMAL": r"(?:[0-9]+\.[0-9]*|\.[0-9]+)",
    "NUMBER": r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    "SIGNED_NUMBER": r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[a-zA-Z]",
    "WORD": r"[a-zA-Z]+",
    "CNAME": r"[_a-zA-Z][_a-zA-Z0-9]*",
    "ESCAPED_STRING": r'"(?:[^"\\]|\\.)*"',
}


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    line_start: bool  # the first token of its line (no indentation before it)


def _tokens(source: str) -> list[_Tok]:
    out: list[_Tok] = []
    at, line_start = 0, True
    while at < len(source):
        m = _TOKEN.match(source, at)
        if m is None:
            raise LarkRegexError(f"cannot read the grammar at {source[at : at + 20]!r}")
        kind = m.lastgroup or ""
        at = m.end()
        if kind == "nl":
            line_start = True
            continue
        if kind in ("ws", "comment"):
            line_start = line_start and kind == "comment"
            continue
        if line_start and m.group() in ("?", "!"):
            kind = "modifier"  # `?rule:` inlines a rule's node, `!rule:` keeps its tokens: same text
        out.append(_Tok(kind, m.group(), line_start))
        line_start = False
    return out


def _literal(text: str) -> str:
    """A Rust regex matching exactly `text`."""
    out = []
    for ch in text:
        if ch in "\\.+*?()|[]{}^$#&-~":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append(r"\n")
        elif ch == "\r":
            out.append(r"\r")
        elif ch == "\t":
            out.append(r"\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return "".join(out)


def _string(token: str) -> str:
    insensitive = token.endswith("i")
    body = token[1:-2] if insensitive else token[1:-1]
    body = re.sub(r"\\x([0-9a-fA-F]{2})", r"\\u00\1", body)
    try:
        text = json.loads(f'"{body}"')
    except ValueError as exc:
        raise LarkRegexError(f"bad string literal {token}: {exc}") from None
    regex = _literal(text)
    return f"(?i:{regex})" if insensitive else f"(?:{regex})"


def _regex(token: str) -> str:
    end = token.rindex("/")
    body, flags = token[1:end].replace("\\/", "/"), token[end + 1 :]
    if set(flags) - set("imsux"):
        raise LarkRegexError(f"regex flags {flags!r} are not supported")
    return f"(?{flags}:{body})" if flags else f"(?:{body})"


class _Parser:
    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> _Tok | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> _Tok:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def alternatives(self) -> list[list[object]]:
        alts = [self.sequence()]
        while (tok := self.peek()) is not None and tok.text == "|":
            self.take()
            alts.append(self.sequence())
        return alts

    def sequence(self) -> list[object]:
        items: list[object] = []
        while (tok := self.peek()) is not None and tok.text not in ("|", ")", "]"):
            if tok.line_start and tok.kind in ("name", "directive", "modifier"):
                break  # the next definition
            if tok.kind == "arrow":
                self.take()  # an alias names the tree node: nothing to match
                continue
            items.append(self.item())
        return items

    def item(self) -> object:
        atom = self.atom()
        tok = self.peek()
        if tok is None:
            return atom
        if tok.text in ("?", "*", "+"):
            self.take()
            return ("repeat", atom, tok.text)
        if tok.text == "~":
            self.take()
            low = self.take()
            if low.kind != "number":
                raise LarkRegexError("`~` takes a count")
            if (nxt := self.peek()) is not None and nxt.kind == "dots":
                self.take()
                return ("repeat", atom, f"{{{low.text},{self.take().text}}}")
            return ("repeat", atom, f"{{{low.text}}}")
        if tok.text == "{":
            self.take()
            parts = []
            while (nxt := self.take()).text != "}":
                parts.append(nxt.text)
            return ("repeat", atom, "{" + "".join(parts) + "}")
        return atom

    def atom(self) -> object:
        tok = self.take()
        if tok.kind == "string":
            if (nxt := self.peek()) is not None and nxt.kind == "dots":
                self.take()
                high = self.take()
                low_c, high_c = json.loads(tok.text), json.loads(high.text)
                return ("regex", f"[{_literal(low_c)}-{_literal(high_c)}]")
            return ("regex", _string(tok.text))
        if tok.kind == "regex":
            return ("regex", _regex(tok.text))
        if tok.kind == "name":
            return ("ref", tok.text.split(".")[0])
        if tok.text == "(":
            alts = self.alternatives()
            self._expect(")")
            return ("alts", alts)
        if tok.text == "[":
            alts = self.alternatives()
            self._expect("]")
            return ("repeat", ("alts", alts), "?")
        if tok.kind == "special":
            raise LarkRegexError(f"special token {tok.text} cannot be part of a tool's input")
        if tok.kind == "directive":
            raise LarkRegexError(f"{tok.text.split()[0]} cannot be inlined in a tool's input")
        raise LarkRegexError(f"unexpected {tok.text!r}")

    def _expect(self, text: str) -> None:
        if self.peek() is None or self.take().text != text:
            raise LarkRegexError(f"expected {text!r}")


def _definitions(tokens: list[_Tok]) -> dict[str, list[list[object]]]:
    parser = _Parser(tokens)
    defs: dict[str, list[list[object]]] = {}
    while (tok := parser.peek()) is not None:
        if tok.kind == "directive":
            parser.take()
            _directive(tok.text, defs)
            continue
        if tok.kind == "modifier":
            parser.take()
        name = parser.take()
        if name.kind != "name" or parser.peek() is None or parser.take().text != ":":
            raise LarkRegexError(f"expected a definition `name: …`, got {name.text!r}")
        defs[name.text.split(".")[0]] = parser.alternatives()
    return defs


def _directive(text: str, defs: dict[str, list[list[object]]]) -> None:
    words = text.split()
    if words[0] != "%import" or len(words) < 2:
        raise LarkRegexError(f"{words[0]} cannot be enforced on a tool's input (only %import common)")
    rest = " ".join(words[1:])
    m = re.fullmatch(r"common\.([A-Z_]+)(?:\s*->\s*([_a-zA-Z][_a-zA-Z0-9]*))?", rest)
    names: list[tuple[str, str]]
    if m is not None:
        names = [(m.group(1), m.group(2) or m.group(1))]
    else:
        group = re.fullmatch(r"common\s*\(([^)]*)\)", rest)
        if group is None:
            raise LarkRegexError(f"unsupported import {rest!r} (only llguidance's `common` terminals)")
        names = [(n.strip(), n.strip()) for n in group.group(1).split(",") if n.strip()]
    for source, alias in names:
        if source not in COMMON:
            raise LarkRegexError(f"unknown common terminal {source!r}")
        defs[alias] = [[("regex", f"(?:{COMMON[source]})")]]


def lark_to_regex(source: str) -> str:
    """The regex the grammar's `start` rule denotes. Raises LarkRegexError."""
    defs = _definitions(_tokens(source))
    if "start" not in defs:
        raise LarkRegexError("the grammar has no `start` rule")
    done: dict[str, str] = {}
    visiting: set[str] = set()

    def emit(node: object) -> str:
        kind = node[0]  # type: ignore[index]
        if kind == "regex":
            return node[1]  # type: ignore[index,no-any-return]
        if kind == "ref":
            return rule(node[1])  # type: ignore[index]
        if kind == "alts":
            return alternatives(node[1])  # type: ignore[index]
        inner, op = node[1], node[2]  # type: ignore[index]
        return f"(?:{emit(inner)}){op}"

    def alternatives(alts: list[list[object]]) -> str:
        parts = ["".join(emit(item) for item in seq) for seq in alts]
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

    def rule(name: str) -> str:
        hit = done.get(name)
        if hit is not None:
            return hit
        if name in visiting:
            raise LarkRegexError(f"rule {name!r} is recursive: only non-recursive grammars can be enforced")
        if name not in defs:
            raise LarkRegexError(f"rule {name!r} is not defined")
        visiting.add(name)
        regex = "(?:" + alternatives(defs[name]) + ")"
        visiting.discard(name)
        if len(regex) > MAX_REGEX_CHARS:
            raise LarkRegexError(f"the grammar flattens to more than {MAX_REGEX_CHARS} characters of regex")
        done[name] = regex
        return regex

    return rule("start")
