"""Stop sequences, matched by the frontend on the model's raw output text.

The frontend (not the engine) matches stop strings so it knows *which* one ended the turn
(Anthropic reports it as `stop_sequence`) and so every engine behaves the same. Text is released
as soon as it cannot be the start of a stop string; only a tail that is a proper prefix of one is
held back. Sans-IO: `feed(text) -> (text to emit, matched stop or None)`, `flush() -> held text`.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    __slots__ = ("_held", "_longest", "_stops", "matched")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in dict.fromkeys(stops) if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.matched: str | None = None

    def __bool__(self) -> bool:
        return bool(self._stops)

    def feed(self, text: str) -> tuple[str, str | None]:
        """Text that is safe to emit now, and the stop string if one completed (then stop feeding)."""
        if self.matched is not None:
            return "", self.matched
        buf = self._held + text
        # The stop that completes first wins (what a token-by-token engine would see first, so the
        # answer does not depend on chunking); among those ending together, the longest.
        best: tuple[int, str] | None = None
        for stop in self._stops:
            at = buf.find(stop)
            if at >= 0 and (best is None or (at + len(stop), at) < (best[0] + len(best[1]), best[0])):
                best = (at, stop)
        if best is not None:
            self._held = ""
            self.matched = best[1]
            return buf[: best[0]], self.matched
        keep = self._tail(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def _tail(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of some stop string."""
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(stop.startswith(tail) for stop in self._stops):
                return n
        return 0

    def flush(self) -> str:
        """At the end of the output: what was held back was not a stop string after all."""
        held, self._held = self._held, ""
        return held
