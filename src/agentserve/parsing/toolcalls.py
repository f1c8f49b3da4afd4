"""Bookkeeping for the tool calls of one model turn: indices, ids, streamed arguments, dispatch.

Every family's tool syntax reports through one `ToolCalls` so the rules hold everywhere: a call starts
once its name is known, its argument fragments concatenate to the final arguments, and it is
dispatched (ToolCallEnd) only when closed with a valid JSON object. Anything else becomes a
ToolCallError carrying the raw text, never a dispatch.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Literal

from agentserve.conversation import (
    OutputEvent,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)

IdFactory = Callable[[int], str]


def random_call_id(index: int) -> str:
    """Default call id: `call_` + 24 hex digits (API codecs re-prefix it, e.g. `toolu_`)."""
    return "call_" + secrets.token_hex(12)


def sequential_call_id(index: int) -> str:
    """Deterministic ids for tests and the `parse` CLI."""
    return f"call_{index}"


class ToolCalls:
    __slots__ = ("_args", "_id_factory", "_raw", "count", "open")

    def __init__(self, id_factory: IdFactory = random_call_id) -> None:
        self._id_factory = id_factory
        self.count = 0  # calls started so far; the next call's index
        self.open = False
        self._args: list[str] = []
        self._raw: list[str] = []

    @property
    def index(self) -> int:
        return self.count - 1

    def start(self, name: str, out: list[OutputEvent], call_id: str | None = None) -> int:
        if self.open:
            raise RuntimeError("a tool call is already open")
        index = self.count
        self.count += 1
        self.open = True
        self._args = []
        self._raw = []
        out.append(ToolCallStart(index, call_id or self._id_factory(index), name))
        return index

    def args(self, fragment: str, out: list[OutputEvent]) -> None:
        if fragment:
            self._args.append(fragment)
            out.append(ToolCallArgsDelta(self.index, fragment))

    def raw(self, text: str) -> None:
        """Record model text of the open call that is not argument text (for error reports)."""
        self._raw.append(text)

    @property
    def streamed(self) -> str:
        return "".join(self._args)

    def end(self, out: list[OutputEvent]) -> bool:
        """Close the open call: dispatch it if the arguments are a JSON object (True), else report it."""
        self.open = False
        args = "".join(self._args)
        if not args.strip():
            # Zero-argument call: the fragments must still concatenate to the dispatched arguments.
            out.append(ToolCallArgsDelta(self.index, "{}"))
            out.append(ToolCallEnd(self.index, "{}"))
            return True
        try:
            value = json.loads(args)
        except (json.JSONDecodeError, RecursionError) as exc:
            out.append(ToolCallError(self.index, "malformed", self._raw_text(args), f"invalid JSON: {exc}"))
            return False
        if not isinstance(value, dict):
            out.append(
                ToolCallError(self.index, "malformed", self._raw_text(args), "arguments are not an object")
            )
            return False
        out.append(ToolCallEnd(self.index, args))
        return True

    def finish(self, out: list[OutputEvent]) -> bool:
        """The output ended with this call open: a call, if its arguments are already complete.

        Engines that stop on a family's call terminator strip it from the output by default, so a
        missing terminator is normal: arguments that are a complete JSON object dispatch (True);
        anything else (none yet, cut off, invalid) is reported `truncated`, never dispatched.
        """
        args = "".join(self._args)
        if args.strip() and _is_object(args):
            return self.end(out)
        self.fail("truncated", out, "output ended inside the tool call")
        return False

    def fail(
        self,
        reason: Literal["truncated", "malformed"],
        out: list[OutputEvent],
        message: str = "",
        raw: str | None = None,
    ) -> None:
        """Abandon the open call (truncated or malformed); it is reported, never dispatched."""
        self.open = False
        if raw is None:
            raw = self._raw_text("".join(self._args))
        out.append(ToolCallError(self.index, reason, raw, message))

    def _raw_text(self, args: str) -> str:
        # Syntaxes whose arguments are converted (XML) record the model's own text; JSON ones are the args.
        return "".join(self._raw) if self._raw else args


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (json.JSONDecodeError, RecursionError):
        return False
