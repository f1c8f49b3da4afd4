"""Finding literal markers in a stream without re-scanning what was already seen.

A `MarkerSet` answers two questions about a buffer: where is the next complete marker, and from which
index on could the buffer's tail still become a marker (so it must be held back until more text
arrives). Both look only at the new part of the buffer, which keeps every parser linear in its input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache


class MarkerSet:
    __slots__ = ("_first", "_hold_window", "_prefixes", "_regex", "markers")

    def __init__(self, markers: Iterable[str]) -> None:
        unique = sorted({m for m in markers if m}, key=lambda m: (-len(m), m))
        if not unique:
            raise ValueError("a MarkerSet needs at least one marker")
        self.markers: tuple[str, ...] = tuple(unique)
        # Longest first so that a marker that is a prefix of another never wins over it.
        self._regex = re.compile("|".join(re.escape(m) for m in unique))
        self._prefixes = frozenset(m[:k] for m in unique for k in range(1, len(m)))
        self._first = re.compile("[" + "".join(sorted({re.escape(m[0]) for m in unique})) + "]")
        self._hold_window = max(len(m) for m in unique) - 1

    def search(self, buf: str, start: int = 0) -> re.Match[str] | None:
        """The first complete marker in `buf[start:]`."""
        return self._regex.search(buf, start)

    def quiet(self, buf: str, start: int = 0) -> bool:
        """No marker can even begin in `buf[start:]`: none is complete and nothing must be held
        (one regex search; most chunks of model output are like this)."""
        return self._first.search(buf, start) is None

    def hold_from(self, buf: str, start: int = 0) -> int:
        """The smallest index >= start whose suffix is a proper prefix of some marker, else len(buf)."""
        n = len(buf)
        i = max(start, n - self._hold_window)
        first = self._first
        prefixes = self._prefixes
        while True:
            m = first.search(buf, i)
            if m is None:
                return n
            j = m.start()
            if buf[j:] in prefixes:
                return j
            i = j + 1

    def __contains__(self, marker: object) -> bool:
        return marker in self.markers


@lru_cache(maxsize=256)
def _shared(markers: frozenset[str]) -> MarkerSet:
    return MarkerSet(markers)


def marker_set(markers: Iterable[str]) -> MarkerSet:
    """A `MarkerSet` shared by every caller with the same markers (it is immutable): parsers are
    built per request, and compiling their regexes and prefix sets was ~3 % of a frontend's CPU
    per request under a burst (bench/peers.py)."""
    return _shared(frozenset(markers))
