"""Incremental JSON for tool calls: the extent of a value, and `{"name": …, "arguments": …}` objects.

`JsonValueScanner` follows strings, escapes and nesting across chunks, so a `</tool_call>` inside an
argument string can never end a call early, and it jumps over string runs with a regex instead of
looking at every character. It does not validate: the arguments are validated once, at dispatch.

`JsonCallObject` streams one call object: the call starts the moment its name is complete and the
arguments object is forwarded fragment by fragment as it arrives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from agentserve.conversation import OutputEvent
from agentserve.parsing.toolcalls import ToolCalls

_STRING_RUN = re.compile(r'[^"\\]+')
_CONTAINER_RUN = re.compile(r'[^"{}\[\]]+')
_SCALAR_END = re.compile(r"[,\]}\s]")
_WS = " \t\r\n"


class JsonValueScanner:
    """Finds where one JSON value ends. `scan` returns the index after what it consumed."""

    __slots__ = ("depth", "done", "escape", "in_string", "kind")

    def __init__(self) -> None:
        self.kind = ""  # "" until the first character, then "container" | "string" | "scalar"
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.done = False

    def scan(self, buf: str, i: int) -> int:
        n = len(buf)
        while i < n:
            if not self.kind:
                c = buf[i]
                if c in _WS:
                    i += 1
                    continue
                if c in "{[":
                    self.kind, self.depth = "container", 1
                elif c == '"':
                    self.kind, self.in_string = "string", True
                else:
                    self.kind = "scalar"
                i += 1
                continue
            if self.in_string:
                if self.escape:
                    self.escape = False
                    i += 1
                    continue
                m = _STRING_RUN.match(buf, i)
                if m is not None:
                    i = m.end()
                    continue
                c = buf[i]
                i += 1
                if c == "\\":
                    self.escape = True
                else:  # closing quote
                    self.in_string = False
                    if self.kind == "string":
                        self.done = True
                        return i
                continue
            if self.kind == "scalar":
                m = _SCALAR_END.search(buf, i)
                if m is None:
                    return n
                self.done = True
                return m.start()
            m = _CONTAINER_RUN.match(buf, i)
            if m is not None:
                i = m.end()
                continue
            c = buf[i]
            i += 1
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i
        return n

    def finish_at_eof(self) -> bool:
        """At end of input a scalar is complete; anything else open is truncated."""
        if self.kind == "scalar" and not self.done:
            self.done = True
        return self.done


# States of JsonCallObject
_OPEN, _KEY_OR_CLOSE, _KEY, _COLON, _VALUE, _AFTER_VALUE, _DONE, _FAILED = range(8)


class JsonCallObject:
    """One tool call written as a JSON object with a name key and an arguments key.

    `committed` turns true when the call has started (its name is known); before that, a failure
    leaves `raw` so the caller can degrade the text to plain content.
    """

    __slots__ = (
        "_args_keys",
        "_args_text",
        "_calls",
        "_key",
        "_key_escape",
        "_name_first",
        "_name_keys",
        "_pending_args",
        "_raw",
        "_role",
        "_value",
        "_value_parts",
        "committed",
        "state",
    )

    def __init__(
        self,
        calls: ToolCalls,
        name_keys: Sequence[str] = ("name",),
        args_keys: Sequence[str] = ("arguments", "parameters"),
        *,
        name_first: bool = False,
    ) -> None:
        self._calls = calls
        self._name_keys = tuple(name_keys)
        self._args_keys = tuple(args_keys)
        # Only an object whose first key is the name is a call: bare JSON content that is not a call
        # (Llama 3 JSON) is then given back at its first key instead of being held to its end.
        self._name_first = name_first
        self.state = _OPEN
        self.committed = False
        self._raw: list[str] = []  # text consumed before the call started (for degrading to content)
        self._key: list[str] = []
        self._key_escape = False
        self._role = ""  # what the current value is: "name" | "args" | "skip"
        self._value = JsonValueScanner()
        self._value_parts: list[str] = []
        self._pending_args: str | None = None  # arguments that arrived before the name
        self._args_text: str | None = None

    @property
    def done(self) -> bool:
        return self.state == _DONE

    @property
    def failed(self) -> bool:
        return self.state == _FAILED

    @property
    def raw(self) -> str:
        return "".join(self._raw)

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        start = i
        i = self._run(buf, i, out)
        if not self.committed and i > start:
            self._raw.append(buf[start:i])
        return i

    def _run(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        while i < n:
            state = self.state
            if state == _VALUE:
                i = self._feed_value(buf, i, out)
                continue
            if state in (_DONE, _FAILED):
                return i
            c = buf[i]
            if state == _KEY:
                j = i
                while j < n:
                    ch = buf[j]
                    if self._key_escape:
                        self._key_escape = False
                    elif ch == "\\":
                        self._key_escape = True
                    elif ch == '"':
                        break
                    j += 1
                self._key.append(buf[i:j])
                if j == n:
                    return n
                self.state = _COLON
                i = j + 1
                continue
            if c in _WS:
                i += 1
                continue
            if state == _OPEN:
                if c != "{":
                    return self._fail(i, out)
                self.state = _KEY_OR_CLOSE
            elif state == _KEY_OR_CLOSE:
                if c == '"':
                    self._key = []
                    self.state = _KEY
                elif c == "}":
                    return self._close(i + 1, out)
                else:
                    return self._fail(i, out)
            elif state == _COLON:
                if c != ":":
                    return self._fail(i, out)
                self._begin_value()
            elif state == _AFTER_VALUE:
                if c == ",":
                    self.state = _KEY_OR_CLOSE
                elif c == "}":
                    return self._close(i + 1, out)
                else:
                    return self._fail(i, out)
            i += 1
        return n

    def _begin_value(self) -> None:
        try:
            key = json.loads('"' + "".join(self._key) + '"')
        except json.JSONDecodeError:
            key = ""
        if key in self._name_keys and not self.committed:
            self._role = "name"
        elif self._name_first and not self.committed:
            self.state = _FAILED
            return
        elif key in self._args_keys and self._args_text is None and self._pending_args is None:
            self._role = "args"
        else:
            self._role = "skip"
        self._value = JsonValueScanner()
        self._value_parts = []
        self.state = _VALUE

    def _feed_value(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        value = self._value
        j = value.scan(buf, i)
        piece = buf[i:j]
        role = self._role
        streaming = role == "args" and self.committed and value.kind == "container"
        if streaming:
            if not self._value_parts and piece:
                piece = piece.lstrip()  # the fragments must be exactly the arguments text
            self._calls.args(piece, out)
            self._value_parts.append("")  # marks "something streamed"
        elif role != "skip":
            self._value_parts.append(piece)
        if value.done:
            self.state = _AFTER_VALUE
            if role == "name":
                self._on_name("".join(self._value_parts), out)
            elif role == "args":
                if streaming:
                    self._args_text = ""
                else:
                    self._on_args("".join(self._value_parts).strip(), out)
        return j

    def _on_name(self, text: str, out: list[OutputEvent]) -> None:
        try:
            name = json.loads(text)
        except json.JSONDecodeError:
            name = None
        if not isinstance(name, str) or not name:
            self.state = _FAILED
            return
        self._calls.start(name, out)
        self.committed = True
        self._raw.clear()  # a started call is reported through ToolCalls, never given back as text
        if self._pending_args is not None:
            self._calls.args(self._pending_args, out)
            self._args_text = self._pending_args

    def _on_args(self, text: str, out: list[OutputEvent]) -> None:
        # Some models send the arguments as a JSON-encoded string; dispatch its content.
        if text.startswith('"'):
            try:
                decoded = json.loads(text)
            except json.JSONDecodeError:
                decoded = text
            text = decoded if isinstance(decoded, str) else text
        if self.committed:
            self._calls.args(text, out)
            self._args_text = text
        else:
            self._pending_args = text

    def _close(self, i: int, out: list[OutputEvent]) -> int:
        if not self.committed:
            return self._fail(i, out)
        self._calls.end(out)
        self.state = _DONE
        return i

    def _fail(self, i: int, out: list[OutputEvent]) -> int:
        if self.committed:
            self._calls.fail("malformed", out, "tool call JSON is malformed")
        self.state = _FAILED
        return i

    def eof(self, out: list[OutputEvent]) -> None:
        """The stream ended inside the object."""
        if self.state in (_DONE, _FAILED):
            return
        if self.committed:
            # Complete arguments are a call even if the object (or its block) never closed.
            self._calls.finish(out)
        self.state = _FAILED
