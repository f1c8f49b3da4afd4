from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from agentserve.frontend.stops import StopMatcher


def run(stops: list[str], chunks: list[str]) -> tuple[str, str | None]:
    matcher = StopMatcher(stops)
    out = []
    for chunk in chunks:
        text, hit = matcher.feed(chunk)
        out.append(text)
        if hit is not None:
            return "".join(out), hit
    return "".join(out) + matcher.flush(), None


def reference(stops: list[str], text: str) -> tuple[str, str | None]:
    """The stop that completes first in the whole text (the longest among those ending together)."""
    found = [(text.find(s) + len(s), text.find(s), s) for s in stops if s and text.find(s) >= 0]
    if not found:
        return text, None
    _, at, stop = min(found)
    return text[:at], stop


def test_basic_cases() -> None:
    assert run(["STOP"], ["alpha ST", "OP gamma"]) == ("alpha ", "STOP")
    assert run(["STOP"], ["no stop here, ST"]) == ("no stop here, ST", None)
    assert run(["ab", "abc"], ["xabc"]) == ("x", "ab")  # "ab" completes first
    assert run(["b", "abc"], ["abc"]) == ("a", "b")  # whatever the chunking
    assert run(["b", "abc"], ["a", "bc"]) == ("a", "b")
    assert run(["bc", "abc"], ["abc"]) == ("", "abc")  # ending together: the longest
    assert not StopMatcher([]) and not StopMatcher([""])


def test_text_is_released_as_soon_as_it_cannot_start_a_stop() -> None:
    matcher = StopMatcher(["<end>"])
    assert matcher.feed("hello <e") == ("hello ", None)  # "<e" could still become "<end>"
    assert matcher.feed("x") == ("<ex", None)
    assert matcher.feed("<en") == ("", None)
    assert matcher.feed("d>") == ("", "<end>")
    assert matcher.feed("more") == ("", "<end>")  # after a match nothing more comes out


alphabet = st.text(alphabet="ab<", max_size=30)


@given(
    stops=st.lists(st.text(alphabet="ab<", min_size=1, max_size=3), max_size=3),
    text=alphabet,
    cuts=st.lists(st.integers(0, 30), max_size=6),
)
def test_any_chunking_gives_the_reference_answer(stops: list[str], text: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert run(stops, chunks) == reference(stops, text)
