"""gpt-oss (OpenAI harmony format): messages on channels instead of think tags.

The prompt ends with `<|start|>assistant`, so the output begins with the rest of a message header::

    <|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

(without the line break). A message is `header<|message|>body` and ends at `<|end|>`, `<|return|>`
(final answer) or `<|call|>` (tool call). The body's meaning comes from the header:

- a recipient (`to=functions.NAME`, on any channel, before or after `<|channel|>`) makes a tool call:
  ToolCallStart once the header is complete, the body streamed as arguments, dispatched at its end;
- `analysis` is reasoning, one segment per message;
- anything else (`final`, a `commentary` preamble without recipient) is text.

`<|constrain|>json` and a plain `json` suffix only say how the body is encoded. Output that is not
harmony (no header where one is due) degrades to text, and so does a header that never completes;
this parser never raises on model output (vLLM#46464, PR #29972).
"""

from __future__ import annotations

import re

from agentserve.conversation import OutputEvent, TextDelta
from agentserve.families.base import Family
from agentserve.families.grammar import Markers, Shape, ToolGrammar, alternatives, json_rule, lit
from agentserve.parsing.delimited import WHITESPACE, DelimitedArgs
from agentserve.parsing.scanner import MarkerSet
from agentserve.parsing.stream import HeldTextParser, ParserOptions

START = "<|start|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
MESSAGE = "<|message|>"
END = "<|end|>"
RETURN = "<|return|>"
CALL = "<|call|>"
END_OF_TEXT = "<|endoftext|>"

_TOKENS = (START, CHANNEL, CONSTRAIN, MESSAGE, END, RETURN, CALL, END_OF_TEXT)
_MARKERS = MarkerSet(_TOKENS)
_HEADER_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in (START, CHANNEL, CONSTRAIN)) + ")")
_MESSAGE_ENDS = frozenset((END, RETURN, CALL))
_RECIPIENT = "to="
_NOT_TOOLS = frozenset(("assistant", "user", "system", "developer"))
# Headers are a few tokens long: a longer one is prose after a stray header token, not a header.
MAX_HEADER = 256
# Between two text messages (a commentary preamble, then the final answer) so they do not run together.
TEXT_SEPARATOR = "\n\n"

_BETWEEN, _HEADER, _BODY = range(3)  # where the parser is: between messages, in a header, in a body
_TEXT, _REASONING, _CALL = range(3)  # what the current message's body is


def parse_header(header: str) -> tuple[str, str]:
    """(channel, recipient) of a header such as `assistant to=functions.f<|channel|>commentary json`."""
    channel = recipient = ""
    field = START  # which part of the header the words belong to: role, channel or constraint
    for piece in _HEADER_SPLIT.split(header):
        if piece in (START, CHANNEL, CONSTRAIN):
            field = piece
            continue
        for word in piece.split():
            if word.startswith(_RECIPIENT):
                recipient = recipient or word[len(_RECIPIENT) :]
            elif field == CHANNEL and not channel:
                channel = word
            # The role, `<|constrain|>json` and a plain `json` suffix do not change how the body parses.
    return channel, recipient


def _token_at(buf: str, i: int) -> str | None:
    for token in _TOKENS:
        if buf.startswith(token, i):
            return token
    return None


class HarmonyParser(HeldTextParser):
    """The sans-IO output parser of the harmony format (`OutputParser`)."""

    __slots__ = (
        "_args",
        "_header",
        "_header_len",
        "_kind",
        "_state",
        "_text_gap",
    )

    def __init__(self, options: ParserOptions | None = None) -> None:
        options = options or ParserOptions()
        super().__init__(options)
        self._args = DelimitedArgs(self._calls)
        self._header: list[str] = []  # the raw header so far, tokens included
        self._header_len = 0  # its length without the tokens
        # With `starts_in_reasoning` the prompt already opened an analysis message.
        self._state = _BODY if options.starts_in_reasoning else _BETWEEN
        self._kind = _REASONING if options.starts_in_reasoning else _TEXT
        self._text_gap = False  # a text message ended and nothing but text followed yet

    def close(self) -> list[OutputEvent]:
        """End of output: a header that never completed is text, a call cut off is reported."""
        if self._closed:
            return []
        self._closed = True
        out: list[OutputEvent] = []
        held, self._held = self._held, ""
        if self._state == _HEADER:
            self._header.append(held)
            self._degrade_header(out)
        elif self._state == _BODY:
            self._body_text(held, out)
        else:
            self._write_text(held, out)  # a partial token or `to=` that never completed
        self._end_message(out, truncated=True)
        return out

    # -- internals ---------------------------------------------------------------------------------

    def _run(self, buf: str, out: list[OutputEvent]) -> None:
        i = 0
        n = len(buf)
        markers = _MARKERS
        while i < n:
            state = self._state
            if state == _BODY:
                m = markers.search(buf, i)
                if m is None:
                    hold = markers.hold_from(buf, i)
                    self._body_text(buf[i:hold], out)
                    self._held = buf[hold:]
                    return
                self._body_text(buf[i : m.start()], out)
                i = m.end()
                self._body_marker(m.group(), out)
            elif state == _HEADER:
                m = markers.search(buf, i)
                end = m.start() if m is not None else markers.hold_from(buf, i)
                if end > i:
                    room = MAX_HEADER - self._header_len
                    if end - i > room:  # too long for a header: it was text (cut at a fixed length)
                        self._header.append(buf[i : i + room])
                        i += room
                        self._degrade_header(out)
                        continue
                    self._header.append(buf[i:end])
                    self._header_len += end - i
                    i = end
                if m is None:
                    self._held = buf[i:]
                    return
                i = m.end()
                self._header_marker(m.group(), out)
            else:
                i = self._between(buf, i, out)
                if i < 0:
                    return

    def _between(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        """Between messages a header is due; returns where to go on, or -1 when `buf` is used up."""
        n = len(buf)
        while i < n and buf[i] in WHITESPACE:  # formatting between messages
            i += 1
        if i == n:
            return -1
        c = buf[i]
        if c == "<":
            token = _token_at(buf, i)
            if token is not None:
                if token not in _MESSAGE_ENDS and token != END_OF_TEXT:
                    self._begin_header()
                    self._header_marker(token, out)
                # else: a stray end token between messages carries nothing
                return i + len(token)
            if _MARKERS.hold_from(buf, i) == i:  # a token split across chunks
                self._held = buf[i:]
                return -1
        elif c == "t":
            head = buf[i : i + len(_RECIPIENT)]
            if head == _RECIPIENT:  # the header starts with the recipient (`to=functions.f<|channel|>…`)
                self._begin_header()
                return i
            if i + len(head) == n and _RECIPIENT.startswith(head):
                self._held = buf[i:]
                return -1
        # Not a header where one is due (not harmony, or a model that lost the format): plain text.
        self._state = _BODY
        self._kind = _TEXT
        return i

    def _begin_header(self) -> None:
        self._state = _HEADER
        self._header = []
        self._header_len = 0

    def _header_marker(self, token: str, out: list[OutputEvent]) -> None:
        if token == MESSAGE:
            self._open_message(out)
        elif token in (CHANNEL, CONSTRAIN) or (token == START and not self._header):
            self._header.append(token)
        elif token != END_OF_TEXT:
            # A new message or an end before `<|message|>`: this header never completed, it was text.
            self._degrade_header(out)
            self._body_marker(token, out)

    def _open_message(self, out: list[OutputEvent]) -> None:
        channel, recipient = parse_header("".join(self._header))
        self._header = []
        name = "" if recipient in _NOT_TOOLS else recipient.removeprefix("functions.")
        self._state = _BODY
        if name:
            self._kind = _CALL
            self._text_gap = False
            self._calls.start(name, out)
            self._args.reset()
        elif channel == "analysis":
            self._kind = _REASONING
        else:
            self._kind = _TEXT

    def _degrade_header(self, out: list[OutputEvent]) -> None:
        raw = "".join(self._header)
        self._header = []
        self._state = _BODY
        self._kind = _TEXT
        self._write_text(raw, out)

    def _body_text(self, text: str, out: list[OutputEvent]) -> None:
        if not text:
            return
        kind = self._kind
        if kind == _TEXT:
            self._write_text(text, out)
        elif kind == _REASONING:
            self._thought.write(text, out)
        else:
            self._args.write(text, out)

    def _body_marker(self, token: str, out: list[OutputEvent]) -> None:
        if token in _MESSAGE_ENDS:
            self._end_message(out)
            self._state = _BETWEEN
        elif token in (START, CHANNEL):  # a new header: the model skipped this message's end token
            self._end_message(out)
            self._begin_header()
            self._header_marker(token, out)
        elif token != END_OF_TEXT:
            self._body_text(token, out)  # a stray `<|message|>` / `<|constrain|>` is literal

    def _end_message(self, out: list[OutputEvent], truncated: bool = False) -> None:
        kind = self._kind
        if kind == _CALL:
            if truncated:
                self._calls.finish(out)  # complete arguments without <|call|> are a call
            else:
                self._calls.end(out)
        elif kind == _REASONING:
            if self._thought.started:
                self._text_gap = False
            self._thought.end(out)
        else:
            if self._text.started:
                self._text_gap = True
            self._text.end(out)
        self._kind = _TEXT

    def _write_text(self, text: str, out: list[OutputEvent]) -> None:
        writer = self._text
        if writer.started or not self._text_gap:
            writer.write(text, out)
            return
        writer.write(text, out)
        if writer.started:  # the first text of a message right after another text message
            out.insert(len(out) - 1, TextDelta(TEXT_SEPARATOR))
            self._text_gap = False


def make_parser(options: ParserOptions) -> HarmonyParser:
    return HarmonyParser(options)


def grammar_layout(shape: Shape, m: Markers) -> str:
    """The whole output in harmony: analysis messages (the reasoning, at most `budget` tokens in
    all when budgeted), then a `final` message (text, or the JSON answer) or a commentary preamble
    and a call `to=functions.NAME` (one per turn: `<|call|>` ends it). The end tokens `<|return|>`
    and `<|call|>` are the engine's stop tokens, allowed wherever the grammar may end."""
    channel, message, start = m.tok(CHANNEL), m.tok(MESSAGE), m.tok(START)
    next_message = f'{m.tok(END)} {start} "assistant"'
    limit = f"[max_tokens={shape.budget}]" if shape.budget is not None else ""
    rules = [f"thought{limit}: THOUGHT", "THOUGHT: /(.|\\n)*/", "FREE: /(.|\\n)*/", "WS: /[ \\t\\r\\n]+/"]
    analysis = f'{channel} "analysis" {message} thought {next_message}'
    if shape.starts_in_reasoning:
        rules.insert(0, f"start: thought {next_message} body")
    else:
        repeat = "?" if shape.budget is not None else "*"  # a budget counts one analysis message
        rules.insert(0, f"start: ({analysis}){repeat} body")
    body: list[str] = []
    if shape.json_schema is not None:
        body.append(f'{channel} "final" {message} {json_rule(shape.json_schema)}')
    elif shape.text:
        body.append(f'{channel} "final" {message} FREE')
    if shape.count is not None and shape.tools:
        calls = alternatives(
            [
                f'{lit("commentary to=functions." + t.name)} WS? ({m.tok(CONSTRAIN)} "json")? {message} '
                + json_rule(t.schema)
                for t in shape.tools
            ]
        )
        rules.append(f"call: {channel} call_body")
        rules.append(f"call_body: {calls}")
        if shape.count.least == 0 and shape.text:
            rules.append(f'preamble: {channel} "commentary" {message} FREE {next_message}')
            body.append("preamble? call")
        else:
            body.append("call")
    rules.insert(1, "body: " + " | ".join(body))
    return "\n".join(rules) + "\n"


GRAMMAR = ToolGrammar(
    layout=grammar_layout,
    extra_markers=(START, CHANNEL, CONSTRAIN, MESSAGE, END),
    tool_names=r"[^\s<]+",  # `to=functions.NAME` is one word of the header, before any `<|…|>`
)


FAMILY = Family(
    name="gpt-oss",
    description="gpt-oss (OpenAI harmony): analysis/commentary/final channels, to=functions.NAME calls",
    make_parser=make_parser,
    aliases=("harmony", "gpt_oss", "openai", "gptoss"),
    model_patterns=(r"gpt-oss",),
    stop_tokens=(CALL, RETURN),
    special_tokens=("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", RETURN, CALL),
    output_style="harmony",
    grammar=GRAMMAR,
)
