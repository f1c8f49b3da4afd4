"""Streaming tool dispatch switched off (`enable_streaming_tool_dispatch: false`): a stream encoder's
output from its first finished call on waits for the end of the turn, so a client that acts on a call
the moment it is complete sees every call of the turn at once. One gate, used by the Anthropic and
Responses encoders (Chat keeps its calls' deltas live and only drops its `tool_call_dispatch` events),
only when dispatch is off: with it on (the default) an encoder holds no gate and pays nothing per event."""

from __future__ import annotations


class DispatchGate:
    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[bytes] = []

    def admit(self, out: bytes, dispatched: int, done: bool) -> bytes:
        """What of `out` goes on the wire now (with what was held before it); the rest is held."""
        if not dispatched or done:
            if self._held:
                out = b"".join(self._held) + out
                self._held.clear()
            return out
        self._held.append(out)
        return b""

    def release(self) -> bytes:
        """Everything held: the turn ended (or failed)."""
        held = b"".join(self._held)
        self._held.clear()
        return held
