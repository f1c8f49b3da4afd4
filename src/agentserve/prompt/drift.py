"""Prefix drift detection: where did this prompt stop extending the previous turn?

Per session, remember the last prompt's tokens plus the tokens the model generated for it. The next
prompt of that session should start with exactly those tokens; if it does not, the KV cache from the
first differing token on is lost. The report says where (token index), how many tokens were reusable,
and shows ~80 characters on each side, which is how a new cache-poisoning span (a date, an id, a
re-serialised tool call) is found without waiting for someone to write a blog post about it.

`compare` is pure; the frontend's session memory (`prompt.session_memory`) keeps each session's last
prompt + output for it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Decode = Callable[[Sequence[int]], str]

CONTEXT_CHARS = 80
_CONTEXT_TOKENS = 96  # decoded around the divergence; tokens are at least one character here


@dataclass(frozen=True, slots=True)
class DriftReport:
    index: int  # first token where the prompt differs from previous prompt + output
    previous_tokens: int  # length of previous prompt + output
    prompt_tokens: int
    before: str  # common text just before the divergence
    previous_after: str  # what the previous turn had from there
    prompt_after: str  # what this prompt has from there

    @property
    def reusable_tokens(self) -> int:
        return self.index

    @property
    def drifted(self) -> bool:
        """True when the prompt rewrote part of the previous turn (not a pure extension or a retry)."""
        return self.index < self.previous_tokens and self.index < self.prompt_tokens

    def to_json(self) -> dict[str, object]:
        return {
            "drifted": self.drifted,
            "index": self.index,
            "reusable_tokens": self.reusable_tokens,
            "previous_tokens": self.previous_tokens,
            "prompt_tokens": self.prompt_tokens,
            "before": self.before,
            "previous_after": self.previous_after,
            "prompt_after": self.prompt_after,
        }


def _ids(tokens: Sequence[int]) -> array[int]:
    return tokens if isinstance(tokens, array) else array("I", tokens)


def common_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    a, b = _ids(first), _ids(second)  # one type, so slices compare element-wise at C speed
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case: the prompt extends the previous turn
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on slice equality
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def compare(previous: Sequence[int], prompt: Sequence[int], decode: Decode) -> DriftReport:
    i = common_prefix(previous, prompt)
    before = decode(prompt[max(0, i - _CONTEXT_TOKENS) : i])[-CONTEXT_CHARS:]
    return DriftReport(
        index=i,
        previous_tokens=len(previous),
        prompt_tokens=len(prompt),
        before=before,
        previous_after=decode(previous[i : i + _CONTEXT_TOKENS])[:CONTEXT_CHARS],
        prompt_after=decode(prompt[i : i + _CONTEXT_TOKENS])[:CONTEXT_CHARS],
    )


def __getattr__(name: str) -> Any:
    # The standalone memories are views of the session memory (`prompt.session_memory`), which
    # imports this module: looked up there on first use.
    if name in ("DriftDetector",):
        from agentserve.prompt import session_memory

        return getattr(session_memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
