"""Tool blocks driven by a family's special tokens (Kimi K2's section, DeepSeek's tool-call block).

Inside such a block the model writes special tokens (single tokens, never part of argument text)
and text between them. `MarkerBlock.feed` is the one loop: find the next marker (or the start of a
possible one, held back), hand the text before it to `_text`, then the marker to `_marker`. The
family's subclass is only its grammar.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from agentserve.conversation import OutputEvent
from agentserve.parsing.scanner import MarkerSet


class MarkerBlock(ABC):
    __slots__ = ()

    markers: ClassVar[MarkerSet]
    done: bool
    fallback: str

    def feed(self, buf: str, i: int, out: list[OutputEvent]) -> int:
        n = len(buf)
        markers = self.markers
        while i < n and not self.done:
            m = markers.search(buf, i)
            end = m.start() if m is not None else markers.hold_from(buf, i)
            while i < end and not self.done:
                i = self._text(buf, i, end, out)
            if self.done or m is None:
                return i  # done, or a partial marker the driver holds until more text arrives
            i = self._marker(m.group(), m.start(), m.end(), out)
        return i

    @abstractmethod
    def _text(self, buf: str, i: int, end: int, out: list[OutputEvent]) -> int:
        """Consume text of the current state from `buf[i:end]`; return where it stopped."""

    @abstractmethod
    def _marker(self, marker: str, start: int, end: int, out: list[OutputEvent]) -> int:
        """Act on `marker` found at `buf[start:end]`; return where to continue."""
